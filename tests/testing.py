"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import ml_collections
import pytest

from papa_jax import shared

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def require_shared(*parts: str):
  """The path under $PAPA_SHARED, or skip the test saying what is missing."""
  path = shared.shared_dir().joinpath(*parts)
  if not path.exists():
    pytest.skip(f"{path} not found: set PAPA_SHARED to the shared data folder "
                "(see README, Tests).")
  return path


def optimizer_config(**overrides) -> ml_collections.ConfigDict:
  """A `config.probe`-like block for `train.make_optimizer` (learning rate 1e-3)."""
  return ml_collections.ConfigDict(dict(dict(
      learning_rate=1e-3, adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8, weight_decay=0.0,
      grad_clip_norm=1.0), **overrides))


def override(c: ml_collections.ConfigDict, **overrides) -> ml_collections.ConfigDict:
  """`c` with dotted-path fields replaced: `override(c, **{"probe.epochs": 1})`."""
  for k, v in overrides.items():
    node = c
    *parents, leaf = k.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = v
  return c


def tiny_config(tmp_path, **overrides) -> ml_collections.ConfigDict:
  """The quickstart shrunk to seconds: 48 SST-2 examples at 32 tokens, 2 epochs."""
  from configs import quickstart  # pylint: disable=import-outside-toplevel
  c = quickstart.get_config()
  c.data.data_dir = str(require_shared("data", "sst2"))
  c.data.max_length = 32
  c.data.max_train_examples = 48
  c.data.max_eval_examples = 32
  c.run.batch_size = 16
  c.papa.fractions = (0.0, 0.5, 1.0)
  c.probe.epochs = 2
  c.probe.cache_features = False
  c.probe.encoder_dropout = True
  c.probe.feature_dtype = "float32"
  c.sort.epochs = 1
  c.sort.max_train_examples = -1
  c.run.log_every_steps = 2
  return override(c, **overrides)
