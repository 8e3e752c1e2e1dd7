"""Interventions at named sites of a layer's attention, as pytrees (penzai's style).

Each class is a registered dataclass: array fields are traced (the ablated
head or zeroed token of each example, replacement matrices), so a jitted
function run with another head set or token never recompiles; the class and
its static fields decide what compiles. Pass them to the encoder in an
`AttentionOverride`:

  ov = AttentionOverride.intervene(HeadAblation("uniform", layers, heads))
  out = model.apply(ids, mask, override=ov)

`attend` (`papa_jax/attention.py`) calls each at its `site` ("values",
"probs" or "context"; see `attention.Intervention` for the shapes). Per-example
targets use -1 for "none", so one batch can hold rows that intervene on
different layers, heads or tokens, and rows that do not intervene at all.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax.measures import effective
from papa_jax.attention import SITE_AXES, SITES, mask_and_normalize, uniform_probs

Array = jax.Array
ABLATIONS = ("uniform", "constant", "effective")


class ProbsFn(Protocol):
  """A user transformation of one layer's attention probabilities (`Transform`).

  Called as `fn(probs, mask, layer=l, values=v)` with probs `[B, H, L, L]`,
  mask `[B, L]` (bool), the layer index (a Python int) and the layer's value
  vectors `[B, H, L, head_dim]` (bias included). Returns probs of the same
  shape, which then multiply the values.
  """

  def __call__(self, probs: Array, mask: Array, *, layer: int, values: Array) -> Array:
    ...


def _rows(x):
  """Python lists of per-example targets as an int32 array (arrays and tracers pass)."""
  return np.asarray(x, np.int32) if isinstance(x, (list, tuple)) else x


def _check_rows(name: str, arr, batch: int | None) -> None:
  shape = tuple(np.shape(arr))
  if len(shape) != 1 or (batch is not None and shape[0] != batch):
    # caller's argument
    raise ValueError(f"{name} has shape {shape}; expected [batch] = ({batch},).")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Transform:
  """A user function of every layer's probabilities (static: hashed by identity)."""

  fn: ProbsFn = dataclasses.field(metadata=dict(static=True))
  site: ClassVar[str] = "probs"

  def __call__(self, x: Array, *, layer: int, mask: Array, values: Array | None) -> Array:
    return self.fn(x, mask, layer=layer, values=jnp.swapaxes(values, 1, 2))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EffectiveAttention:
  """Every head's probabilities replaced by its effective attention (Brunner et al.).

  `A_eff V = A V` by construction, so the outputs do not change: a check of
  the effective-attention code on a real model, and a base for transforms.
  """

  rtol: float | None = dataclasses.field(default=None, metadata=dict(static=True))
  site: ClassVar[str] = "probs"

  def __call__(self, x: Array, *, layer: int, mask: Array, values: Array | None) -> Array:
    del layer
    key_mask = jnp.broadcast_to(mask[:, None, :], x.shape[:-1])
    return effective.effective_attention(x, jnp.swapaxes(values, 1, 2), key_mask,
                                         rtol=self.rtol)[0]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HeadAblation:
  """Example b's head `heads[b]` of layer `layers[b]` replaced (-1: none).

  kinds: "uniform" (uniform over the example's real tokens), "constant" (the
  head's constant matrix `constants[layer, head]`, masked and renormalised as
  PAPA does), "effective" (its effective attention: output-preserving).

  Attributes:
    kind: one of `ABLATIONS` (static).
    layers, heads: `[batch]` int (traced).
    constants: `[layers, heads, L, L]` for "constant", else None (traced).
  """

  layers: Array
  heads: Array
  constants: Array | None = None
  kind: str = dataclasses.field(default="uniform", metadata=dict(static=True))
  site: ClassVar[str] = "probs"

  def __post_init__(self):
    if self.kind not in ABLATIONS:
      # caller's argument
      raise ValueError(f"ablation kind {self.kind!r}; choose one of {ABLATIONS}.")
    object.__setattr__(self, "layers", _rows(self.layers))
    object.__setattr__(self, "heads", _rows(self.heads))

  def validate(self, *, num_layers: int, num_heads: int, seq_len: int,
               batch: int | None) -> None:
    _check_rows("HeadAblation.layers", self.layers, batch)
    _check_rows("HeadAblation.heads", self.heads, batch)
    if self.kind == "constant":
      want = (num_layers, num_heads, seq_len, seq_len)
      if self.constants is None or tuple(self.constants.shape) != want:
        got = None if self.constants is None else tuple(self.constants.shape)
        raise ValueError(f"HeadAblation('constant') needs constants of shape [layers, heads, "
                         f"L, L] = {want}; got {got}.")  # caller's argument

  def __call__(self, x: Array, *, layer: int, mask: Array, values: Array | None) -> Array:
    heads = jnp.where(jnp.asarray(self.layers) == layer, jnp.asarray(self.heads, jnp.int32), -1)
    sel = jnp.maximum(heads, 0)
    own = jnp.take_along_axis(x, sel[:, None, None, None], axis=1)[:, 0]  # [B, L, L]
    if self.kind == "uniform":
      new = uniform_probs(mask, own[:, None].shape, own.dtype)[:, 0]
    elif self.kind == "constant":
      new = mask_and_normalize(self.constants[layer][sel][:, None], mask)[:, 0]
    else:
      v = jnp.take_along_axis(values, sel[:, None, None, None], axis=2)[:, :, 0]  # [B, L, d]
      new = effective.effective_attention(own, v, mask.astype(bool))[0].astype(own.dtype)
    hit = (jnp.arange(x.shape[1])[None] == heads[:, None])[:, :, None, None]
    return jnp.where(hit, new[:, None], x)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ValueZeroing:
  """Example b's value vectors of token `tokens[b]` zeroed in every head of layer
  `layers[b]` (-1: none), as in value zeroing (Mohebbi et al. 2023).

  Attributes:
    layers, tokens: `[batch]` int (traced).
  """

  layers: Array
  tokens: Array
  site: ClassVar[str] = "values"

  def __post_init__(self):
    object.__setattr__(self, "layers", _rows(self.layers))
    object.__setattr__(self, "tokens", _rows(self.tokens))

  def validate(self, *, num_layers: int, num_heads: int, seq_len: int,
               batch: int | None) -> None:
    del num_layers, num_heads, seq_len
    _check_rows("ValueZeroing.layers", self.layers, batch)
    _check_rows("ValueZeroing.tokens", self.tokens, batch)

  def __call__(self, x: Array, *, layer: int, mask: Array, values: Array | None) -> Array:
    del mask, values
    token = jnp.where(jnp.asarray(self.layers) == layer, jnp.asarray(self.tokens), -1)
    hit = jnp.arange(x.shape[1])[None] == token[:, None]  # [B, L]
    return jnp.where(hit[:, :, None, None], jnp.zeros((), x.dtype), x)



