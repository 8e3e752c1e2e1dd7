"""Every registered stage: its record, the data it checks, what it binds, what it writes."""

import glob
import json
import os
import shutil

import numpy as np
import pytest

from papa_jax import convert, reader, registry, run
from papa_jax.config import schema as config_schema
from papa_jax.measures import rank_agreement
from papa_jax.report import heads as report_heads
from papa_jax.report import markdown as report_markdown
from papa_jax import suite
from papa_jax.workdir import rules as workdir
from papa_jax.explorer import collect
from papa_jax.data import DataError
from papa_jax.errors import ConfigError
from papa_jax.stage import VIEWS
from tests import docs_test
from tests.testing import require_shared, tiny_config

STAGES = {s.name: s for s in registry.STAGES}
# What each stage's plan reads when the analysis split is `train`: only the PAPA
# stages read the evaluation split (dev.tsv). Written out here, not derived, so a
# new stage must be added by hand.
READS_DEV = {"means": False, "optimal": True, "sort": True, "orderings": True, "probe": True,
             "effective": False, "finetune": False, "linguistic": False, "ablation": False,
             "knockout": False, "patching": False, "mixing": False}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(STAGES))
def test_registry_record_is_consistent(name):
  s = STAGES[name]
  assert set(s.inputs) <= set(VIEWS) and s.inputs, s.inputs
  assert set(s.groups) <= set(config_schema.RESULT_GROUPS) and {"model", "data"} <= set(s.groups)
  assert all(n in STAGES for n in s.needs)
  plan = [p.name for p in registry.plan(name)]
  assert plan[-1] == name and set(s.needs) <= set(plan[:-1])
  for p in s.writes:  # A stage writes into its folder (the probe stage also results.json,
    # the optimal constants' stage its means file beside the other constants').
    assert p.startswith(name + "/") or (name, p) in (
        ("probe", "results.json"), ("optimal", "means/means_optimal.npz")), p
  assert all(registry.finished_outputs()[p] == s.groups for p in s.writes)
  assert name in registry.names() and name in registry.output_dirs()


@pytest.mark.unit
def test_registry_all_is_the_papa_pipeline_and_names_are_unique():
  assert [s.name for s in registry.plan("all")] == ["means", "optimal", "sort", "orderings",
                                                     "probe"]
  assert len(registry.STAGES) == len(STAGES) == len(READS_DEV)


class _PastTheFileChecks(Exception):
  pass


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(STAGES))
def test_registry_stage_checks_its_data_before_anything_is_written(name, tmp_path, monkeypatch):
  """Without dev.tsv, exactly the stages that read the evaluation split stop, naming it."""
  data = tmp_path / "data"
  data.mkdir()
  shutil.copy(require_shared("data", "sst2", "train.tsv"), data / "train.tsv")
  c = tiny_config(tmp_path, stage=name, **{"data.data_dir": str(data), "effective.split": "train",
                                           "finetune.other_model": "x"})

  def stop(*args, **kwargs):
    raise _PastTheFileChecks()
  monkeypatch.setattr(convert, "load_pretrained", stop)  # The model loads after the checks.
  wd = tmp_path / "wd"
  with pytest.raises(DataError if READS_DEV[name] else _PastTheFileChecks,
                     match="dev.tsv" if READS_DEV[name] else None):
    run.run(c, str(wd))
  assert not (wd / "config.json").exists()


