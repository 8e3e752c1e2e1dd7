"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib

import ml_collections
import pytest

from papa_jax import shared
from papa_jax.data import preprocess, readers, tasks
from tests import tiers

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def require_model(key: str) -> str:
  """The folder of fetchable ladder model `key` ($PAPA_MODELS), or skip saying how to get it."""
  from papa_jax.convert import fetch  # pylint: disable=import-outside-toplevel
  tiers.refuse_in_unit(f"uses the real checkpoint {key!r}")
  try:
    return fetch.model_dir(key)
  except FileNotFoundError as e:
    pytest.skip(str(e))


def require_shared(*parts: str):
  """The path under $PAPA_SHARED, or skip the test saying what is missing."""
  path = shared.shared_dir().joinpath(*parts)
  if not path.exists():
    pytest.skip(f"{path} not found: set PAPA_SHARED to the shared data folder "
                "(see README, Tests).")
  return path


def analysis_means(analysis, model, arrays, *, params=None, devices: int = 1,
                   batch_size: int | None = None) -> dict:
  """A per-head analysis's finalized means over `arrays` (an `Encoded` split's arrays
  plus the analysis's inputs), through the runner on a mesh of `devices` CPUs."""
  from papa_jax import parallel  # pylint: disable=import-outside-toplevel
  from papa_jax import runner  # pylint: disable=import-outside-toplevel
  n = len(arrays["input_ids"])
  totals = runner.sum_pass(analysis.stats, analysis.capture, model.config,
                           params or (model.params,), arrays, parallel.make_mesh(devices),
                           batch_size=batch_size or -(-n // devices) * devices)
  return analysis.finalize(totals)


@contextlib.contextmanager
def sigterm_during_batch(monkeypatch, n: int):
  """SIGTERM (a preemption request) while the runner adds its n-th batch, once; yields
  the list the runner's added batches are counted in (clear it to count a rerun's)."""
  from papa_jax import preemption  # pylint: disable=import-outside-toplevel
  from papa_jax import runner  # pylint: disable=import-outside-toplevel
  added, real, armed = [], runner._add, [True]  # pylint: disable=protected-access

  def add(totals, sums):
    real(totals, sums)
    added.append(None)
    if armed[0] and len(added) == n:
      armed[0] = False
      preemption._requested.set()  # pylint: disable=protected-access
  monkeypatch.setattr(runner, "_add", add)
  try:
    yield added
  finally:
    preemption.reset()
    monkeypatch.setattr(runner, "_add", real)


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


# Float64 numpy references of one BERT layer (the oracles of the override tests).


def np_layer_norm(x, p, eps):
  import numpy as np  # pylint: disable=import-outside-toplevel
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def np_softmax_probs(x, mask, a, heads, head_dim):
  """Dynamic BERT attention of `heads` in float64: `[B, len(heads), L, L]`."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  q = np.einsum("bld,dhk->bhlk", x, a["query"]["kernel"]) + a["query"]["bias"][None, :, None]
  k = np.einsum("bld,dhk->bhlk", x, a["key"]["kernel"]) + a["key"]["bias"][None, :, None]
  s = np.einsum("bhqd,bhkd->bhqk", q[:, heads], k[:, heads]) / np.sqrt(head_dim)
  s = np.where(mask[:, None, None, :] > 0, s, -np.inf)
  e = np.exp(s - s.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_bert_layer(x, probs, p, eps):
  """The rest of a BERT layer (exact gelu) given its probabilities `[B, H, L, L]`."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from scipy.special import erf  # pylint: disable=import-outside-toplevel
  a = p["attention"]
  v = np.einsum("bld,dhk->bhlk", x, a["value"]["kernel"]) + a["value"]["bias"][None, :, None]
  ctx = np.einsum("bhqk,bhkd->bhqd", probs, v)
  att = np.einsum("bhqd,hde->bqe", ctx, a["out_kernel"]) + a["out_bias"]
  h = np_layer_norm(x + att, p["attention_norm"], eps)
  f = h @ p["intermediate"]["kernel"] + p["intermediate"]["bias"]
  f = (0.5 * f * (1 + erf(f / np.sqrt(2)))) @ p["output"]["kernel"] + p["output"]["bias"]
  return np_layer_norm(h + f, p["output_norm"], eps)


def sst2_dev_sample(tokenizer, sst2_dir, longest: int, first: int, max_length: int = 64):
  """SST-2 dev: its `longest` longest sentences, then its `first` first ones, encoded
  without the PAPA layout (long inputs are where effective attention differs)."""
  task = tasks.get_task("sst2")
  dev = list(readers.read_split(task, str(sst2_dir), "validation"))
  recs = sorted(dev, key=lambda r: -len(r["text_a"]))[:longest] + dev[:first]
  return preprocess.encode(task, recs, tokenizer, max_length, papa_layout=False)
