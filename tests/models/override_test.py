"""Semantics of the attention override on the real MiniLM encoder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from papa_jax import attention as attn
from papa_jax.measures import effective as eff
from tests import hf_oracle, testing

SENTS = ["the movie was a gorgeous , witty , seductive thing .",
         "dull", "a film that proves its point a little too well"]


@pytest.fixture(scope="module")
def batch(minilm_tokenizer):
  enc = minilm_tokenizer(SENTS, padding="max_length", max_length=16,
                         truncation=True, return_tensors="np")
  return enc["input_ids"], enc["attention_mask"]


def _all_static(cfg):
  return np.ones((cfg.num_layers, cfg.num_heads), bool)


@pytest.mark.integration
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


@pytest.mark.integration
def test_override_no_static_heads_is_bitwise_stock(minilm, batch):
  ids, mask = batch
  ref = minilm.apply(ids, mask)
  ov = pj.AttentionOverride(constants=jnp.zeros((6, 12, 16, 16)),
                            static_heads=np.zeros((6, 12), bool))
  out = minilm.apply(ids, mask, override=ov)
  for a, b in zip(out.hidden_states, ref.hidden_states):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.integration
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


def _np_constant_layer(x, mask, const, p, eps):
  """One BERT layer with every head's attention the masked constant, in numpy."""
  m = mask.astype(np.float64)
  probs = const[None] * m[:, None, :, None] * m[:, None, None, :]
  probs = probs / np.maximum(np.abs(probs).sum(-1, keepdims=True), 1e-12)
  return testing.np_bert_layer(x, probs, p, eps)


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
def test_override_transform_receives_layer_and_values(minilm, batch):
  ids, mask = batch
  seen = []

  def uniform_layer_2(probs, mask, *, layer, values):
    seen.append((layer, values.shape))
    if layer != 2:
      return probs
    return attn.mask_and_normalize(jnp.ones_like(probs), mask)

  out = minilm.apply(ids, mask, capture=pj.Capture(probs=True),
                     override=pj.AttentionOverride.intervene(pj.Transform(uniform_layer_2)))
  assert [s[0] for s in seen] == list(range(6))
  assert seen[0][1] == (3, 12, 16, 32)
  a = np.asarray(out.attentions[2])
  n = mask.sum(1)
  for b in range(3):
    np.testing.assert_allclose(a[b, :, : n[b], : n[b]], 1.0 / n[b], rtol=1e-6)


# Mixed static and dynamic heads, against oracles that share no override code.


@pytest.mark.unit
@pytest.mark.parametrize("arch", hf_oracle.ONE_PER_PATH)
def test_override_mixed_heads_with_own_attention_reproduce_every_family(random_hf, arch):
  """Constants = the model's own attention of one example, a random mixed head set:
  fast and explicit paths must give the un-overridden hidden states (at real tokens), on
  one family per attention code path."""
  model = random_hf(arch)[1]
  cfg = model.config
  ids, mask = hf_oracle.family_batch(cfg, seed=3)
  b = 3  # 25 real tokens of 40: the constants are this example's own attention.
  ref = model.apply(ids, mask, capture_attention=True)
  constants = jnp.stack([a[b] for a in ref.attentions])
  heads = np.random.default_rng(len(arch)).random((cfg.num_layers, cfg.num_heads)) < 0.5
  heads[0, 0], heads[0, -1] = True, False  # Both kinds in the first layer.
  ov = pj.AttentionOverride.constant(constants, heads)
  m = mask[b].astype(bool)
  for capture in (False, True):
    out = model.apply(ids, mask, override=ov, capture_attention=capture)
    for x, y in zip(out.hidden_states, ref.hidden_states):
      np.testing.assert_allclose(np.asarray(x)[b, m], np.asarray(y)[b, m], atol=3e-5,
                                 err_msg=f"{arch}, capture={capture}")


@pytest.mark.unit
@pytest.mark.parametrize("arch", hf_oracle.ONE_PER_PATH)
def test_effective_attention_keeps_outputs_on_every_family(random_hf, arch):
  """Every head replaced by its effective attention: outputs unchanged at real tokens,
  while a part of the long example's attention lies in the values' null space (one family
  per attention code path)."""
  model = random_hf(arch)[1]
  cfg = model.config
  ids, mask = hf_oracle.family_batch(cfg, seed=6)
  assert mask[0].sum() > cfg.dim_per_head >= mask[1].sum()
  ref = model.apply(ids, mask, capture_attention=True, capture_values=True)
  out = model.apply(ids, mask, override=pj.AttentionOverride.intervene(pj.EffectiveAttention()))
  m = mask.astype(bool)
  for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
    np.testing.assert_allclose(np.asarray(a)[m], np.asarray(b)[m], atol=2e-5, err_msg=arch)
  key_mask = np.broadcast_to(m[:, None, :], ref.attentions[0].shape[:-1])
  null = np.asarray(eff.null_attention(ref.attentions[0], ref.values[0], jnp.asarray(key_mask)))
  assert np.abs(null[0]).max() > 1e-3 and np.abs(null[1]).max() < 1e-5


