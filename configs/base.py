"""Shared defaults, presets and the paper's grid of models and tasks.

The defaults and the rules about which fields change results live with the
schema in `papa_jax/config/schema.py`, input lengths with the task table
(`Task.default_max_length`); this module adds the experiment presets.
Configs take big_vision-style arguments, e.g.
`--config=configs/papa.py:model=roberta_large,task=mnli`.
"""

from __future__ import annotations

import ml_collections

from papa_jax.config.schema import get_config
from papa_jax.convert import MODEL_KEYS
from papa_jax.data.tasks import get_task

__all__ = ["MODELS", "TASKS", "cpu_preset", "effective_config", "get_config", "max_length",
           "model_name", "papa_config", "parse_arg"]

# The paper's models (config key -> hub id); `minilm` and `minilm_sre` are the
# packaged real checkpoints (papa_jax.convert.MODEL_KEYS holds them all).
PAPER_MODELS = ("bert", "bert_large", "roberta", "roberta_large", "deberta", "deberta_large")
MODELS = {k: MODEL_KEYS[k] for k in PAPER_MODELS}
EXTRA_MODELS = {k: v for k, v in MODEL_KEYS.items() if k not in MODELS}
TASKS = ("cola", "sst2", "mrpc", "qnli", "mnli", "ner")


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
  """A key of MODEL_KEYS ('bert', 'minilm', ...), else the value itself (a hub id or a path)."""
  return MODEL_KEYS.get(key, key)


def max_length(task: str, papa_layout: bool = True) -> int:
  """A built-in task's input length (`Task.default_max_length`)."""
  return get_task(task).default_max_length(papa_layout)


def papa_config(model: str, task: str) -> ml_collections.ConfigDict:
  """The paper's run of `model` (a key of MODELS) on `task`."""
  c = get_config()
  c.model.name = model_name(model)
  c.data.task = task
  c.data.max_length = max_length(task)
  return c


def cpu_preset(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """What makes a PAPA run fit a 2-core CPU (the quickstart's and the suite's), each on purpose:

  a deterministic encoder with cached bfloat16 features (each probe costs one
  encoder pass instead of fifteen), and a 2-epoch sorting run with gate
  learning rate 0.05 (at 2e-5 the gates would barely move in so few steps).
  """
  c.probe.encoder_dropout = False
  c.probe.cache_features = True
  c.probe.feature_dtype = "bfloat16"
  c.sort.epochs = 2
  c.sort.gate_learning_rate = 0.05
  return c


def effective_config(model: str, task: str) -> ml_collections.ConfigDict:
  """Raw vs effective attention (Sun & Marasovic) of `model` on `task`'s dev split.

  Standard layout (no PAPA layout), so that sentences longer than the head
  dimension keep all their tokens (the reference setting).
  """
  c = get_config()
  c.stage = "effective"
  c.model.name = model_name(model)
  c.data.task = task
  c.data.papa_layout = False
  c.data.max_length = max_length(task, papa_layout=False)
  c.effective.split = "validation"
  c.run.batch_size = 16
  return c