def _changed(c, group: str):
  """`c` with the first field of `group` changed."""
  key = next(k for k in config_schema.result_config(c, (group,)))
  node = c
  *parents, leaf = key.split(".")
  for p in parents:
    node = node[p]
  value = node[leaf]
  node[leaf] = (not value if isinstance(value, bool) else value + 1
                if isinstance(value, (int, float)) else ("x",) if isinstance(value, tuple)
                else value + "x")
  return c, key


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(STAGES))
def test_registry_stage_binds_the_workdir_to_its_groups(name, tmp_path):
  """With only this stage's outputs present, changing a field of one of its groups is
  refused, and changing a field of any other result group is not."""
  s = STAGES[name]
  wd = str(tmp_path)
  bind = lambda c: workdir.bind(c, wd, finished=registry.finished_outputs())
  bind(tiny_config(tmp_path))
  for pattern in s.writes:
    path = os.path.join(wd, pattern.replace("*", "x"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()
  for group in config_schema.RESULT_GROUPS:
    c, key = _changed(tiny_config(tmp_path), group)
    if group in s.groups:
      with pytest.raises(ConfigError, match=rf"different config.*{key}"):
        bind(c)
    else:
      bind(c)  # Not a dependency of this stage: rebinding is fine...
      bind(tiny_config(tmp_path))  # ...and back.


# Every stage at the smallest size (the finished workdirs below, and reruns in them).
SMALL = {"data.max_train_examples": 32, "data.max_eval_examples": 16, "probe.epochs": 1,
         "effective.max_examples": 8, "papa.fractions": (0.0, 0.5, 1.0), "run.batch_size": 8,
         "ablation.kinds": ("uniform",),
         "finetune.other_model": "pkg:sre_embedding_model/model_weights",
         "papa.orderings": ("lambda", "random"), "papa.random_draws": 1,
         "patching.max_pairs": 3}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, minilm):
  """Every stage once, at the smallest size: the PAPA pipeline, then the analyses."""
  del minilm
  pytest.importorskip("sre_embedding_model")
  tmp = tmp_path_factory.mktemp("stages")
  small = SMALL
  wds = {}
  for name in ("all", "effective", "finetune", "ablation", "knockout", "patching", "mixing"):
    wds[name] = str(tmp / "papa")
    run.run(tiny_config(tmp, stage=name, **small), wds[name])
  pos = tiny_config(tmp, stage="linguistic", **small, **{"data.task": "pos"})
  pos.data.data_dir = str(require_shared("data", "conll2003"))
  wds["linguistic"] = str(tmp / "pos")
  run.run(pos, wds["linguistic"])
  wds["optimal"] = str(tmp / "optimal")  # Runs only when papa.variants has it.
  run.run(tiny_config(tmp, stage="optimal", **dict(small, **{"papa.variants": ("raw", "optimal")})),
          wds["optimal"])
  return {n: wds.get(n, wds["all"]) for n in STAGES}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STAGES))
def test_registry_stage_writes_what_marks_it_finished(name, finished):
  for pattern in STAGES[name].writes:
    assert glob.glob(os.path.join(finished[name], pattern)), pattern
  assert not glob.glob(os.path.join(finished[name], name, "*.partial.npz"))


@pytest.mark.slow
def test_registry_stage_outputs_equal_the_code_before_the_registry(finished):
  """These small runs' numbers equal what the code before the stage registry (commit
  e3dae32, `tests/testdata/stages_e3dae32.json`) wrote for the same runs: forward-pass
  statistics to float noise (they were bitwise equal on the machine that made the file),
  trained probes' scores and gates to at most one dev example (another CPU kind may move
  the last bits of a sum, and a probe's training follows them)."""
  want = json.load(open(os.path.join(os.path.dirname(__file__), "testdata",
                                     "stages_e3dae32.json")))
  papa, pos = finished["probe"], finished["linguistic"]
  with np.load(os.path.join(papa, "means", "means_raw.npz")) as z:
    np.testing.assert_allclose(z["avgs"].astype(np.float64).sum((-1, -2)),
                               want["means_raw_head_sums"], rtol=1e-6)
    np.testing.assert_array_equal(z["counts"], want["means_raw_counts"])
  for name, folder in (("effective", papa), ("finetune", papa), ("linguistic", pos)):
    st = json.load(open(os.path.join(folder, name, "stats.json")))
    for key, value in want[name].items():
      np.testing.assert_allclose(np.asarray(st[key], np.float64), value, atol=2e-5,
                                 err_msg=f"{name}/{key}")
  np.testing.assert_allclose(np.load(os.path.join(papa, "sort", "lambdas.npy")),
                             want["lambdas"], atol=1e-3)
  rows = json.load(open(os.path.join(papa, "results.json")))["rows"]
  scores = {f"{r['variant']}_k{r['static_heads']}": r["score"] for r in rows
            if r["ordering"] == "lambda"}  # The random order is new since e3dae32.
  assert scores.keys() == want["probe_scores"].keys()
  for k, v in want["probe_scores"].items():
    assert abs(scores[k] - v) <= 1 / 16 + 1e-9, k  # 16 dev examples.
  abl = json.load(open(os.path.join(papa, "ablation", "stats.json")))
  assert abs(abl["summary"]["baseline"] - want["ablation_baseline"]) <= 1 / 8 + 1e-9
  np.testing.assert_allclose(abl["change_uniform"], want["ablation"]["change_uniform"],
                             atol=1 / 8 + 1e-9)  # 8 analysis examples.


