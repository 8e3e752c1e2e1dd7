"""Every shipped config builds and passes the run's static validation."""

import importlib
import pathlib

import pytest

from configs import base
from papa_jax import run

NAMES = sorted(p.stem for p in (pathlib.Path(__file__).parents[1] / "configs").glob("*.py")
               if p.stem not in ("__init__", "base"))


def test_the_paper_grid_is_shipped():
  """One config per (model, task) of the paper, each from base.papa_config."""
  tasks = ("cola", "mnli", "mrpc", "ner", "qnli", "sst2")
  for model in base.MODELS:
    for task in tasks:
      assert f"{model}_{task}" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_config_builds_and_validates(name):
  c = importlib.import_module(f"configs.{name}").get_config()
  run.validate_config(c)
  model, _, task = name.rpartition("_")
  if model in base.MODELS:  # A paper config: its model, task and length.
    assert (c.model.name, c.data.task) == (base.MODELS[model], task)
    assert c.data.max_length == base.MAX_LENGTH.get(task, 128)
  if "_effective_" in name:
    assert c.stage == "effective" and not c.data.papa_layout
