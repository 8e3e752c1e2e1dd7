"""Shared defaults and the paper's grid of models and tasks.

The defaults and the rules about which fields change results live with the
schema in `papa_jax/config_schema.py`; this module adds the experiment
presets. Configs take big_vision-style arguments, e.g.
`--config=configs/papa.py:model=roberta_large,task=mnli`.
"""

from __future__ import annotations

import ml_collections

from papa_jax.config_schema import get_config
from papa_jax.suite import MODEL_KEYS

__all__ = ["MODELS", "TASKS", "MAX_LENGTH", "get_config", "parse_arg", "papa_config",
           "effective_config", "model_name"]

# The paper's models (config key -> hub id); `minilm` and `minilm_sre` are the
# packaged real checkpoints (papa_jax.suite.MODEL_KEYS holds them all).
PAPER_MODELS = ("bert", "bert_large", "roberta", "roberta_large", "deberta", "deberta_large")
MODELS = {k: MODEL_KEYS[k] for k in PAPER_MODELS}
EXTRA_MODELS = {k: v for k, v in MODEL_KEYS.items() if k not in MODELS}
TASKS = ("cola", "sst2", "mrpc", "qnli", "mnli", "ner")
# Single-sentence tasks fit in 64 tokens (as the paper's CoLA command);
# pair and tagging tasks get 128, since the layout halves each segment's room.
MAX_LENGTH = {"cola": 64, "sst2": 64}


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """`"a=1,b=x"` -> ConfigDict over `defaults`, each value cast to its default's type."""
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    if key not in defaults:
      raise ValueError(f"Unknown config argument {key!r}; known: {sorted(defaults)}.")
    kind = type(defaults[key])
    out[key] = (value.lower() in ("1", "true", "yes", "")) if kind is bool else kind(value)
  return out


def model_name(key: str) -> str:
  """A key of MODELS (or 'minilm'), else the value itself (a hub id or a path)."""
  return MODEL_KEYS.get(key, key)


def papa_config(model: str, task: str) -> ml_collections.ConfigDict:
  """The paper's run of `model` (a key of MODELS) on `task`."""
  c = get_config()
  c.model.name = model_name(model)
  c.data.task = task
  c.data.max_length = MAX_LENGTH.get(task, 128)
  return c


def effective_config(model: str, task: str) -> ml_collections.ConfigDict:
  """Raw vs effective attention (Sun & Marasovic) of `model` on `task`'s dev split.

  Standard layout up to 128 tokens, so that sentences longer than the head
  dimension keep all their tokens (the reference setting).
  """
  c = get_config()
  c.stage = "effective"
  c.model.name = model_name(model)
  c.data.task = task
  c.data.max_length = 128
  c.data.papa_layout = False
  c.effective.split = "validation"
  c.run.batch_size = 16
  return c
