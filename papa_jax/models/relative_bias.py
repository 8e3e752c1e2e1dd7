"""A learned relative-position bias on the attention scores, shared by all layers.

The bias of query i and key j is row `bucket(i - j)` of one `[buckets, heads]`
table, added to the scaled dot product before the padding mask. Offsets come
from the positions 0..L-1, never from padded position ids. Buckets follow Hugging
Face `MPNetEncoder.relative_position_bucket` (T5's bidirectional scheme) in
float32, as torch computes them, so probabilities match to float tolerance.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax.models.config import EncoderConfig

Array = jax.Array


def relative_position_bucket(delta: np.ndarray, num_buckets: int,
                             max_distance: int) -> np.ndarray:
  """The bucket of each offset `delta = i - j` (query minus key).

  Half the buckets hold delta >= 0, the other half delta < 0. Within a half,
  offsets below a quarter of `num_buckets` have a bucket each; longer ones are
  log-spaced up to `max_distance`, and the rest share the half's last bucket.
  """
  half = num_buckets // 2
  exact = half // 2
  n = np.asarray(delta, np.int64)
  base = np.where(n < 0, half, 0)
  n = np.abs(n)
  ratio = np.maximum(n, 1).astype(np.float32) / np.float32(exact)
  log = (np.log(ratio) / np.float32(math.log(max_distance / exact))
         * np.float32(half - exact)).astype(np.float32)
  large = np.minimum(exact + log.astype(np.int64), half - 1)  # Truncates, as torch's .long().
  return base + np.where(n < exact, n, large)


def bucket_index(config: EncoderConfig, seq_len: int) -> np.ndarray:
  """`[L, L]` table row of each (query, key) pair."""
  pos = np.arange(seq_len)
  return relative_position_bucket(pos[:, None] - pos[None, :], config.relative_bias_buckets,
                                  config.relative_bias_max_distance)


def relative_bias(config: EncoderConfig, table: Array, seq_len: int) -> Array:
  """Every head's bias `[H, L, L]` from the shared table `[buckets, H]`."""
  return jnp.transpose(table[bucket_index(config, seq_len)], (2, 0, 1))
