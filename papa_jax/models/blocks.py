"""The encoder's building blocks: dtypes, activations, LayerNorm, the MLP and the embeddings
(`encoder.py` stacks them)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from papa_jax.models.config import EncoderConfig

Array = jax.Array
INIT = nn.initializers.normal(stddev=0.02)


DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def compute_dtype(config: EncoderConfig):
  """The matmul dtype for mixed precision, or None (compute in the parameters' dtype).

  With bfloat16, parameters, the residual stream, LayerNorms and softmax stay
  float32 (or wider).
  """
  return None if config.compute_dtype == "float32" else DTYPES[config.compute_dtype]


def cast(x: Array, dtype) -> Array:
  return x if dtype is None else x.astype(dtype)


def widen(x: Array) -> Array:
  """At least float32 (bfloat16 matmul outputs back to the residual dtype)."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def activation(name: str):
  if name == "gelu":
    return functools.partial(jax.nn.gelu, approximate=False)
  if name in ("gelu_new", "gelu_pytorch_tanh"):
    return functools.partial(jax.nn.gelu, approximate=True)
  if name == "relu":
    return jax.nn.relu
  return jax.nn.silu


def layer_norm(config: EncoderConfig, name: str) -> nn.LayerNorm:
  # Two-pass variance, as torch computes it.
  return nn.LayerNorm(epsilon=config.layer_norm_eps, use_fast_variance=False,
                      use_bias=config.norm_bias, name=name)


def norm_scale(x: Array, eps: float) -> Array:
  """`sqrt(var(x) + eps)` over the last axis (two-pass variance, as the LayerNorms)."""
  x = widen(x)
  return jnp.sqrt(jnp.var(x, axis=-1) + eps)


def mlp(c: EncoderConfig, h: Array) -> Array:
  """`W2 act(W1 h)`, or gated `W2 (act(W1 h) * U h)` (W1 "intermediate", U "up"); its
  Dense layers belong to the calling layer (call inside its compact method)."""
  dense = functools.partial(nn.Dense, kernel_init=INIT, dtype=compute_dtype(c),
                            use_bias=c.mlp_bias)
  f = activation(c.hidden_act)(dense(c.intermediate_size, name="intermediate")(h))
  if c.mlp == "gated":
    f = f * dense(c.intermediate_size, name="up")(h)
  return widen(dense(c.hidden_size, name="output")(f))


class Embeddings(nn.Module):
  """Token, position and segment embeddings, as the config's flags say."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, input_ids, mask, token_type_ids, position_ids, *, deterministic):
    c = self.config
    e = nn.Embed(c.vocab_size, c.embed_dim, embedding_init=INIT,
                 name="word_embeddings")(input_ids)
    if c.position_biased_input:
      if position_ids is None:
        if c.position_ids == "from_padding":  # HF create_position_ids_from_input_ids.
          nonpad = (input_ids != c.pad_token_id).astype(jnp.int32)
          position_ids = jnp.cumsum(nonpad, axis=1) * nonpad + c.pad_token_id
        else:
          position_ids = jnp.arange(input_ids.shape[1])[None]
      e = e + nn.Embed(c.max_position_embeddings, c.embed_dim,
                       embedding_init=INIT, name="position_embeddings")(position_ids)
    if c.type_vocab_size > 0:
      if token_type_ids is None:
        token_type_ids = jnp.zeros_like(input_ids)
      e = e + nn.Embed(c.type_vocab_size, c.embed_dim, embedding_init=INIT,
                       name="token_type_embeddings")(token_type_ids)
    if c.embedding_projection == "before_norm":
      e = nn.Dense(c.hidden_size, use_bias=False, kernel_init=INIT, name="embed_proj")(e)
    e = layer_norm(c, "LayerNorm")(e)
    if c.mask_embeddings:
      e = e * mask[..., None].astype(e.dtype)
    e = nn.Dropout(c.hidden_dropout)(e, deterministic=deterministic)
    if c.embedding_projection == "after_dropout":
      e = nn.Dense(c.hidden_size, kernel_init=INIT, name="embed_proj")(e)
    return e
