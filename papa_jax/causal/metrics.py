"""Metrics for patching and knockout: a checkpoint's masked-language-model head.

`mlm_head(model)` reads the MLM head of a `*ForMaskedLM` checkpoint (no torch for safetensors)
for the families whose record names its tensors (`Family.mlm_head`: one shape, dense,
activation, LayerNorm, a decoder tied to the word embeddings or its own, a bias; BERT,
RoBERTa, MPNet and DistilBERT).
`logit_difference(head, good, bad)` is then a metric for `pj.patch`, `pj.attribution_patch`
and `pj.knockout`: the head's logit of token `good` minus that of `bad` at one position (or
at each example's [MASK]). `probe_logit_difference` and `probe_loss` do the same with a
finished PAPA workdir's probe (`papa.probe.restore_baseline`).

Each is a `Metric`: its arrays (the head's or probe's weights) are traced data, so the jitted
sweeps compile once for every probe of one shape (one per seed) rather than once per metric.
Any `metric(output, batch)` function works too (`as_metric`: static, compiled per function).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax.convert import checkpoint_io, resolve_model_dir
from papa_jax.convert.families import BY_MODEL_TYPE, FAMILIES
from papa_jax.errors import ModelFileError
from papa_jax.probing import probes

Array = jax.Array
ACTIVATIONS = {"gelu": lambda x: jax.nn.gelu(x, approximate=False),
               "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
               "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
               "relu": jax.nn.relu}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Metric:
  """`metric(output, batch) -> [B]`, one number per example of a run, as
  `fn(state, output, batch, *static)`: `state` (a pytree of arrays) is traced where a jitted
  function takes the metric as an argument, `fn` and `static` (hashable) pick the program."""

  state: Any
  fn: Callable = dataclasses.field(metadata=dict(static=True))
  static: tuple = dataclasses.field(default=(), metadata=dict(static=True))

  def __call__(self, out, batch) -> Array:
    return self.fn(self.state, out, batch, *self.static)


def _plain(state, out, batch, fn):
  del state
  return fn(out, batch)


def as_metric(metric: Metric | Callable) -> Metric:
  """`metric` as a `Metric` (a plain function is all static: one program per function)."""
  return metric if isinstance(metric, Metric) else Metric(None, _plain, (metric,))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MLMHead:
  """A masked-language-model head: `decoder @ LayerNorm(act(dense(h))) + bias`."""

  dense_w: Array  # [D, D] (in, out)
  dense_b: Array
  scale: Array
  shift: Array
  decoder: Array  # [V, D]
  bias: Array  # [V]
  activation: str = dataclasses.field(metadata=dict(static=True))
  eps: float = dataclasses.field(metadata=dict(static=True))

  def transform(self, hidden: Array) -> Array:
    t = ACTIVATIONS[self.activation](hidden @ self.dense_w.astype(hidden.dtype)
                                     + self.dense_b.astype(hidden.dtype))
    mu, var = t.mean(-1, keepdims=True), t.var(-1, keepdims=True)
    return (t - mu) / jnp.sqrt(var + self.eps) * self.scale.astype(t.dtype) + self.shift.astype(
        t.dtype)

  def logits(self, hidden: Array, tokens=None) -> Array:
    """`[..., V]` logits of `hidden` `[..., D]` (or only those of `tokens`)."""
    dec, bias = self.decoder, self.bias
    if tokens is not None:
      dec, bias = dec[jnp.asarray(tokens)], bias[jnp.asarray(tokens)]
    t = self.transform(hidden)
    return t @ dec.astype(t.dtype).T + bias.astype(t.dtype)


def _tensor(state, *names: str) -> np.ndarray | None:
  for name in names:
    if name in state:
      return np.asarray(state[name], np.float32)
  return None


def mlm_head(model) -> MLMHead:
  """The MLM head of `model` (a `Pretrained`, a folder or a packaged model name); raises
  naming the folder and family when its checkpoint has none or its family's head is not
  read here."""
  model_dir = model.model_dir if hasattr(model, "model_dir") else resolve_model_dir(model)
  with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
    cfg = json.load(f)
  kind = cfg.get("model_type", "")
  family = BY_MODEL_TYPE.get(kind)
  if family is None or family.mlm_head is None:
    readable = sorted(t for f in FAMILIES if f.mlm_head for t in f.model_types)
    raise ModelFileError(f"{model_dir}: MLM heads are read for {readable}; this is {kind!r}.")
  dense, norm, decoder, bias = family.mlm_head
  tied = f"{family.base_prefix}.embeddings.word_embeddings.weight"
  state = checkpoint_io.read_state_dict(model_dir)
  w = _tensor(state, f"{dense}.weight")
  if w is None:
    raise ModelFileError(f"{model_dir} has no MLM head ({dense}.weight is missing: a base-model "
                         f"checkpoint; heads load from *ForMaskedLM ones).")
  dec = _tensor(state, f"{decoder}.weight", tied)
  b = _tensor(state, bias, f"{decoder}.bias")
  if dec is None or b is None:
    raise ModelFileError(f"{model_dir}: the MLM head's decoder or bias is missing "
                         f"({decoder}.weight / {tied}, {bias}).")
  act = cfg.get("hidden_act", cfg.get("activation", "gelu"))
  if act not in ACTIVATIONS:
    raise ModelFileError(f"{model_dir}: activation {act!r}; the MLM head supports "
                         f"{sorted(ACTIVATIONS)}.")
  eps = cfg.get("layer_norm_eps", 1e-12)
  return MLMHead(jnp.asarray(w.T), jnp.asarray(_tensor(state, f"{dense}.bias")),
                 jnp.asarray(_tensor(state, f"{norm}.weight", f"{norm}.gamma")),
                 jnp.asarray(_tensor(state, f"{norm}.bias", f"{norm}.beta")),
                 jnp.asarray(dec), jnp.asarray(b), act, float(eps))


def logit_difference(head: MLMHead, good: int, bad: int, position: int | None = 0,
                     mask_id: int | None = None) -> Metric:
  """`metric(output, batch) -> [B]`: the head's logit of `good` minus `bad` at `position`
  (0: [CLS]), or, with `position=None`, at each example's first `mask_id` token (NaN for an
  example without one)."""
  if position is None and mask_id is None:
    # caller's argument
    raise ValueError("logit_difference: give a position, or position=None and the mask_id.")
  return Metric(dict(head=head, tokens=jnp.array([good, bad])), _logit_difference,
                (position, mask_id))


def _logit_difference(state, out, batch, position, mask_id) -> Array:
  h = out.hidden_states[-1]
  found = jnp.ones(h.shape[0], bool)
  if position is None:
    is_mask = jnp.asarray(batch["input_ids"]) == mask_id
    found = is_mask.any(1)
    at = jnp.argmax(is_mask, axis=1)
    h = jnp.take_along_axis(h, at[:, None, None], axis=1)[:, 0]
  else:
    h = h[:, position]
  lg = state["head"].logits(h, state["tokens"])
  return jnp.where(found, lg[:, 0] - lg[:, 1], jnp.nan)


def probe_logits(module, params, out, batch) -> Array:
  """A probe's outputs on an encoder output (all hidden states, as the probe was trained)."""
  feats = jnp.stack(out.hidden_states, axis=1)  # [B, K, L, D], as the probe was trained on.
  return module.apply({"params": params}, feats, batch["attention_mask"], deterministic=True)


