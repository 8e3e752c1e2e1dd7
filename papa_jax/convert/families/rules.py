"""Parameter rules: `(flax_path, hf_key, transform)`, one per tensor of our tree, and the
builders the families share (BERT's embeddings and post-LayerNorm layers)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from papa_jax.models.config import EncoderConfig

Rule = tuple[tuple[str, ...], str, Callable[[np.ndarray], np.ndarray]]
LayerGroups = tuple[tuple[int, int], ...]
# (config, our attention path, the layer's key prefix) -> (the rules of its query, key and
# value, the key of its output projection, the key of its LayerNorm).
SelfAttention = Callable[[EncoderConfig, tuple[str, ...], str], tuple[list[Rule], str, str]]


def t(w):
  return np.ascontiguousarray(w.T)


def same(w):
  return w


def linear(path, key, bias=True) -> list[Rule]:
  rules = [(path + ("kernel",), key + ".weight", t)]
  if bias:
    rules.append((path + ("bias",), key + ".bias", same))
  return rules


def heads(path, key, h, d, bias=True) -> list[Rule]:
  """Linear [h*d, D] -> HeadProjection kernel [D, h, d], bias [h, d]."""
  rules = [(path + ("kernel",), key + ".weight",
            lambda w: t(w).reshape(w.shape[1], h, d))]
  if bias:
    rules.append((path + ("bias",), key + ".bias", lambda b: b.reshape(h, d)))
  return rules


def out(path, key, h, d) -> list[Rule]:
  return [
      (path + ("out_kernel",), key + ".weight",
       lambda w: t(w).reshape(h, d, w.shape[0])),
      (path + ("out_bias",), key + ".bias", same),
  ]


def ln(path, key, bias=True) -> list[Rule]:
  return [(path + ("scale",), key + ".weight", same)] + (
      [(path + ("bias",), key + ".bias", same)] if bias else [])


def embed(path, key) -> list[Rule]:
  return [(path + ("embedding",), key + ".weight", same)]


def embeddings(c: EncoderConfig, proj: str = "embeddings.embed_proj",
               proj_bias: bool = False) -> list[Rule]:
  """BERT's `embeddings.*` (positions and segments when `c` has them), the projection `proj`
  when `c` projects its embeddings, and the encoder-wide relative tables `c` has (DeBERTa's
  `rel_embeddings`, MPNet's bias)."""
  e = ("embeddings",)
  rules: list[Rule] = embed(e + ("word_embeddings",), "embeddings.word_embeddings")
  if c.position_biased_input:
    rules += embed(e + ("position_embeddings",), "embeddings.position_embeddings")
  if c.type_vocab_size > 0:
    rules += embed(e + ("token_type_embeddings",), "embeddings.token_type_embeddings")
  rules += ln(e + ("LayerNorm",), "embeddings.LayerNorm")
  if c.embedding_projection != "none":
    rules += linear(e + ("embed_proj",), proj, bias=proj_bias)
  if c.relative_attention:
    rules.append((("rel_embeddings",), "encoder.rel_embeddings.weight", same))
    if c.norm_rel_ebd:
      rules += ln(("rel_norm",), "encoder.LayerNorm")
  if c.relative_bias_buckets:  # nn.Embedding(buckets, heads): already [buckets, H].
    rules.append((("relative_bias",), "encoder.relative_attention_bias.weight", same))
  return rules


def bert_attention(c: EncoderConfig, a: tuple[str, ...], k: str) -> tuple[list[Rule], str, str]:
  """BERT's `attention.self.{query,key,value}`, `attention.output.{dense,LayerNorm}`."""
  h, d, s = c.num_heads, c.dim_per_head, k + "attention.self."
  rules = [r for n in ("query", "key", "value") for r in heads(a + (n,), s + n, h, d)]
  return rules, k + "attention.output.dense", k + "attention.output.LayerNorm"


def bert_layers(c: EncoderConfig, self_attention: SelfAttention = bert_attention) -> list[Rule]:
  """BERT's post-LayerNorm layers `encoder.layer.i.*`, their attention by `self_attention`."""
  h, d = c.num_heads, c.dim_per_head
  rules: list[Rule] = []
  for i in range(c.num_layers):
    p = (f"layer_{i}",)
    a = p + ("attention",)
    k = f"encoder.layer.{i}."
    attention, out_key, norm_key = self_attention(c, a, k)
    rules += attention
    rules += out(a, out_key, h, d)
    rules += ln(p + ("attention_norm",), norm_key)
    rules += linear(p + ("intermediate",), k + "intermediate.dense")
    rules += linear(p + ("output",), k + "output.dense")
    rules += ln(p + ("output_norm",), k + "output.LayerNorm")
  return rules


def fused_attention(c: EncoderConfig, a: tuple[str, ...], qkv: str, out_key: str) -> list[Rule]:
  """q, k, v from one fused `qkv` projection (rows q, k, v) and the output `out_key`, with
  biases when `c.attention_bias` (the rotary families)."""
  h, d, b = c.num_heads, c.dim_per_head, c.attention_bias
  hd = h * d
  rules = []
  for j, name in enumerate(("query", "key", "value")):
    rules.append((a + (name, "kernel"), qkv + ".weight",
                  lambda w, j=j: t(w[j * hd:(j + 1) * hd]).reshape(w.shape[1], h, d)))
    if b:
      rules.append((a + (name, "bias"), qkv + ".bias",
                    lambda x, j=j: x[j * hd:(j + 1) * hd].reshape(h, d)))
  rules.append((a + ("out_kernel",), out_key + ".weight",
                lambda w: t(w).reshape(h, d, w.shape[0])))
  if b:
    rules.append((a + ("out_bias",), out_key + ".bias", same))
  return rules
