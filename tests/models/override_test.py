"""Semantics of the attention override on the real MiniLM encoder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from papa_jax import attention as attn

SENTS = ["the movie was a gorgeous , witty , seductive thing .",
         "dull", "a film that proves its point a little too well"]


@pytest.fixture(scope="module")
def batch(minilm_tokenizer):
  enc = minilm_tokenizer(SENTS, padding="max_length", max_length=16,
                         truncation=True, return_tensors="np")
  return enc["input_ids"], enc["attention_mask"]


def _all_static(cfg):
  return np.ones((cfg.num_layers, cfg.num_heads), bool)


def test_override_own_attention_reproduces_outputs(minilm, batch):
  """Constants equal to one example's own attention leave its outputs unchanged."""
  ids, mask = batch
  ref = minilm.apply(ids[:1], mask[:1], capture_attention=True)
  constants = jnp.stack([a[0] for a in ref.attentions])  # [layers, H, L, L]
  ov = pj.AttentionOverride(constants=constants, static_heads=_all_static(minilm.config))
  for capture in (False, True):  # Fast path and explicit path.
    out = minilm.apply(ids[:1], mask[:1], override=ov, capture_attention=capture)
    m = mask[0].astype(bool)
    for a, b in zip(out.hidden_states, ref.hidden_states):
      np.testing.assert_allclose(np.asarray(a)[0, m], np.asarray(b)[0, m], atol=2e-5)


def test_override_no_static_heads_is_bitwise_stock(minilm, batch):
  ids, mask = batch
  ref = minilm.apply(ids, mask)
  ov = pj.AttentionOverride(constants=jnp.zeros((6, 12, 16, 16)),
                            static_heads=np.zeros((6, 12), bool))
  out = minilm.apply(ids, mask, override=ov)
  for a, b in zip(out.hidden_states, ref.hidden_states):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_override_fast_path_equals_explicit_for_mixed_heads(minilm, batch):
  ids, mask = batch
  cfg = minilm.config
  rng = np.random.default_rng(0)
  heads = rng.random((cfg.num_layers, cfg.num_heads)) < 0.5
  constants = jnp.asarray(rng.random((cfg.num_layers, cfg.num_heads, 16, 16)), jnp.float32)
  ov = pj.AttentionOverride(constants=constants, static_heads=heads)
  fast = minilm.apply(ids, mask, override=ov)
  explicit = minilm.apply(ids, mask, override=ov, capture_attention=True)
  m = mask.astype(bool)
  for a, b in zip(fast.hidden_states, explicit.hidden_states):
    np.testing.assert_allclose(np.asarray(a)[m], np.asarray(b)[m], atol=1e-5)
  # Padding never receives attention, from static or dynamic heads.
  for a in explicit.attentions:
    a = np.asarray(a)
    assert np.all(a[np.broadcast_to(~m[:, None, None, :], a.shape)] == 0)


def _np_layer_norm(x, p, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _np_constant_layer(x, mask, const, p, eps):
  """One BERT layer with every head's attention the masked constant, in numpy."""
  a = p["attention"]
  v = np.einsum("bld,dhk->bhlk", x, a["value"]["kernel"]) + a["value"]["bias"][None, :, None]
  m = mask.astype(np.float64)
  probs = const[None] * m[:, None, :, None] * m[:, None, None, :]
  probs = probs / np.maximum(np.abs(probs).sum(-1, keepdims=True), 1e-12)
  ctx = np.einsum("bhqk,bhkd->bhqd", probs, v)
  out = np.einsum("bhqd,hde->bqe", ctx, a["out_kernel"]) + a["out_bias"]
  h = _np_layer_norm(x + out, p["attention_norm"], eps)
  from scipy.special import erf
  f = h @ p["intermediate"]["kernel"] + p["intermediate"]["bias"]
  f = 0.5 * f * (1 + erf(f / np.sqrt(2)))
  f = f @ p["output"]["kernel"] + p["output"]["bias"]
  return _np_layer_norm(h + f, p["output_norm"], eps)


def test_override_all_static_content_enters_only_through_values(minilm, batch):
  ids, mask = batch
  cfg = minilm.config
  rng = np.random.default_rng(1)
  constants = rng.random((cfg.num_layers, cfg.num_heads, 16, 16)).astype(np.float32)
  ov = pj.AttentionOverride(constants=constants, static_heads=_all_static(cfg))
  p0 = jax.tree.map(np.asarray, minilm.params["layer_0"])
  other = np.where(mask == 1, rng.integers(1000, 20000, ids.shape), 0)
  other[:, 0], other[np.arange(3), mask.sum(1) - 1] = 101, 102
  outs = []
  for x_ids in (ids, other):
    out = minilm.apply(x_ids, mask, override=ov)
    emb = np.asarray(out.hidden_states[0], np.float64)
    want = _np_constant_layer(emb, mask, constants[0].astype(np.float64), p0, cfg.layer_norm_eps)
    m = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out.hidden_states[1])[m], want[m], atol=2e-5)
    outs.append(np.asarray(out.hidden_states[1]))
  assert not np.allclose(outs[0], outs[1], atol=1e-3)  # Content still matters via V.


