"""Flax encoders: BERT, RoBERTa, ELECTRA, DistilBERT, DeBERTa, MPNet, NomicBERT, ModernBERT.

One transformer stack serves every family; the families differ in their
embeddings, norm placement (post- or pre-LayerNorm), MLP (dense or gated), and
how attention scores are formed (dot product, with or without a shared
relative-position bias, rotary positions or a local window, or DeBERTa's
disentangled content/position terms), each a named flag of `EncoderConfig`. What an
`AttentionOverride` does is `attention.attend`'s; what a layer returns besides
its output is `capture.Capture`'s.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from papa_jax import attention as attn
from papa_jax.models import deberta, relative_bias, rotary
from papa_jax.models.blocks import (  # noqa: F401 (DTYPES, activation: re-exported)
    DTYPES, INIT, Embeddings, activation, cast, compute_dtype, layer_norm, mlp, norm_scale, widen)
from papa_jax.models.capture import Capture, EncoderOutput, LayerIntermediates  # Re-exported.
from papa_jax.models.config import EncoderConfig

Array = jax.Array

class HeadProjection(nn.Module):
  """`x @ W + b` split into heads: kernel `[D, H, d]`, bias `[H, d]`."""

  num_heads: int
  head_dim: int
  use_bias: bool = True
  dtype: jnp.dtype | None = None

  @nn.compact
  def __call__(self, x: Array, heads: tuple[int, ...] | None = None) -> Array:
    kernel = self.param(
        "kernel", INIT, (x.shape[-1], self.num_heads, self.head_dim)
    )
    bias = (
        self.param("bias", nn.initializers.zeros, (self.num_heads, self.head_dim))
        if self.use_bias
        else None
    )
    if heads is not None and heads != tuple(range(self.num_heads)):
      idx = np.asarray(heads, dtype=np.int32)
      kernel = kernel[:, idx]
      bias = None if bias is None else bias[idx]
    y = jnp.einsum("...d,dhk->...hk", cast(x, self.dtype), cast(kernel, self.dtype))
    return y if bias is None else y + cast(bias, self.dtype)


class SelfAttention(nn.Module):
  """Multi-head self-attention: projections, family scores, output projection.

  What an override does to the probabilities is `attention.attend`'s business.
  Returns `(output [B, L, D], captured)`: a dict of the `Capture` fields asked for.
  """

  config: EncoderConfig
  layer_index: int

  def setup(self):
    c = self.config
    h, d, dt, b = c.num_heads, c.dim_per_head, compute_dtype(c), c.attention_bias
    self.query = HeadProjection(h, d, use_bias=b, dtype=dt)
    self.key = HeadProjection(h, d, use_bias=b and c.key_bias, dtype=dt)
    self.value = HeadProjection(h, d, use_bias=b, dtype=dt)
    self.out_kernel = self.param("out_kernel", INIT, (h, d, c.hidden_size))
    if b:
      self.out_bias = self.param("out_bias", nn.initializers.zeros, (c.hidden_size,))
    if c.relative_attention and not c.share_att_key:
      if "c2p" in c.pos_att_type:
        self.pos_key = HeadProjection(h, d, use_bias=c.key_bias, dtype=dt)
      if "p2c" in c.pos_att_type:
        self.pos_query = HeadProjection(h, d, use_bias=True, dtype=dt)
    self.attn_dropout = nn.Dropout(c.attention_dropout)
    self.pos_dropout = nn.Dropout(c.hidden_dropout)

  def _qkv(self, x: Array) -> tuple[Array, Array, Array]:
    """Queries, keys and values of every head from one matmul (`[B, L, H, d]` each).

    One [D, 3 H d] product uses the CPU GEMM better than three [D, H d] ones
    (benchmarks/RESULTS.md) and gives the same numbers.
    """
    c, dt = self.config, compute_dtype(self.config)
    h, d = c.num_heads, c.dim_per_head
    params = [m.variables["params"] for m in (self.query, self.key, self.value)]
    kernel = jnp.concatenate([p["kernel"] for p in params], axis=1)
    bias = jnp.concatenate([p.get("bias", jnp.zeros((h, d), kernel.dtype)) for p in params])
    y = jnp.einsum("...d,dhk->...hk", cast(x, dt), cast(kernel, dt)) + cast(bias, dt)
    return y[:, :, :h], y[:, :, h:2 * h], y[:, :, 2 * h:]

  def _rotated(self, q: Array, k: Array) -> tuple[Array, Array]:
    """Queries and keys rotated by their positions when the layer has rotary ones."""
    theta = self.config.layer_theta(self.layer_index)
    return (rotary.rotate(q, theta), rotary.rotate(k, theta)) if theta else (q, k)

  def _window(self, seq_len: int) -> np.ndarray | None:
    return rotary.window(self.config, self.layer_index, seq_len)

  def _dynamic_probs(self, x: Array, mask: Array, rel_embeddings: Array | None,
                     bias: Array | None, qk: tuple[Array, Array] | None,
                     heads: tuple[int, ...]) -> Array:
    """Softmax attention `[B, len(heads), L, L]` computed for `heads` only.

    `bias`: every head's relative-position bias `[H, L, L]`, or None.
    `qk`: every head's queries and keys when already computed (`_qkv`).
    """
    c = self.config
    if qk is not None and heads == tuple(range(c.num_heads)):
      q, k = qk
    else:
      q, k = self.query(x, heads), self.key(x, heads)
    if c.attention == "dot":
      q, k = self._rotated(q, k)
      scores = widen(jnp.einsum("bqhd,bkhd->bhqk", q, k) * (c.dim_per_head**-0.5))
      if bias is not None:
        scores = scores + _head_rows(bias, heads)
      return attn.softmax_with_key_mask(scores, mask, self._window(x.shape[1]))
    pos_q = pos_k = None
    if c.relative_attention:
      if c.share_att_key:
        pos_q = self.query(rel_embeddings, heads)
        pos_k = self.key(rel_embeddings, heads)
      else:
        if "p2c" in c.pos_att_type:
          pos_q = self.pos_query(rel_embeddings, heads)
        if "c2p" in c.pos_att_type:
          pos_k = self.pos_key(rel_embeddings, heads)
    scores = deberta.disentangled_scores(c, q, k, pos_q, pos_k)
    return attn.softmax_with_pair_mask(widen(scores), mask)

  def _fused_context(self, x: Array, mask: Array, bias: Array | None, heads: tuple[int, ...],
                     v: Array) -> Array:
    """Dot-product attention of `heads` without materialised probabilities."""
    q, k = self._rotated(self.query(x, heads), self.key(x, heads))
    if bias is not None:
      bias = _head_rows(bias, heads)[None].astype(q.dtype)
    keep, window = mask[:, None, None, :], self._window(x.shape[1])
    return jax.nn.dot_product_attention(q, k, v.astype(q.dtype), bias=bias,
                                        mask=keep if window is None else keep & window,
                                        scale=self.config.dim_per_head**-0.5)

  def __call__(
      self,
      x: Array,
      mask: Array,
      override: attn.LayerOverride | None,
      rel_embeddings: Array | None,
      bias: Array | None,
      *,
      deterministic: bool,
      capture: Capture,
  ) -> tuple[Array, dict[str, Array]]:
    c = self.config
    if rel_embeddings is not None:  # DeBERTa's per-layer pos_dropout.
      rel_embeddings = self.pos_dropout(rel_embeddings, deterministic=deterministic)
    qk = None
    if (override is None or not override.static) and not self.is_initializing():
      q, k, v = self._qkv(x)  # Every head is dynamic: one matmul.
      qk = (q, k)
    else:
      v = self.value(x)  # [B, L, H, d]: contexts stay in this layout (no transposes).
    window = self._window(x.shape[1])
    if window is not None and override is not None and override.constants is not None:
      # A local layer's constants keep no mass outside its window (rotary.window).
      override = dataclasses.replace(
          override, constants=override.constants * jnp.asarray(window, override.constants.dtype))
    dropout = None
    if not (deterministic or c.attention_dropout == 0.0):
      dropout = functools.partial(self.attn_dropout, deterministic=False)
    fused = (functools.partial(self._fused_context, x, mask, bias) if c.attention == "dot"
             else None)
    context, probs, v = attn.attend(
        override, functools.partial(self._dynamic_probs, x, mask, rel_embeddings, bias, qk), v,
        mask, capture=capture.probs, dropout=dropout, fused_context=fused)
    dt = compute_dtype(c)
    out = jnp.einsum("bqhd,hde->bqe", cast(context, dt), cast(self.out_kernel, dt))
    out = widen(out + cast(self.out_bias, dt) if c.attention_bias else out)
    if override is not None:
      out = override.apply("attention_output", out, mask)
    kept = dict(probs=probs, values=jnp.swapaxes(v, 1, 2))
    if capture.context:
      kept["context"] = jnp.swapaxes(context, 1, 2)
    if capture.transformed_values:
      kept["transformed_values"] = widen(jnp.einsum("bkhd,hde->bhke", cast(v, dt),
                                                     cast(self.out_kernel, dt)))
    if capture.head_outputs:
      kept["head_outputs"] = widen(jnp.einsum("bqhd,hde->bhqe", cast(context, dt),
                                               cast(self.out_kernel, dt)))
    kept["attention_output"] = out
    return out, {k: v for k, v in kept.items() if getattr(capture, k)}


def _head_rows(x: Array, heads: tuple[int, ...]) -> Array:
  """`x[heads]` (x itself when `heads` are all of its rows, in order)."""
  if heads == tuple(range(x.shape[0])):
    return x
  return x[np.asarray(heads, dtype=np.int32)]


class TransformerLayer(nn.Module):
  """A block: attention, residual, MLP, residual; LayerNorms after the residual sums
  ("post") or before each branch ("pre": `x + attn(LN(x))`, `h + mlp(LN(h))`)."""

  config: EncoderConfig
  layer_index: int

  @nn.compact
  def __call__(self, x, mask, override, rel_embeddings, bias, *, deterministic,
               capture: Capture):
    c = self.config
    drop = nn.Dropout(c.hidden_dropout)
    pre = c.norm_placement == "pre"
    if pre and capture.layer_norms:
      raise ValueError("Capture(layer_norms=True) records post-LayerNorm sums; this model "
                       "has norm_placement='pre' (e.g. ModernBERT).")  # caller's argument
    site = (lambda name, v: override.apply(name, v, mask)) if override is not None else (
        lambda name, v: v)
    a_in = x
    if pre and (self.layer_index or c.first_attention_norm):
      a_in = layer_norm(c, "attention_norm")(x)
    a, kept = SelfAttention(c, self.layer_index, name="attention")(
        a_in, mask, override, rel_embeddings, bias,
        deterministic=deterministic, capture=capture,
    )
    u = x + drop(a, deterministic=deterministic)
    if pre:
      f = site("mlp_output", mlp(c, layer_norm(c, "mlp_norm")(u)))
      out = site("residual_out", u + drop(f, deterministic=deterministic))
    else:
      h = layer_norm(c, "attention_norm")(u)
      f = site("mlp_output", mlp(c, h))
      r = h + drop(f, deterministic=deterministic)
      out = site("residual_out", layer_norm(c, "output_norm")(r))
      if capture.layer_norms:
        kept.update(attention_norm_input=u, attention_norm_output=h, output_norm_input=r,
                    attention_norm_scale=norm_scale(u, c.layer_norm_eps),
                    output_norm_scale=norm_scale(r, c.layer_norm_eps))
    kept.update({k: v for k, v in dict(mlp_output=f, residual_in=x, residual_out=out).items()
                 if getattr(capture, k)})
    return out, LayerIntermediates(**kept)


class Encoder(nn.Module):
  """A pretrained encoder returning every layer's hidden states.

  Call with `input_ids [B, L]` and `attention_mask [B, L]`; pass
  `override=AttentionOverride(...)` to replace attention probabilities or
  intervene, and `capture=Capture(...)` for per-layer intermediates
  (`capture_attention=True` and `capture_values=True` are shorthands for
  `Capture(probs=True)` and `Capture(values=True)`).
  """

  config: EncoderConfig

  @nn.compact
  def __call__(
      self,
      input_ids: Array,
      attention_mask: Array | None = None,
      token_type_ids: Array | None = None,
      position_ids: Array | None = None,
      *,
      override: attn.AttentionOverride | None = None,
      deterministic: bool = True,
      capture: Capture | None = None,
      capture_attention: bool = False,
      capture_values: bool = False,
      start_layer: int = 0,
      start_hidden: Array | None = None,
  ) -> EncoderOutput:
    """See the class docstring; `start_layer` > 0 skips the embeddings and the
    first layers: `start_hidden [B, L, D]` is that layer's input (the earlier
    hidden states, e.g. cached), and the outputs cover layers from there on."""
    c = self.config
    if input_ids.ndim != 2:
      raise ValueError(  # caller's argument
          f"input_ids must be [batch, length], got {input_ids.shape}.")
    seq_len = input_ids.shape[1]
    if seq_len > c.max_length:
      raise ValueError(f"Input length {seq_len} exceeds this model's maximum of {c.max_length} "
                       f"positions (max_position_embeddings={c.max_position_embeddings})."
                       )  # caller's argument
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
      raise ValueError(f"attention_mask shape {attention_mask.shape} does not match "
                       f"input_ids shape {input_ids.shape}.")  # caller's argument
    mask = attention_mask.astype(bool)
    capture = dataclasses.replace(capture or Capture(),
                                  probs=(capture and capture.probs) or capture_attention,
                                  values=(capture and capture.values) or capture_values)
    if override is not None:
      override.validate(c.num_layers, c.num_heads, seq_len, input_ids.shape[0])

    if start_layer:
      if start_hidden is None:
        raise ValueError("start_layer > 0 needs start_hidden, that layer's input."
                         )  # caller's argument
      h = start_hidden
    else:
      h = Embeddings(c, name="embeddings")(
          input_ids, mask, token_type_ids, position_ids, deterministic=deterministic
      )
    rel = None
    if c.relative_attention:
      rel = self.param("rel_embeddings", INIT,
                       (deberta.rel_embedding_rows(c), c.hidden_size))
      if c.norm_rel_ebd:
        rel = layer_norm(c, "rel_norm")(rel)
      rel = deberta.sliced_rel_embeddings(c, rel, seq_len)
    bias = None
    if c.relative_bias_buckets:  # Looked up once, shared by every layer.
      table = self.param("relative_bias", INIT, (c.relative_bias_buckets, c.num_heads))
      bias = relative_bias.relative_bias(c, table, seq_len)
    hidden, layers = [h], []
    for i in range(start_layer, c.num_layers):
      lo = override.for_layer(i) if override is not None else None
      if lo is not None:  # The residual stream entering layer i, as hidden_states[i] says.
        h = hidden[-1] = lo.apply("residual_in", h, mask)
      h, kept = TransformerLayer(c, i, name=f"layer_{i}")(
          h, mask, lo, rel, bias, deterministic=deterministic, capture=capture
      )
      hidden.append(h)
      layers.append(kept)
    if c.final_norm:  # The last hidden state is normalised, as HF's last_hidden_state.
      hidden[-1] = layer_norm(c, "final_norm")(h)
    return EncoderOutput(hidden_states=tuple(hidden),
                         layers=tuple(layers) if capture != Capture() else None)


def run_from(module: Encoder, params, batch: dict, earlier, override, layer: int
             ) -> EncoderOutput:
  """The encoder under `override` from `layer` on, started from `earlier[layer]`: `earlier`
  holds the states entering layers 0..layer of a run that `override` leaves alone there
  (cached), so they are never recomputed, and the output's hidden states are `earlier[:layer]`
  followed by the new ones (at layer 0 the embeddings run as usual)."""
  out = module.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                     batch.get("token_type_ids"), override=override, start_layer=layer,
                     start_hidden=earlier[layer] if layer else None)
  return EncoderOutput(hidden_states=tuple(earlier[i] for i in range(layer))
                       + tuple(out.hidden_states))


def init_params(config: EncoderConfig, seed: int = 0, seq_len: int = 8):
  """Randomly initialised parameters (for tests and random-weight benchmarks)."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  return Encoder(config).init(jax.random.key(seed), ids)["params"]
