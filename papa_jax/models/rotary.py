"""Rotary position embeddings (RoPE) and the local attention window.

Queries and keys of position p are rotated by angles `p * theta^(-2k/d)`, the
halves convention of Hugging Face's `rotate_half` (dimension k pairs with
k + d/2). Positions are the absolute indices 0..L-1 of the (right-padded)
input, as Hugging Face computes them without position_ids: the same indices
PAPA's constant matrices are laid out by, so a constant `[L, L]` cell (i, j)
is the pair at positions i and j, whatever the rotation did to the scores.
Angles are computed in float32, as torch computes them, then cast.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax.models.config import EncoderConfig

Array = jax.Array


def cos_sin(theta: float, head_dim: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
  """`cos, sin` of every position's angles, `[L, head_dim]` float32 each."""
  inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32)
                                          / np.float32(head_dim)))
  freqs = np.arange(seq_len, dtype=np.float32)[:, None] * inv_freq.astype(np.float32)[None]
  emb = np.concatenate([freqs, freqs], axis=-1)
  return np.cos(emb), np.sin(emb)


def rotate(x: Array, theta: float) -> Array:
  """Queries or keys `[B, L, H, d]` rotated by their positions 0..L-1 (in at least
  float32, as HF ModernBERT rotates bfloat16 ones; returned in x's dtype)."""
  dtype = x.dtype
  x = x.astype(jnp.promote_types(dtype, jnp.float32))
  cos, sin = cos_sin(theta, x.shape[-1], x.shape[1])
  cos = jnp.asarray(cos, x.dtype)[None, :, None]
  sin = jnp.asarray(sin, x.dtype)[None, :, None]
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return (x * cos + rotated * sin).astype(dtype)


def window(config: EncoderConfig, layer: int, seq_len: int) -> np.ndarray | None:
  """`[L, L]` bool: key j within `local_window` of query i, on a local layer; else None.

  Hugging Face ModernBERT masks `|i - j| > local_attention // 2` on its sliding
  layers (as it masks pad keys); pad queries keep their window's real keys.
  """
  if not config.is_local(layer):
    return None
  pos = np.arange(seq_len)
  return np.abs(pos[:, None] - pos[None, :]) <= config.local_window