def probe_logit_difference(module, params, good: int, bad: int) -> Metric:
  """`metric(output, batch) -> [B]`: a sentence probe's logit of class `good` minus `bad`
  (`papa.probe.restore_baseline` gives a finished workdir's probe)."""
  return Metric(params, _probe_logit_difference, (module, good, bad))


def _probe_logit_difference(params, out, batch, module, good, bad) -> Array:
  logits = probe_logits(module, params, out, batch)
  return logits[:, good] - logits[:, bad]


def probe_loss(module, params) -> Metric:
  """`metric(output, batch) -> [B]`: the probe's loss per example on `batch["labels"]` (the
  task's loss: cross-entropy, or squared error for regression; tagging: summed over the
  scored tokens)."""
  return Metric(params, _probe_loss, (module,))


def _probe_loss(params, out, batch, module) -> Array:
  return probes.example_losses(module.kind, probe_logits(module, params, out, batch),
                               batch["labels"])


def probe_log_prob(module, params) -> Metric:
  """`metric(output, batch) -> [B]`: a classification probe's log-probability of class
  `batch["target_class"]` (e.g. the class it gives the clean sentence)."""
  return Metric(params, _probe_log_prob, (module,))


def _probe_log_prob(params, out, batch, module) -> Array:
  logp = jax.nn.log_softmax(probe_logits(module, params, out, batch), -1)
  return jnp.take_along_axis(logp, jnp.asarray(batch["target_class"])[:, None], 1)[:, 0]