@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HeadMask:
  """Each head's output scaled by `scale[layer, head]` (Michel et al. 2019's head mask).

  0 removes a head's contribution, 1 keeps it; the gradient with respect to
  `scale` at 1 is Michel et al.'s head importance (per example with a
  `[batch, layers, heads]` scale).

  Attributes:
    scale: `[layers, heads]`, or `[batch, layers, heads]` (traced).
  """

  scale: Array
  site: ClassVar[str] = "context"

  def validate(self, *, num_layers: int, num_heads: int, seq_len: int,
               batch: int | None) -> None:
    del seq_len
    shape = tuple(np.shape(self.scale))
    if shape[-2:] != (num_layers, num_heads) or len(shape) not in (2, 3) or (
        len(shape) == 3 and batch is not None and shape[0] != batch):
      raise ValueError(f"HeadMask.scale has shape {shape}; expected [layers, heads] = "
                       f"{(num_layers, num_heads)} or [batch, layers, heads].")  # caller's argument

  def __call__(self, x: Array, *, layer: int, mask: Array, values: Array | None) -> Array:
    del mask, values
    scale = jnp.asarray(self.scale)
    per_head = scale[layer][None] if scale.ndim == 2 else scale[:, layer]  # [B or 1, H]
    return x * per_head[:, None, :, None].astype(x.dtype)


def _check_site(name: str, site: str) -> None:
  if site not in SITES:
    raise ValueError(f"{name} site {site!r}; choose one of {SITES}.")  # caller's argument


