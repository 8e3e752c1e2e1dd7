"""Attention probabilities, and the whole meaning of the attention override.

Shapes use `[batch, heads, q_len, kv_len]` (einsum `bhqk`); values and
contexts stay `[batch, len, heads, head_dim]` (`bkhd`). Masks are `[batch,
len]`, true (or 1) for real tokens.

A layer hands `attend` its value vectors and a function computing its own
(family-specific) probabilities for any subset of heads; `attend` alone
decides what the override does with them, in the spirit of penzai's
`query_key_to_attn` / `attn_value_to_output` split. It owns what decides the
fast path (constant and gated heads) and calls the override's interventions
at their named sites (`values`, `probs`, `context`); the interventions
themselves live in `papa_jax/interventions.py`. The override is data, not a
patch: `AttentionOverride` is a pytree whose arrays (constant matrices, gate
logits, the interventions' arrays) are traced, and whose static parts (which
heads are constant, the interventions' kinds) are part of the tree structure,
so a jitted function recompiles only when those change.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax import backend

Array = jax.Array
L1_EPS = 1e-12  # torch.nn.functional.normalize's eps, as in the PAPA code.
StaticHeads = tuple[tuple[bool, ...], ...]


# Probabilities from scores (the two masking conventions of the families).


def softmax_with_key_mask(scores: Array, mask: Array, window: Array | None = None) -> Array:
  """BERT-style: additive `finfo.min` on pad keys; pad queries stay dense.

  `window` (`[L, L]` bool, a local layer's visible pairs) masks the same way,
  once per pair, as Hugging Face's sliding-window masks do.
  """
  neg = jnp.finfo(scores.dtype).min
  keep = mask[:, None, None, :] if window is None else mask[:, None, None, :] & window
  bias = jnp.where(keep, 0.0, neg).astype(scores.dtype)
  return jax.nn.softmax(scores + bias, axis=-1)


def softmax_with_pair_mask(scores: Array, mask: Array) -> Array:
  """DeBERTa-style: fill positions with `m_i m_j = 0` by `finfo.min`."""
  pm = mask[:, None, :, None] & mask[:, None, None, :]
  return jax.nn.softmax(jnp.where(pm, scores, jnp.finfo(scores.dtype).min), axis=-1)


# Constant (PAPA) attention.


def pair_mask(mask: Array, dtype=jnp.float32) -> Array:
  """`m_i * m_j` as `[B, 1, L, L]`."""
  m = mask.astype(dtype)
  return m[:, None, :, None] * m[:, None, None, :]


def mask_and_normalize(probs: Array, mask: Array) -> Array:
  """Zero pad queries and pad keys, then L1-renormalise rows over keys.

  Rows whose mass becomes zero stay zero (no NaN). This is PAPA's
  `mask_and_normalize` (torch `normalize(p=1, dim=-1)` after `* m_i m_j`).
  """
  p = probs * pair_mask(mask, probs.dtype)
  denom = jnp.maximum(jnp.sum(jnp.abs(p), axis=-1, keepdims=True), L1_EPS)
  return p / denom


def constant_probs(constants: Array, mask: Array) -> Array:
  """Constant matrices `[H, L, L]` masked per example: `[B, H, L, L]`."""
  return mask_and_normalize(constants[None], mask)


def constant_context(constants: Array, mask: Array, values: Array) -> Array:
  """`constant_probs(constants, mask) @ values`, without building `[B,H,L,L]`.

  For one head with constant matrix C and real-token mask m, the masked and
  renormalised row i is `C_ij m_i m_j / sum_j |C_ij| m_j`, so the output is
  `m_i * (C @ (m * v))_i / (|C| @ m)_i`: two matmuls against the shared C.

  Args:
    constants: `[H, L, L]`.
    mask: `[B, L]`.
    values: `[B, L, H, D]` (the layout the projections produce).

  Returns:
    `[B, L, H, D]`.
  """
  m = mask.astype(values.dtype)
  c = constants.astype(values.dtype)
  num = jnp.einsum("hqk,bkhd->bqhd", c, values * m[:, :, None, None])
  den = jnp.einsum("hqk,bk->bqh", jnp.abs(constants), mask.astype(constants.dtype))
  scale = mask.astype(den.dtype)[:, :, None] / jnp.maximum(den, L1_EPS)
  return num * scale[..., None].astype(num.dtype)  # Values' dtype (mixed precision).


def uniform_probs(mask: Array, shape: Sequence[int], dtype=jnp.float32) -> Array:
  """Uniform attention over real keys for real queries, `shape` = `[B, H, L, L]`."""
  return mask_and_normalize(jnp.ones(shape, dtype), mask)


def fusion_barrier(x: Array) -> Array:
  """`x`, unchanged, as a separate value for the XLA-CPU compiler.

  XLA-CPU's YNNPACK pass otherwise fuses scores, softmax and the
  probabilities-times-values matmul into one kernel that runs 1.7-3x slower
  than the two matmuls apart (measured on MiniLM shapes, jaxlib 0.10.2).
  `reduce_precision` to the dtype's own bits is an exact identity the pass
  does not absorb (`optimization_barrier` is removed before fusion on CPU).
  Programs lowered for other platforms get `x` untouched: the quirk is CPU-only.
  """
  fi = jnp.finfo(x.dtype)
  return backend.by_platform(
      lambda v: jax.lax.reduce_precision(v, exponent_bits=fi.nexp, mantissa_bits=fi.nmant),
      lambda v: v, x)


def merge_heads(parts: Sequence[tuple[Sequence[int], Array]], axis: int = 1) -> Array:
  """Concatenate per-head arrays given for disjoint head index lists.

  Args:
    parts: `(heads, x)` pairs with `x.shape[axis] == len(heads)`.
    axis: the head axis.

  Returns:
    The array with all H heads on `axis`, head `h` taken from the part that
    lists it.
  """
  parts = [(tuple(h), x) for h, x in parts if len(h)]
  if len(parts) == 1:
    heads, x = parts[0]
    if heads == tuple(range(len(heads))):
      return x
  order = np.concatenate([np.asarray(h) for h, _ in parts])
  inverse = np.argsort(order)
  return jnp.take(jnp.concatenate([x for _, x in parts], axis=axis), inverse, axis=axis)


def as_static_heads(static_heads: Any) -> StaticHeads | None:
  """A boolean [layers, heads] selection as hashable tuples (None stays None)."""
  if static_heads is None:
    return None
  arr = np.asarray(static_heads)
  if arr.ndim != 2 or arr.dtype != np.bool_:
    raise ValueError(
        "static_heads must be a boolean [layers, heads] array, got "
        f"dtype {arr.dtype} and shape {arr.shape}."
    )  # caller's argument
  return tuple(tuple(bool(v) for v in row) for row in arr)


SITES = ("values", "probs", "context", "residual_in", "attention_output", "mlp_output",
         "residual_out")
# Where each site's activation keeps its positions and heads (batch is axis 0): the shapes
# `Intervention` lists. Positions are the query rows at "probs".
SITE_AXES = {"values": (1, 2), "probs": (2, 1), "context": (1, 2), "residual_in": (1, None),
             "attention_output": (1, None), "mlp_output": (1, None), "residual_out": (1, None)}


class Intervention(Protocol):
  """A change to one layer's attention at a named site (see `papa_jax/interventions.py`).

  Interventions are pytrees (registered dataclasses): array fields (head or
  token indices per example, replacement matrices) are traced, so another head
  set or token never recompiles; the class and its static fields decide what
  compiles. `attend` calls each one at its `site`, in the order given:
    * "values": `x` is the layer's value vectors `[B, L, H, d]` (bias
      included), before anything uses them (constant heads too);
    * "probs": `x` is the probabilities `[B, H, L, L]` after constant or gated
      heads are mixed in, before dropout (`values` is passed, `[B, L, H, d]`);
    * "context": `x` is each head's output `[B, L, H, d]` (probabilities times
      values) before the output projection;
    * "residual_in": the layer's input `[B, L, D]` (the residual stream entering it);
    * "attention_output": the attention block's output `[B, L, D]` (projected, bias
      included) before dropout and the residual sum;
    * "mlp_output": the MLP's output `[B, L, D]` before dropout and the residual sum;
    * "residual_out": the layer's output `[B, L, D]` (the residual stream leaving it; the
      last layer's before a final LayerNorm).
  `layer` is the layer index (a Python int) and `mask` the `[B, L]` bool mask.
  """

  site: str

  def __call__(self, x: Array, *, layer: int, mask: Array, values: Array | None) -> Array:
    ...


@dataclasses.dataclass(frozen=True)
class LayerOverride:
  """What one layer sees of an `AttentionOverride` (built at trace time)."""

  layer: int
  static: tuple[int, ...]
  constants: Array | None  # [H, L, L]
  gate_logits: Array | None  # [H]
  interventions: tuple[Intervention, ...] = ()

  @property
  def is_identity(self) -> bool:
    return not self.static and self.gate_logits is None and not self.interventions

  def at(self, site: str) -> tuple[Intervention, ...]:
    return tuple(iv for iv in self.interventions if iv.site == site)

  def apply(self, site: str, x: Array, mask: Array, values: Array | None = None) -> Array:
    for iv in self.at(site):
      x = iv(x, layer=self.layer, mask=mask, values=values)
    return x


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionOverride:
  """Per-layer replacement of attention probabilities, passed to `apply`.

  Build it with a named constructor:
    * `constant(C, heads)` (PAPA): head h of layer l with `heads[l, h]` uses
      `C[l, h]` masked with the example's `m_i m_j` and L1-renormalised over
      keys (on a local layer, masked by its window first: `models/rotary.py`).
      Constant heads skip their query/key projections and softmax.
    * `gated(C, gate_logits)` (PAPA head sorting): every head mixes
      `sigmoid(g) P_dyn + (1 - sigmoid(g)) MN(C)`.
    * `intervene(*interventions)`: changes at named sites (`Intervention`;
      head ablation, effective attention, value zeroing, a user function:
      `papa_jax/interventions.py`); `with_interventions` adds them to an
      override.
  Static heads or gates come first, then the interventions at their sites
  (gates and static heads are exclusive).

  Attributes:
    constants: `[layers, heads, L, L]` (traced).
    gate_logits: `[layers, heads]` (traced).
    interventions: a tuple of `Intervention` pytrees.
    static_heads: boolean `[layers, heads]` (static; a tuple of tuples).
  """

  constants: Array | None = None
  gate_logits: Array | None = None
  interventions: tuple = ()
  static_heads: StaticHeads | None = dataclasses.field(default=None, metadata=dict(static=True))

  def __post_init__(self):
    object.__setattr__(self, "static_heads", as_static_heads(self.static_heads))
    object.__setattr__(self, "interventions", tuple(self.interventions))

  @classmethod
  def constant(cls, constants: Array, heads: Any = None) -> AttentionOverride:
    """Heads `heads[l, h]` (default: all) replaced by their constant matrices."""
    if heads is None:
      heads = np.ones(np.shape(constants)[:2], bool)
    return cls(constants=constants, static_heads=heads)

  @classmethod
  def gated(cls, constants: Array, gate_logits: Array) -> AttentionOverride:
    return cls(constants=constants, gate_logits=gate_logits)

  @classmethod
  def intervene(cls, *interventions: Intervention) -> AttentionOverride:
    return cls(interventions=interventions)

  def with_gates(self, gate_logits: Array) -> AttentionOverride:
    return dataclasses.replace(self, gate_logits=gate_logits)

  def with_interventions(self, *interventions: Intervention) -> AttentionOverride:
    return dataclasses.replace(self, interventions=self.interventions + tuple(interventions))

  @property
  def num_static(self) -> int:
    return int(np.sum(self.static_heads)) if self.static_heads else 0

  def validate(self, num_layers: int, num_heads: int, seq_len: int,
               batch: int | None = None) -> None:
    """Raises ValueError naming the expected shape when one does not match."""
    need_constants = self.num_static > 0 or self.gate_logits is not None
    if self.static_heads is not None:
      got = np.asarray(self.static_heads).shape
      if got != (num_layers, num_heads):
        raise ValueError(f"static_heads has shape {got}; this model expects "
                         f"[layers, heads] = {(num_layers, num_heads)}.")  # caller's argument
    if need_constants and self.constants is None:
      raise ValueError("Static or gated heads need `constants`.")  # caller's argument
    if self.constants is not None and need_constants:
      want = (num_layers, num_heads, seq_len, seq_len)
      if tuple(self.constants.shape) != want:
        # caller's argument
        raise ValueError(f"constants have shape {tuple(self.constants.shape)}; this model "
                         f"and input length expect [layers, heads, L, L] = {want}.")
    if self.gate_logits is not None:
      if self.num_static:
        raise ValueError("gate_logits cannot be combined with static heads.")  # caller's argument
      if tuple(self.gate_logits.shape) != (num_layers, num_heads):
        # caller's argument
        raise ValueError(f"gate_logits have shape {tuple(self.gate_logits.shape)}; "
                         f"expected [layers, heads] = {(num_layers, num_heads)}.")
    for iv in self.interventions:
      if getattr(iv, "site", None) not in SITES or not callable(iv):
        raise ValueError(f"{iv!r} is not an intervention: it needs a `site` in {SITES} and "
                         "a __call__ (see papa_jax/interventions.py).")  # caller's argument
      check = getattr(iv, "validate", None)
      if check is not None:
        check(num_layers=num_layers, num_heads=num_heads, seq_len=seq_len, batch=batch)

  def for_layer(self, layer: int) -> LayerOverride:
    static = ()
    if self.static_heads is not None:
      static = tuple(h for h, s in enumerate(self.static_heads[layer]) if s)
    use_constants = bool(static) or self.gate_logits is not None
    return LayerOverride(
        layer=layer,
        static=static,
        constants=self.constants[layer] if use_constants else None,
        gate_logits=None if self.gate_logits is None else self.gate_logits[layer],
        interventions=self.interventions,
    )


def attend(
    override: LayerOverride | None,
    dynamic_probs: Callable[[tuple[int, ...]], Array],
    values: Array,
    mask: Array,
    *,
    capture: bool,
    dropout: Callable[[Array], Array] | None,
    fused_context: Callable[[tuple[int, ...], Array], Array] | None = None,
) -> tuple[Array, Array | None, Array]:
  """One layer's attention under `override`: the context, probabilities and values.

  Args:
    override: this layer's part of the override, or None.
    dynamic_probs: `heads -> [B, len(heads), L, L]`, the layer's own
      (input-dependent) probabilities for the given heads.
    values: `[B, L, H, d]` value vectors (bias included).
    mask: `[B, L]` bool.
    capture: the caller wants the probabilities.
    dropout: attention dropout to apply to the probabilities, or None when
      it is inactive.
    fused_context: `(heads, values [B, L, h, d]) -> context [B, L, h, d]`
      computed without materialising the probabilities (same masking as
      `dynamic_probs`), used for dynamic heads when nothing needs their
      probabilities and `backend.use_fused_attention()`.

  Returns:
    `(context [B, L, H, d], probs [B, H, L, L], values [B, L, H, d])`: probs
    is None on the constant fast path (no capture, no dropout, no gates,
    nothing at the "probs" site); values are after the "values" site.
  """
  num_heads = values.shape[2]
  all_heads = tuple(range(num_heads))
  lo = override if override is not None and not override.is_identity else None
  if lo:
    values = lo.apply("values", values, mask)
  static = lo.static if lo else ()
  dynamic = tuple(h for h in all_heads if h not in static)
  no_probs = not capture and dropout is None and (lo is None or (
      lo.gate_logits is None and not lo.at("probs")))
  fused = fused_context is not None and backend.fused_attention_setting() is not False
  if no_probs and (static or fused):
    # Fast path: constant heads without Q/K or softmax, dynamic heads fused when
    # possible; no [B, H, L, L] tensor for constant heads.
    parts = []
    if static:
      idx = np.asarray(static, dtype=np.int32)
      parts.append((static, constant_context(lo.constants[idx], mask, values[:, :, idx])))
    if dynamic:
      didx = np.asarray(dynamic, dtype=np.int32)
      v = values[:, :, didx] if static else values
      def explicit(v):
        return jnp.einsum("bhqk,bkhd->bqhd", fusion_barrier(
            dynamic_probs(dynamic)).astype(values.dtype), v)

      if not fused:
        parts.append((dynamic, explicit(v)))
      elif backend.fused_attention_setting():
        parts.append((dynamic, fused_context(dynamic, v)))
      else:  # The platform's default: explicit on CPU, fused elsewhere.
        parts.append((dynamic, backend.by_platform(
            explicit, lambda v: fused_context(dynamic, v), v)))
    context = merge_heads(parts, axis=2)
    return (lo.apply("context", context, mask) if lo else context), None, values

  if lo and lo.gate_logits is not None:
    gate = jax.nn.sigmoid(lo.gate_logits)[None, :, None, None]
    probs = gate * dynamic_probs(all_heads) + (1.0 - gate) * constant_probs(lo.constants, mask)
  elif static:
    idx = np.asarray(static, dtype=np.int32)
    parts = [(static, constant_probs(lo.constants[idx], mask))]
    if dynamic:
      parts.append((dynamic, dynamic_probs(dynamic)))
    probs = merge_heads(parts)
  else:
    probs = dynamic_probs(all_heads)
  if lo:
    probs = lo.apply("probs", probs, mask, values)
  dropped = probs if dropout is None else dropout(probs)
  context = jnp.einsum("bhqk,bkhd->bqhd", fusion_barrier(dropped).astype(values.dtype), values)
  return (lo.apply("context", context, mask) if lo else context), probs, values
