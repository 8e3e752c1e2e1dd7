"""Attention probabilities and the functional attention override.

Shapes use `[batch, heads, q_len, kv_len]` (einsum `bhqk`). Masks are `[batch,
len]`, true (or 1) for real tokens.

The override is data, not a patch: `AttentionOverride` is a pytree whose
arrays (constant matrices, gate logits) are traced, and whose static parts
(which heads are constant, a user function) are part of the tree structure, so
a jitted function recompiles only when those change.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
L1_EPS = 1e-12  # torch.nn.functional.normalize's eps, as in the PAPA code.


class ProbsFn(Protocol):
  """A user transformation of one layer's attention probabilities.

  Called as `fn(probs, mask, layer=l, values=v)` with probs `[B, H, L, L]`,
  mask `[B, L]` (bool), the layer index (a Python int) and the layer's value
  vectors `[B, H, L, head_dim]` (bias included). Returns probs of the same
  shape, which then multiply the values.
  """

  def __call__(
      self, probs: Array, mask: Array, *, layer: int, values: Array
  ) -> Array:
    ...


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
  num = jnp.einsum("hqk,bkhd->bqhd", constants, values * m[:, :, None, None])
  den = jnp.einsum("hqk,bk->bqh", jnp.abs(constants), m)
  scale = m[:, :, None] / jnp.maximum(den, L1_EPS)
  return num * scale[..., None]


def fusion_barrier(x: Array) -> Array:
  """`x`, unchanged, as a separate value for the compiler.

  XLA-CPU's YNNPACK pass otherwise fuses scores, softmax and the
  probabilities-times-values matmul into one kernel that runs 1.7-3x slower
  than the two matmuls apart (measured on MiniLM shapes, jaxlib 0.10.2).
  `reduce_precision` to the dtype's own bits is an exact identity the pass
  does not absorb (`optimization_barrier` is removed before fusion on CPU).
  """
  fi = jnp.finfo(x.dtype)
  return jax.lax.reduce_precision(x, exponent_bits=fi.nexp, mantissa_bits=fi.nmant)


def softmax_with_key_mask(scores: Array, mask: Array) -> Array:
  """BERT-style: additive `finfo.min` on pad keys; pad queries stay dense."""
  neg = jnp.finfo(scores.dtype).min
  bias = jnp.where(mask[:, None, None, :], 0.0, neg).astype(scores.dtype)
  return jax.nn.softmax(scores + bias, axis=-1)


def softmax_with_pair_mask(scores: Array, mask: Array) -> Array:
  """DeBERTa-style: fill positions with `m_i m_j = 0` by `finfo.min`."""
  pm = mask[:, None, :, None] & mask[:, None, None, :]
  return jax.nn.softmax(
      jnp.where(pm, scores, jnp.finfo(scores.dtype).min), axis=-1
  )


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


def as_static_heads(static_heads: Any) -> tuple[tuple[bool, ...], ...] | None:
  """A boolean [layers, heads] selection as hashable tuples (None stays None)."""
  if static_heads is None:
    return None
  arr = np.asarray(static_heads)
  if arr.ndim != 2 or arr.dtype != np.bool_:
    raise ValueError(
        "static_heads must be a boolean [layers, heads] array, got "
        f"dtype {arr.dtype} and shape {arr.shape}."
    )
  return tuple(tuple(bool(v) for v in row) for row in arr)


@dataclasses.dataclass(frozen=True)
class LayerOverride:
  """What one layer sees of an `AttentionOverride` (built at trace time)."""

  static: tuple[int, ...]
  constants: Array | None  # [H, L, L]
  gate_logits: Array | None  # [H]
  probs_fn: ProbsFn | None

  @property
  def is_identity(self) -> bool:
    return not self.static and self.gate_logits is None and self.probs_fn is None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AttentionOverride:
  """Per-layer replacement of attention probabilities, passed to `apply`.

  Modes (combinable except where noted):
    * Static heads (PAPA): `static_heads[l, h]` true replaces head h of layer l
      by `constants[l, h]`, masked with the example's `m_i m_j` and
      L1-renormalised over keys. Static heads skip their query/key
      projections and softmax entirely.
    * Gating (PAPA head sorting): every head mixes
      `sigmoid(g) * P_dyn + (1 - sigmoid(g)) * MN(C)` with `gate_logits[l, h]`.
      Not combinable with static heads.
    * `probs_fn`: applied to each layer's probabilities last (after the modes
      above), e.g. effective attention or ablations. See `ProbsFn`.

  Attributes:
    constants: `[layers, heads, L, L]` (traced).
    gate_logits: `[layers, heads]` (traced).
    static_heads: boolean `[layers, heads]` (static; a tuple of tuples).
    probs_fn: a `ProbsFn` (static; hashed by identity).
  """

  constants: Array | None = None
  gate_logits: Array | None = None
  static_heads: tuple[tuple[bool, ...], ...] | None = dataclasses.field(
      default=None, metadata=dict(static=True)
  )
  probs_fn: ProbsFn | None = dataclasses.field(
      default=None, metadata=dict(static=True)
  )

  def __post_init__(self):
    object.__setattr__(self, "static_heads", as_static_heads(self.static_heads))

  @classmethod
  def replace_heads(
      cls, static_heads: Any, constants: Array, **kwargs
  ) -> AttentionOverride:
    return cls(constants=constants, static_heads=static_heads, **kwargs)

  @property
  def num_static(self) -> int:
    return int(np.sum(self.static_heads)) if self.static_heads else 0

  def validate(self, num_layers: int, num_heads: int, seq_len: int) -> None:
    """Raises ValueError naming the expected shape when one does not match."""
    need_constants = self.num_static > 0 or self.gate_logits is not None
    if self.static_heads is not None:
      got = np.asarray(self.static_heads).shape
      if got != (num_layers, num_heads):
        raise ValueError(
            f"static_heads has shape {got}; this model expects "
            f"[layers, heads] = {(num_layers, num_heads)}."
        )
    if need_constants and self.constants is None:
      raise ValueError("Static or gated heads need `constants`.")
    if self.constants is not None and need_constants:
      want = (num_layers, num_heads, seq_len, seq_len)
      if tuple(self.constants.shape) != want:
        raise ValueError(
            f"constants have shape {tuple(self.constants.shape)}; this model "
            f"and input length expect [layers, heads, L, L] = {want}."
        )
    if self.gate_logits is not None:
      if self.num_static:
        raise ValueError("gate_logits cannot be combined with static heads.")
      if tuple(self.gate_logits.shape) != (num_layers, num_heads):
        raise ValueError(
            f"gate_logits have shape {tuple(self.gate_logits.shape)}; "
            f"expected [layers, heads] = {(num_layers, num_heads)}."
        )
    if self.probs_fn is not None and not callable(self.probs_fn):
      raise ValueError("probs_fn must be callable.")

  def for_layer(self, layer: int) -> LayerOverride:
    static = ()
    if self.static_heads is not None:
      static = tuple(h for h, s in enumerate(self.static_heads[layer]) if s)
    use_constants = bool(static) or self.gate_logits is not None
    return LayerOverride(
        static=static,
        constants=self.constants[layer] if use_constants else None,
        gate_logits=None
        if self.gate_logits is None
        else self.gate_logits[layer],
        probs_fn=self.probs_fn,
    )


def head_mask_from_ranking(
    ranking: Sequence[tuple[int, int]], k: int, num_layers: int, num_heads: int
) -> np.ndarray:
  """Boolean `[layers, heads]` marking the first k `(layer, head)` pairs."""
  if not 0 <= k <= len(ranking):
    raise ValueError(f"k={k} outside [0, {len(ranking)}].")
  mask = np.zeros((num_layers, num_heads), dtype=bool)
  for layer, head in ranking[:k]:
    if not (0 <= layer < num_layers and 0 <= head < num_heads):
      raise ValueError(
          f"Head ({layer}, {head}) does not exist in a model with "
          f"{num_layers} layers and {num_heads} heads."
      )
    mask[layer, head] = True
  return mask


IDENTITY: Callable[..., Array] = lambda probs, mask, **_: probs
