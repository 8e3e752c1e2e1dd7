"""Probes on a frozen encoder's hidden states (`shared/spec/papa.md` §7).

Input features are the stacked hidden states of every layer, embeddings
included: `[B, K, L, D]` with K = num_layers + 1.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from papa_jax.data.preprocess import IGNORE

Array = jax.Array
_init = nn.initializers.normal(stddev=0.02)


class SentenceProbe(nn.Module):
  """PAPA's `FreezeExtractPoller`: per-layer, per-position weights, then MLP.

  `v_k = sum_t W[k, t] m_t h_k[t]` (W initialised to 1/L and unconstrained, so
  at initialisation v_k is the sum of real-token states divided by L), the v_k
  concatenated, a dense layer to D, tanh, dropout (not for RoBERTa), and the
  classifier.
  """

  num_labels: int
  hidden_size: int
  dropout_rate: float = 0.1
  kind: str = "classification"  # Or "regression" (one output, squared error).

  @nn.compact
  def __call__(self, features: Array, mask: Array, *, deterministic: bool = True) -> Array:
    b, k, l, _ = features.shape
    w = self.param("weights_per_layer", nn.initializers.constant(1.0 / l), (k, l))
    v = jnp.einsum("bkld,kl,bl->bkd", features.astype(jnp.float32), w,
                   mask.astype(jnp.float32))
    pooled = jnp.tanh(nn.Dense(self.hidden_size, kernel_init=_init,
                               name="dense_across_layers")(v.reshape(b, -1)))
    pooled = nn.Dropout(self.dropout_rate)(pooled, deterministic=deterministic)
    return nn.Dense(self.num_labels, kernel_init=_init, name="classifier")(pooled)


class TokenProbe(nn.Module):
  """PAPA's token-level probe: concat all layers per token, dense, tanh, decoder."""

  num_labels: int
  hidden_size: int
  kind: str = "tagging"

  @nn.compact
  def __call__(self, features: Array, mask: Array, *, deterministic: bool = True) -> Array:
    del mask, deterministic
    b, k, l, d = features.shape
    x = jnp.moveaxis(features.astype(jnp.float32), 1, 2).reshape(b, l, k * d)
    x = jnp.tanh(nn.Dense(self.hidden_size, kernel_init=_init, name="dense_across_layers")(x))
    return nn.Dense(self.num_labels, kernel_init=_init, name="decoder")(x)


def make_probe(kind: str, num_labels: int, hidden_size: int, dropout_rate: float) -> nn.Module:
  if kind == "tagging":
    return TokenProbe(num_labels, hidden_size)
  return SentenceProbe(num_labels, hidden_size, dropout_rate, kind=kind)


def example_losses(kind: str, logits: Array, labels: Array) -> Array:
  """Each example's loss `[B]`: cross-entropy (summed over its scored tokens for
  tagging) or squared error (regression)."""
  if kind == "tagging":
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    return jnp.sum(ce * (labels != IGNORE), -1)
  if kind == "regression":
    return (logits[:, 0] - labels) ** 2
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def loss_fn(kind: str, logits: Array, labels: Array, valid: Array) -> tuple[Array, Array]:
  """Mean loss over valid examples (tokens for tagging) and its weight."""
  valid = valid.astype(jnp.float32)
  if kind == "tagging":
    w = valid[:, None] * (labels != IGNORE)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(labels, 0))
    n = jnp.sum(w)
    return jnp.sum(ce * w) / jnp.maximum(n, 1.0), n
  if kind == "regression":
    err = (logits[:, 0] - labels) ** 2
  else:
    err = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  n = jnp.sum(valid)
  return jnp.sum(err * valid) / jnp.maximum(n, 1.0), n