def _flops(fn, *args):
  return jax.jit(fn).lower(*args).compile().cost_analysis()["flops"]


def test_override_all_static_skips_query_key_computation(minilm, batch):
  ids, mask = batch
  cfg = minilm.config
  b, l, d = ids.shape[0], ids.shape[1], cfg.hidden_size
  constants = jnp.ones((cfg.num_layers, cfg.num_heads, l, l)) / l
  ov = pj.AttentionOverride(constants=constants, static_heads=_all_static(cfg))
  def run(params, ov):
    return pj.Encoder(cfg).apply({"params": params}, ids, mask, override=ov).last_hidden_state
  dynamic = _flops(lambda p: run(p, None), minilm.params)
  static = _flops(run, minilm.params, ov)
  qk_proj = cfg.num_layers * 2 * (2 * b * l * d * d)  # Q and K projections.
  assert dynamic - static >= qk_proj, (dynamic, static, qk_proj)
  # No softmax: the all-static program has no exponentials.
  text = jax.jit(run).lower(minilm.params, ov).as_text()
  assert "exponential" not in text
  assert "exponential" in jax.jit(lambda p: run(p, None)).lower(minilm.params).as_text()


def test_override_gate_limits(minilm, batch):
  """Gate +inf is the stock model; gate -inf is all heads constant."""
  ids, mask = batch
  cfg = minilm.config
  rng = np.random.default_rng(2)
  constants = jnp.asarray(rng.random((cfg.num_layers, cfg.num_heads, 16, 16)), jnp.float32)
  m = mask.astype(bool)
  stock = minilm.apply(ids, mask).last_hidden_state
  static = minilm.apply(ids, mask, override=pj.AttentionOverride(
      constants=constants, static_heads=_all_static(cfg))).last_hidden_state
  for g, want in ((40.0, stock), (-40.0, static)):
    ov = pj.AttentionOverride(constants=constants, gate_logits=jnp.full((6, 12), g))
    got = minilm.apply(ids, mask, override=ov).last_hidden_state
    np.testing.assert_allclose(np.asarray(got)[m], np.asarray(want)[m], atol=1e-5)


def test_override_probs_fn_receives_layer_and_values(minilm, batch):
  ids, mask = batch
  seen = []

  def uniform_layer_2(probs, mask, *, layer, values):
    seen.append((layer, values.shape))
    if layer != 2:
      return probs
    return attn.mask_and_normalize(jnp.ones_like(probs), mask)

  out = minilm.apply(ids, mask, override=pj.AttentionOverride(probs_fn=uniform_layer_2),
                     capture_attention=True)
  assert [s[0] for s in seen] == list(range(6))
  assert seen[0][1] == (3, 12, 16, 32)
  a = np.asarray(out.attentions[2])
  n = mask.sum(1)
  for b in range(3):
    np.testing.assert_allclose(a[b, :, : n[b], : n[b]], 1.0 / n[b], rtol=1e-6)