@pytest.mark.integration
def test_override_mixed_heads_equal_a_numpy_layer(minilm, batch):
  """One BERT layer with a mixed static/dynamic head set, in float64 numpy."""
  ids, mask = batch
  cfg = minilm.config
  rng = np.random.default_rng(4)
  constants = rng.random((cfg.num_layers, cfg.num_heads, 16, 16)).astype(np.float32)
  static = np.zeros((cfg.num_layers, cfg.num_heads), bool)
  static[0, [1, 4, 5, 11]] = True
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), minilm.params["layer_0"])
  a = p["attention"]
  for capture in (False, True):
    out = minilm.apply(ids, mask, override=pj.AttentionOverride.constant(constants, static),
                       capture_attention=capture)
    x = np.asarray(out.hidden_states[0], np.float64)
    m = mask.astype(np.float64)
    probs = np.zeros((len(ids), cfg.num_heads, 16, 16))
    const = constants[0].astype(np.float64)[None] * m[:, None, :, None] * m[:, None, None, :]
    const /= np.maximum(np.abs(const).sum(-1, keepdims=True), 1e-12)
    dyn = [h for h in range(cfg.num_heads) if not static[0, h]]
    probs[:, static[0]] = const[:, static[0]]
    probs[:, dyn] = testing.np_softmax_probs(x, m, a, dyn, cfg.dim_per_head)
    want = testing.np_bert_layer(x, probs, p, cfg.layer_norm_eps)
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(out.hidden_states[1])[real], want[real], atol=3e-5)


@pytest.mark.integration
def test_override_new_constants_or_gates_do_not_recompile(minilm, batch):
  """The README's promise: constant matrices and gate values are traced data."""
  import chex
  ids, mask = batch
  cfg = minilm.config
  heads = np.zeros((cfg.num_layers, cfg.num_heads), bool)
  heads[:3] = True

  @jax.jit
  @chex.assert_max_traces(n=2)  # One program for static heads, one for gates.
  def run(params, ov):
    return pj.Encoder(cfg).apply({"params": params}, ids, mask, override=ov).last_hidden_state

  rng = np.random.default_rng(5)
  shape = (cfg.num_layers, cfg.num_heads, 16, 16)
  for _ in range(3):
    run(minilm.params, pj.AttentionOverride.constant(jnp.asarray(rng.random(shape)), heads))
  for _ in range(3):
    run(minilm.params, pj.AttentionOverride.gated(jnp.asarray(rng.random(shape)),
                                                  jnp.asarray(rng.normal(size=shape[:2]))))
  with pytest.raises(AssertionError, match="traced > 2 times"):  # A new head set does retrace.
    run(minilm.params, pj.AttentionOverride.constant(jnp.asarray(rng.random(shape)), ~heads))


@pytest.mark.integration
@pytest.mark.parametrize("static", [False, True])
def test_override_fused_attention_equals_the_explicit_path(minilm, batch, monkeypatch, static):
  """jax.nn.dot_product_attention (the accelerator path) = explicit softmax, same masking."""
  ids, mask = batch
  cfg = minilm.config
  ov = None
  if static:
    heads = np.random.default_rng(7).random((cfg.num_layers, cfg.num_heads)) < 0.5
    ov = pj.AttentionOverride.constant(
        jnp.asarray(np.random.default_rng(8).random((cfg.num_layers, cfg.num_heads, 16, 16)),
                    jnp.float32), heads)
  outs = {}
  for fused in ("0", "1"):
    monkeypatch.setenv("PAPA_FUSED_ATTENTION", fused)
    fn = jax.jit(lambda p, i, m, o: pj.Encoder(cfg).apply({"params": p}, i, m,
                                                           override=o).hidden_states)
    outs[fused] = fn(minilm.params, ids, mask, ov)
  text = jax.jit(lambda p: pj.Encoder(cfg).apply({"params": p}, ids, mask).hidden_states
                 ).lower(minilm.params).as_text()
  assert "exponential" in text  # Still attention, computed inside dot_product_attention.
  m = mask.astype(bool)
  for a, b in zip(outs["0"], outs["1"]):
    np.testing.assert_allclose(np.asarray(a)[m], np.asarray(b)[m], atol=1e-5)
  # A fully padded row (a padding example of a batch) stays finite on both paths.
  pad_ids, pad_mask = ids.copy(), mask.copy()
  pad_mask[1] = 0
  for fused in ("0", "1"):
    monkeypatch.setenv("PAPA_FUSED_ATTENTION", fused)
    out = pj.Encoder(cfg).apply({"params": minilm.params}, pad_ids, pad_mask, override=ov)
    assert np.all(np.isfinite(np.asarray(out.last_hidden_state)))
