"""Every shipped config builds and validates; the parametrised grid; result-field rules."""

import importlib
import pathlib

import pytest

from configs import base
from papa_jax.config import schema as config_schema

pytestmark = pytest.mark.unit

FILES = sorted(p.stem for p in (pathlib.Path(__file__).parents[1] / "configs").glob("*.py")
               if p.stem not in ("__init__", "base"))


@pytest.mark.parametrize("name", FILES)
def test_config_file_builds_and_validates(name):
  c = importlib.import_module(f"configs.{name}").get_config()
  config_schema.validate(c)


@pytest.mark.parametrize("model", sorted(base.MODELS))
@pytest.mark.parametrize("task", base.TASKS)
def test_config_papa_grid_cell(model, task):
  c = importlib.import_module("configs.papa").get_config(f"model={model},task={task}")
  config_schema.validate(c)
  assert (c.model.name, c.data.task) == (base.MODELS[model], task)
  # The task table's rule: one sentence 64 (PAPA layout), pairs 128, tagging 64.
  assert c.data.max_length == {"mrpc": 128, "qnli": 128, "mnli": 128}.get(task, 64)


def test_config_documented_alias_equals_the_grid_cell():
  alias = importlib.import_module("configs.bert_sst2").get_config()
  cell = importlib.import_module("configs.papa").get_config("model=bert,task=sst2")
  assert alias.to_dict() == cell.to_dict()


def test_invalid_config_argument_is_named():
  with pytest.raises(ValueError, match="Unknown config argument 'modle'"):
    importlib.import_module("configs.papa").get_config("modle=bert")


def test_config_effective_is_an_effective_stage():
  c = importlib.import_module("configs.effective").get_config("model=minilm,task=sst2")
  assert c.stage == "effective" and not c.data.papa_layout
  assert c.model.name == base.EXTRA_MODELS["minilm"]


def test_config_result_fields_are_structural():
  c = base.get_config()
  assert not config_schema.unclassified_fields(c)
  fields = config_schema.result_config(c)
  assert "probe.learning_rate" in fields and "data.max_length" in fields
  for volatile in ("stage", "overwrite", "run.batch_size", "papa.fractions", "papa.seeds",
                   "run.distributed.enabled", "figures.layer", "figures.example_index"):
    assert volatile not in fields
  c.unlock()
  c.newgroup = dict(x=1)  # A group the schema does not classify is refused.
  with pytest.raises(config_schema.ConfigError, match="newgroup"):
    config_schema.validate(c)


def test_config_variants_accept_the_comma_form():
  c = base.get_config()
  c.papa.variants = ("effective,raw",)
  assert config_schema.variants(c) == ("effective", "raw")
  c.papa.variants = ("effective",)
  assert config_schema.variants(c) == ("raw", "effective")


def test_config_of_an_earlier_version_reads_with_moved_fields():
  old = base.get_config().to_dict()
  old["effective"].update(other_model="x", ablations=["uniform"], figure_layer=2)
  for moved in ("finetune", "ablation", "figures"):
    del old[moved]
  new = config_schema.migrate(old)
  assert new["finetune"]["other_model"] == "x" and new["ablation"]["kinds"] == ["uniform"]
  assert new["figures"]["layer"] == 2 and "other_model" not in new["effective"]


def test_config_before_the_optimal_group_reads_as_the_fit_it_ran():
  """Before the `optimal` group, the fit used the sorting run's rate and epochs and held out
  20%: an old workdir's optimal results stay valid under those values, and only those."""
  old = base.get_config().to_dict()
  del old["optimal"]
  old["sort"]["gate_learning_rate"] = 0.05
  new = config_schema.migrate(old)
  assert new["optimal"] == dict(learning_rate=0.05, epochs=-1, probe_epochs=-1, held_out=0.2,
                                objective="task")
  now = base.get_config().to_dict()
  assert config_schema.migrate(now)["optimal"] == now["optimal"]  # Newer configs: as saved.


def test_config_name_lists_take_the_comma_form_on_the_command_line():
  argv = ["--config.papa.orderings=lambda,random", "--config.papa.variants=raw",
          "--config.papa.seeds=(1,2)", "--config.ablation.kinds=('uniform',)"]
  assert config_schema.quote_name_lists(argv) == [
      "--config.papa.orderings=('lambda','random',)", "--config.papa.variants=('raw',)",
      "--config.papa.seeds=(1,2)", "--config.ablation.kinds=('uniform',)"]


def test_changed_fields_are_what_differs_from_the_defaults():
  """The launcher logs these, not the whole config (128 lines for the quickstart)."""
  from configs import quickstart  # pylint: disable=import-outside-toplevel
  assert config_schema.changed_fields(config_schema.get_config()) == {}
  c = quickstart.get_config()
  c.probe.epochs = 3
  changed = config_schema.changed_fields(c)
  assert changed["probe.epochs"] == 3 and changed["sort.epochs"] == 2
  assert "probe.learning_rate" not in changed and len(changed) == 10
