"""DeBERTa's disentangled attention: relative positions and c2p/p2c scores.

Follows Hugging Face `modeling_deberta.py` (v1) and `modeling_deberta_v2.py`
(v2/v3) term by term, so attention probabilities match to float tolerance. The
two versions differ only in the flags `relative_span`, `position_buckets` and
`scale_query_first` (see `EncoderConfig`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax.models.config import EncoderConfig

Array = jax.Array


def log_bucket_position(
    relative_pos: np.ndarray, bucket_size: int, max_position: int
) -> np.ndarray:
  """DeBERTa-v2 log buckets, in float32 as torch computes them."""
  rel = relative_pos.astype(np.int64)
  sign = np.sign(rel)
  mid = bucket_size // 2
  abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
  ratio = (abs_pos.astype(np.float32) / np.float32(mid)).astype(np.float32)
  denom = np.log(np.float32((max_position - 1) / mid)).astype(np.float32)
  log_pos = (
      np.ceil(np.log(ratio) / denom * np.float32(mid - 1)).astype(np.float32)
      + mid
  )
  bucket = np.where(abs_pos <= mid, rel.astype(np.float32), log_pos * sign)
  return bucket.astype(np.int64)


def attention_span(config: EncoderConfig, seq_len: int) -> int:
  """Number of relative-embedding rows on each side of zero."""
  if config.relative_span == "clip_to_length":
    return min(seq_len, config.max_relative_positions)
  return config.position_buckets if config.position_buckets > 0 else config.max_relative_positions


def rel_embedding_rows(config: EncoderConfig) -> int:
  if config.position_buckets > 0:
    return 2 * config.position_buckets
  return 2 * config.max_relative_positions


def relative_index(config: EncoderConfig, seq_len: int) -> np.ndarray:
  """`[L, L]` index into the sliced relative embeddings for (query, key).

  Both c2p and p2c use `clip(delta(i, j) + span, 0, 2 span - 1)` with
  `delta = i - j` (log-bucketed when position_buckets > 0); the bucketing is
  odd-symmetric, which makes HF's p2c index `clip(-delta(j, i) + span)` the
  same array.
  """
  q = np.arange(seq_len)
  rel = q[:, None] - q[None, :]
  if config.position_buckets > 0:
    rel = log_bucket_position(rel, config.position_buckets, config.max_relative_positions)
  span = attention_span(config, seq_len)
  return np.clip(rel + span, 0, 2 * span - 1)


def sliced_rel_embeddings(config: EncoderConfig, rel_embeddings: Array, seq_len: int) -> Array:
  span = attention_span(config, seq_len)
  if config.relative_span == "clip_to_length":  # Rows centred on max_relative_positions.
    centre = config.max_relative_positions
    return rel_embeddings[centre - span : centre + span]
  return rel_embeddings[: 2 * span]


def scale_factor(config: EncoderConfig) -> int:
  return 1 + len(config.pos_att_type)


def disentangled_scores(
    config: EncoderConfig,
    q: Array,
    k: Array,
    pos_q: Array | None,
    pos_k: Array | None,
) -> Array:
  """Attention scores `[B, h, L, L]` for the heads given.

  Args:
    config: the encoder config.
    q: queries `[B, L, h, d]` (projection plus bias; unscaled).
    k: keys `[B, L, h, d]`.
    pos_q: projected relative embeddings for p2c, `[2 span, h, d]`, or None.
    pos_k: projected relative embeddings for c2p, `[2 span, h, d]`, or None.
  """
  seq_len, d = q.shape[1], q.shape[-1]
  scale = np.float32(np.sqrt(np.float32(d) * scale_factor(config)))
  idx = relative_index(config, seq_len)
  v1 = config.scale_query_first
  if v1:  # Scale the query first (v1), or each term (v2).
    q = q / scale
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
  else:
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k / scale)
  if not config.relative_attention:
    return scores
  if "c2p" in config.pos_att_type:
    c2p = jnp.einsum("bqhd,rhd->bhqr", q, pos_k)
    c2p = jnp.take_along_axis(c2p, idx[None, None], axis=-1)
    scores = scores + (c2p if v1 else c2p / scale)
  if "p2c" in config.pos_att_type:
    if v1:
      pos_q = pos_q / scale
    p2c = jnp.einsum("bkhd,rhd->bhkr", k, pos_q)
    p2c = jnp.take_along_axis(p2c, idx.T[None, None], axis=-1)
    p2c = jnp.swapaxes(p2c, -1, -2)
    scores = scores + (p2c if v1 else p2c / scale)
  return scores