@pytest.mark.slow
def test_registry_mixing_stage_equals_the_code_before_the_registries(finished):
  """The mixing stage's per-head maps and per-layer means equal what the code before the
  per-head record, the method registry and the folders (commit 43c7bc2) wrote for the same run
  (`tests/testdata/stages_43c7bc2_mixing.json`; bitwise equal on the machine that made it)."""
  want = json.load(open(os.path.join(os.path.dirname(__file__), "testdata",
                                     "stages_43c7bc2_mixing.json")))
  st = json.load(open(os.path.join(finished["mixing"], "mixing", "stats.json")))
  assert st["summary"]["examples"] == want["examples"]
  for key in ("norm_mass", "head_share", "attention_self"):
    np.testing.assert_allclose(st[key], want[key], atol=2e-5, err_msg=key)
  assert st["summary"]["layers"].keys() == want["layers"].keys()
  for key, value in want["layers"].items():
    np.testing.assert_allclose(st["summary"]["layers"][key], value, atol=2e-5, err_msg=key)


PER_HEAD_STAGES = sorted(n for n, s in STAGES.items() if f"{n}/stats.json" in s.writes)


@pytest.mark.slow
@pytest.mark.parametrize("name", PER_HEAD_STAGES)
def test_registry_every_per_head_stage_reaches_the_explorer_and_the_report(name, finished):
  """Each stage that writes per-head stats is listed by the explorer's per-head grid and the
  report's per-head section with no code of its own there (both iterate `head_maps`)."""
  wd = reader.read_workdir(finished[name])
  view = collect.heads_view(wd)
  mine = [m for m in view["maps"] if m["stage"] == name]
  # Knockout blocks edges in every head at once; patching's position sites are per layer.
  heads = {"knockout": {1}, "patching": {1, 12}}.get(name, {12})
  assert mine and all(np.shape(m["values"])[0] == 6 and np.shape(m["values"])[1] in heads
                      for m in mine), name
  text = "\n".join(report_markdown.per_head_lines([report_heads.analyse("m", "t", wd.head_maps)]))
  assert all(f"`{m.key}`" in text for m in wd.head_maps if m.stage == name)
  if name == "patching":  # Its per-position records reach the explorer's per-position panel.
    tokens = [m for m in collect.token_maps_view(wd) if m["stage"] == name]
    assert {m["name"] for m in tokens} >= {"exact_residual_in", "atp_residual_in"}
    assert all(len(ex["values"]) == 6 and len(ex["values"][0]) == len(ex["tokens"])
               for m in tokens for ex in m["examples"])


@pytest.mark.slow
def test_registry_the_docs_recipe_reaches_the_explorer_agreement_and_report(finished, tmp_path,
                                                                           monkeypatch):
  """docs/analyses.md's entropy analysis, registered as the docs say (one entry), shows in the
  explorer, in the agreement table against PAPA's gates and in the report of a real run."""
  ns = docs_test.recipe()
  monkeypatch.setattr(registry, "STAGES", registry.STAGES + (ns["STAGE"],))
  monkeypatch.setattr(registry, "BY_NAME", dict(registry.BY_NAME, entropy=ns["STAGE"]))
  wd = str(tmp_path / "papa")
  shutil.copytree(finished["probe"], wd)
  run.run(tiny_config(tmp_path, stage="entropy", **SMALL), wd)
  view = collect.heads_view(reader.read_workdir(wd))
  entropy = next(m for m in view["maps"] if m["key"] == "entropy/entropy")
  assert entropy["label"] == "attention entropy per row" and entropy["unit"] == "nats"
  assert entropy["examples"] == 8 and entropy["split"] == "validation"
  rows = [r for r in view["agreement"] if r["measure"] == "entropy/entropy"]
  assert {r["score"] for r in rows} >= {"sort/lambda", "ablation/change_uniform"}
  gates = np.load(os.path.join(wd, "sort", "lambdas.npy"))
  want = rank_agreement.head_rank_agreement(np.asarray(entropy["values"]), gates)
  got = next(r for r in rows if r["score"] == "sort/lambda")
  assert got["rho"] == pytest.approx(want["rho"])
  paths = suite.report_from_workdirs([wd], str(tmp_path / "report"), n_boot=50)
  text = open(paths["md"], encoding="utf-8").read()
  assert "`entropy/entropy`: attention entropy per row [nats]" in text
  assert "| `entropy/entropy` | `sort/lambda` (higher = more important) |" in text
  assert os.path.isfile(paths["agreement/minilm/sst2"]), sorted(paths)