def _check_source(name: str, source, batch: int | None) -> None:
  shape = tuple(np.shape(source))
  if batch is not None and (not shape or shape[0] != batch):
    # caller's argument
    raise ValueError(f"{name} has shape {shape}; expected [batch, ...] with batch {batch}.")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Patch:
  """Activation patching: at `site` of layer `layers[b]` (-1: none), example b's activation
  replaced by `source[b]` at position `positions[b]` (-1: every position) of head `heads[b]`
  (-1: every head; sites with heads only: "values", "probs", "context").

  `source` holds, per example, the site's activation of that example's layer in another run
  (clean into corrupt, or the reverse), or an ablation's value: zeros, a mean over examples,
  another example's (`papa_jax/causal/patching.py` builds them). Targets are traced, so a
  sweep over layers, positions and heads never recompiles.

  Attributes:
    source: `[batch, ...]`, the site's shape for one layer (`attention.Intervention`).
    layers, positions, heads: `[batch]` int (traced).
    site: one of `attention.SITES` (static).
  """

  source: Array
  layers: Array
  positions: Array
  heads: Array
  site: str = dataclasses.field(default="residual_out", metadata=dict(static=True))

  def __post_init__(self):
    _check_site("Patch", self.site)
    for name in ("layers", "positions", "heads"):
      object.__setattr__(self, name, _rows(getattr(self, name)))

  def validate(self, *, num_layers: int, num_heads: int, seq_len: int,
               batch: int | None) -> None:
    del num_layers, num_heads, seq_len
    for name in ("layers", "positions", "heads"):
      _check_rows(f"Patch.{name}", getattr(self, name), batch)
    _check_source("Patch.source", self.source, batch)

  def __call__(self, x: Array, *, layer: int, mask: Array, values: Array | None) -> Array:
    del mask, values
    if tuple(self.source.shape) != tuple(x.shape):
      # caller's argument
      raise ValueError(f"Patch.source has shape {tuple(self.source.shape)}; the {self.site!r} "
                       f"site of layer {layer} has shape {tuple(x.shape)}.")
    col = lambda t: jnp.asarray(t).reshape((-1,) + (1,) * (x.ndim - 1))  # [B] -> [B, 1, ..]
    hit = col(self.layers) == layer
    for axis, target in zip(SITE_AXES[self.site], (self.positions, self.heads)):
      if axis is not None:
        at = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)
        hit = hit & ((col(target) < 0) | (at == col(target)))
    return jnp.where(hit, jnp.asarray(self.source, x.dtype), x)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Add:
  """`delta[layer]` added to the activation at `site` of every layer (steering; at 0, the
  gradient of a metric with respect to `delta` is its gradient with respect to the site's
  activations, in one backward pass: attribution patching).

  Attributes:
    delta: `[layers, batch, ...]`, the site's shape per layer (traced).
    site: one of `attention.SITES` (static).
  """

  delta: Array
  site: str = dataclasses.field(default="residual_out", metadata=dict(static=True))

  def __post_init__(self):
    _check_site("Add", self.site)

  def validate(self, *, num_layers: int, num_heads: int, seq_len: int,
               batch: int | None) -> None:
    del num_heads, seq_len
    shape = tuple(np.shape(self.delta))
    if len(shape) < 2 or shape[0] != num_layers or (batch is not None and shape[1] != batch):
      # caller's argument
      raise ValueError(f"Add.delta has shape {shape}; expected [layers, batch, ...] with "
                       f"layers {num_layers} and batch {batch}.")

  def __call__(self, x: Array, *, layer: int, mask: Array, values: Array | None) -> Array:
    del mask, values
    return x + jnp.asarray(self.delta[layer], x.dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StopGradient:
  """The activation at `site` of layer `layer` unchanged, its gradient stopped (AtP*'s
  GradDrop drops one layer's block outputs from the backward pass)."""

  layer: int = dataclasses.field(metadata=dict(static=True))
  site: str = dataclasses.field(default="attention_output", metadata=dict(static=True))

  def __post_init__(self):
    _check_site("StopGradient", self.site)

  def __call__(self, x: Array, *, layer: int, mask: Array, values: Array | None) -> Array:
    del mask, values
    return jax.lax.stop_gradient(x) if layer == self.layer else x


KNOCKOUT_RULES = ("renormalize", "zero")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Knockout:
  """Attention edges blocked over a window of layers (Geva et al., EMNLP 2023's attention
  knockout): in layers `first[b]..last[b]` (inclusive; -1: none) query i of example b may not
  attend to key j where `blocked[b, i, j]`, in every head.

  rule: "renormalize" (a row that lost keys is renormalised over the rest, as setting the
  blocked scores to -inf before the softmax does; a row that lost every key attends to
  nothing, where the softmax would give NaN) or "zero" (the blocked probabilities set to 0,
  the rest unchanged: the row then sums to less than 1). Rows without a blocked edge are left
  exactly as they are. `edges` builds `blocked` from query and key sets; `position_classes`
  gives the usual sets.

  Attributes:
    blocked: `[batch, L, L]` bool (traced).
    first, last: `[batch]` int (traced).
    rule: one of `KNOCKOUT_RULES` (static).
  """

  blocked: Array
  first: Array
  last: Array
  rule: str = dataclasses.field(default="renormalize", metadata=dict(static=True))
  site: ClassVar[str] = "probs"

  def __post_init__(self):
    if self.rule not in KNOCKOUT_RULES:
      # caller's argument
      raise ValueError(f"knockout rule {self.rule!r}; choose one of {KNOCKOUT_RULES}.")
    object.__setattr__(self, "first", _rows(self.first))
    object.__setattr__(self, "last", _rows(self.last))

  def validate(self, *, num_layers: int, num_heads: int, seq_len: int,
               batch: int | None) -> None:
    del num_layers, num_heads
    _check_rows("Knockout.first", self.first, batch)
    _check_rows("Knockout.last", self.last, batch)
    shape = tuple(np.shape(self.blocked))
    if len(shape) != 3 or shape[1:] != (seq_len, seq_len) or (
        batch is not None and shape[0] != batch):
      # caller's argument
      raise ValueError(f"Knockout.blocked has shape {shape}; expected [batch, L, L] = "
                       f"({batch}, {seq_len}, {seq_len}).")

  def __call__(self, x: Array, *, layer: int, mask: Array, values: Array | None) -> Array:
    del mask, values
    on = (jnp.asarray(self.first) <= layer) & (layer <= jnp.asarray(self.last))  # [B]
    cut = (jnp.asarray(self.blocked, bool) & on[:, None, None])[:, None]  # [B, 1, L, L]
    kept = jnp.where(cut, jnp.zeros((), x.dtype), x)
    if self.rule == "zero":
      return kept
    total = kept.sum(-1, keepdims=True)
    lost = cut.any(-1, keepdims=True)
    renormed = jnp.where(total > 0, kept / jnp.where(total > 0, total, 1), 0).astype(x.dtype)
    return jnp.where(lost, renormed, x)


def edges(queries: Array, keys: Array) -> Array:
  """`blocked[b, i, j]` for every query i in `queries[b]` and key j in `keys[b]` (`[B, L]`
  bool each): the edges from one set of positions to another."""
  return jnp.asarray(queries, bool)[:, :, None] & jnp.asarray(keys, bool)[:, None, :]


def shifted_edges(mask: Array, offset: int) -> Array:
  """`blocked[b, i, i + offset]` between real tokens: -1 the previous token, +1 the next."""
  mask = jnp.asarray(mask, bool)
  L = mask.shape[-1]
  pair = jnp.arange(L)[None, :] == jnp.arange(L)[:, None] + offset  # [L, L]
  return pair[None] & mask[:, :, None] & mask[:, None, :]


def position_classes(input_ids: np.ndarray, attention_mask: np.ndarray, *, cls_id: int,
                     sep_ids: tuple[int, ...], punctuation_ids: tuple[int, ...] = ()
                     ) -> dict[str, np.ndarray]:
  """The usual key (or query) sets, `[B, L]` bool each, over real tokens: "cls" (the
  `cls_id` tokens), "sep" (`sep_ids`), "punctuation" (`punctuation_ids`: the vocabulary's
  tokens made only of punctuation), and "other" (every other real token)."""
  ids, real = np.asarray(input_ids), np.asarray(attention_mask) > 0
  out = {"cls": real & (ids == cls_id), "sep": real & np.isin(ids, sep_ids),
         "punctuation": real & np.isin(ids, punctuation_ids)}
  out["other"] = real & ~(out["cls"] | out["sep"] | out["punctuation"])
  return out
