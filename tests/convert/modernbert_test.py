"""ModernBERT and NomicBERT against Hugging Face PyTorch: rotary positions, the local window.

The generic parity, override and capture tests cover both through `hf_oracle.ARCHS`;
these add the window (no probability mass leaks outside |i - j| <= local_attention // 2,
for the model's own attention and for every PAPA constant, on the explicit and the fused
path), the rotation against HF's own functions, and the refused config variants. No real
checkpoint is reachable offline, so only tiny random models are tested.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from papa_jax import attention as attn
from papa_jax import errors
from papa_jax.convert import hf_config
from papa_jax.models import rotary
from papa_jax.papa import constants as papa_constants
from tests import hf_oracle

pytestmark = pytest.mark.unit

L = 24  # Longer than every window (radius 4), so the window bites.


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  pytest.importorskip("torch")
  path = tmp_path_factory.mktemp("modernbert")
  hf_oracle.save_random("modernbert", path)
  return path


@pytest.fixture(scope="module")
def model(tiny):
  return pj.load_pretrained(str(tiny))


@pytest.fixture(scope="module")
def batch(model):
  return hf_oracle.padded_batch(model.config.vocab_size, [L, 9], L, 0, seed=4)


def _outside(c, layer):
  return ~rotary.window(c, layer, L)


def _leak(a, c, layer, real):
  """Mass of real queries outside the window: `a [B, H, L, L]`, `real [B, L]`. (A padded
  query whose window holds no real key is uniform over every key, in HF as here.)"""
  sel = real[:, None, :, None] & _outside(c, layer)[None, None]
  return np.abs(np.where(np.broadcast_to(sel, a.shape), a, 0.0)).max()


def test_modernbert_flags_and_window_shape(model):
  c = model.config
  assert (c.norm_placement, c.mlp, c.final_norm, c.first_attention_norm) == (
      "pre", "gated", True, False)
  assert [c.is_local(l) for l in range(c.num_layers)] == [False, True, False, True]
  assert c.local_window == 4 and c.layer_theta(0) == 160_000.0 and c.layer_theta(1) == 10_000.0
  w = rotary.window(c, 1, 12)
  assert w[5, 1] and w[5, 9] and not w[5, 0] and not w[5, 10]  # |i - j| <= 4.
  assert rotary.window(c, 0, 12) is None
  assert "attention_norm" not in model.params["layer_0"]
  assert "attention_norm" in model.params["layer_1"]


def test_parity_modernbert_window_matches_hf_and_leaks_nothing(model, tiny, batch):
  """Real queries of local layers put exactly 0 outside their window, as HF does."""
  ids, mask = batch
  ours = model.apply(ids, mask, capture_attention=True)
  ref_h, ref_a = hf_oracle.run_hf(hf_oracle.load_hf(tiny), ids, mask)
  real = mask.astype(bool)
  for l, (a, r) in enumerate(zip(ours.attentions, ref_a, strict=True)):
    a = np.asarray(a)
    np.testing.assert_allclose(a[real.nonzero()[0], :, real.nonzero()[1]],
                               r[real.nonzero()[0], :, real.nonzero()[1]], atol=1e-5)
    if model.config.is_local(l):
      assert _leak(a, model.config, l, real) == 0.0
      assert _leak(r, model.config, l, real) == 0.0  # HF agrees.
    else:
      assert np.all(a[0, :, 0, :] > 0.0)
  np.testing.assert_allclose(np.asarray(ours.last_hidden_state)[real], ref_h[-1][real],
                             atol=2e-5)


def _constants(model, ids, mask):
  """A means-derived constant (the batch's mean attention, PAPA's per-cell mean) and the
  controls: uniform, and a dense positive matrix standing for the compressed fit."""
  c = model.config
  out = model.apply(ids, mask, capture_attention=True)
  pm = np.asarray(attn.pair_mask(jnp.asarray(mask.astype(bool))))[:, 0]  # [B, L, L]
  probs = np.stack([np.asarray(a) for a in out.attentions], 1)  # [B, layers, H, L, L]
  mean = (probs * pm[:, None, None]).sum(0) / np.maximum(pm.sum(0), 1)
  dense = np.random.default_rng(0).random((c.num_layers, c.num_heads, L, L)) + 0.1
  return dict(mean=mean, uniform=papa_constants.uniform(c.num_layers, c.num_heads, L),
              dense=dense)


@pytest.fixture(scope="module")
def explicit(model, batch):
  """The explicit path (probabilities captured, so the fused flag plays no part), jitted once
  for the module: one compile per head set, shared by both fused settings."""
  ids, mask = batch
  enc = pj.Encoder(model.config)
  return jax.jit(lambda p, o: enc.apply({"params": p}, ids, mask, override=o,
                                        capture_attention=True))


@pytest.fixture(scope="module")
def constants(model, batch):
  return _constants(model, *batch)


@pytest.mark.parametrize("fused", ["0", "1"])
def test_override_modernbert_constants_respect_the_window(model, batch, explicit, constants,
                                                           monkeypatch, fused):
  """Every constant on a local layer keeps its mass inside the window, renormalised over
  the example's real keys there; the fast (and fused) path gives the same outputs."""
  monkeypatch.setenv("PAPA_FUSED_ATTENTION", fused)
  c, (ids, mask) = model.config, batch
  real = mask.astype(bool)
  enc = pj.Encoder(c)
  fast_run = jax.jit(lambda p, o: enc.apply({"params": p}, ids, mask, override=o))
  heads = np.random.default_rng(1).random((c.num_layers, c.num_heads)) < 0.5
  heads[1, 0], heads[1, 1] = True, False  # A local layer has both kinds.
  # All heads static leaves nothing for the fused path: that case once, under "0".
  head_sets = (heads, np.ones_like(heads)) if fused == "0" else (heads,)
  for name, const in constants.items():
    for hs in head_sets:
      ov = pj.AttentionOverride.constant(jnp.asarray(const, jnp.float32), hs)
      full, fast = explicit(model.params, ov), fast_run(model.params, ov)
      for l in range(c.num_layers):
        a = np.asarray(full.attentions[l])
        static = hs[l]
        want = np.asarray(attn.constant_probs(
            jnp.asarray(const[l] * (~_outside(c, l) if c.is_local(l) else 1.0)),
            jnp.asarray(real)))
        np.testing.assert_allclose(a[:, static], want[:, static], atol=1e-6, err_msg=name)
        if c.is_local(l):
          assert _leak(a, c, l, real) == 0.0, (name, l)
          assert np.all(a[:, static][:, :, _outside(c, l)] == 0.0), (name, l)
        rows = a.sum(-1)[:, :, :][np.broadcast_to(real[:, None], a.shape[:3])]
        np.testing.assert_allclose(rows, 1.0, atol=1e-5)
      for x, y in zip(full.hidden_states, fast.hidden_states, strict=True):
        np.testing.assert_allclose(np.asarray(x)[real], np.asarray(y)[real], atol=3e-5)


def test_override_modernbert_gated_constants_respect_the_window(model, batch, explicit,
                                                               constants):
  """Gates mix a dense constant into every head of a local layer: still no mass outside."""
  c, real = model.config, batch[1].astype(bool)
  gated = pj.AttentionOverride.gated(jnp.asarray(constants["dense"], jnp.float32),
                                     jnp.full((c.num_layers, c.num_heads), -3.0))
  a = np.asarray(explicit(model.params, gated).attentions[1])
  assert _leak(a, c, 1, real) == 0.0


@pytest.mark.parametrize("fused", ["0", "1"])
def test_override_modernbert_fused_path_applies_rotary_and_window(model, batch, monkeypatch,
                                                                  fused):
  """jax.nn.dot_product_attention rotates and windows like the explicit softmax."""
  monkeypatch.setenv("PAPA_FUSED_ATTENTION", fused)
  ids, mask = batch
  enc = pj.Encoder(model.config)
  ref = model.apply(ids, mask, capture_attention=True)  # Explicit (probabilities kept).
  out = jax.jit(lambda p: enc.apply({"params": p}, ids, mask).hidden_states)(model.params)
  real = mask.astype(bool)
  for a, b in zip(out, ref.hidden_states, strict=True):
    np.testing.assert_allclose(np.asarray(a)[real], np.asarray(b)[real], atol=3e-5)


def test_parity_rotary_matches_hf_rotation():
  """Our rotation of random queries equals HF's apply_rotary_pos_emb with HF's cos/sin
  (to float32 rounding of torch's cos), for both families' conventions."""
  torch = pytest.importorskip("torch")
  import transformers as tr
  from transformers.models.nomic_bert import modeling_nomic_bert as hf_nomic
  cfg = tr.NomicBertConfig(**hf_oracle.COMMON)
  emb = hf_nomic.NomicBertRotaryEmbedding(cfg)
  x = np.random.default_rng(0).standard_normal((2, 30, 4, 16)).astype(np.float32)
  xt = torch.tensor(x).transpose(1, 2)
  cos, sin = emb(xt, torch.arange(30)[None])
  ref, _ = hf_nomic.apply_rotary_pos_emb(xt, xt, cos, sin)
  ours = rotary.rotate(jnp.asarray(x), 1000.0)
  np.testing.assert_allclose(np.asarray(ours), ref.transpose(1, 2).numpy(), atol=2e-6)
  # Scores depend on the offset only: shifting both positions leaves q . k unchanged.
  q = np.asarray(rotary.rotate(jnp.asarray(np.broadcast_to(x[:, :1], x.shape)), 1000.0))
  s = np.einsum("bhd,bhd->bh", q[:, 3], q[:, 7]) - np.einsum("bhd,bhd->bh", q[:, 13], q[:, 17])
  assert np.abs(s).max() < 1e-4


def test_parity_nomic_bert_flags(tmp_path):
  model = hf_oracle.converted_random("nomic_bert", tmp_path)
  c = model.config
  assert (c.norm_placement, c.mlp, c.attention_bias, c.mlp_bias, c.rotary_theta) == (
      "post", "gated", False, False, 1000.0)
  assert c.local_window == 0 and not c.position_biased_input and c.type_vocab_size == 2
  assert "out_bias" not in model.params["layer_0"]["attention"]


MB = dict(model_type="modernbert", vocab_size=50, hidden_size=16, num_hidden_layers=3,
          num_attention_heads=2, intermediate_size=24, max_position_embeddings=64)


@pytest.mark.parametrize("extra,match", [
    (dict(rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0}}),
     r"rope_parameters\['full_attention'\]\.rope_type='linear'"),
    (dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1.0,
                                                 "partial_rotary_factor": 0.5}}),
     r"partial_rotary_factor"),
    (dict(layer_types=["full_attention", "full_attention", "sliding_attention"]),
     r"layer_types=.*every n-th layer"),
    (dict(rope_scaling={"rope_type": "dynamic"}), r"rope_scaling"),
    (dict(head_dim=4), r"head_dim=4"),
    (dict(global_attn_every_n_layers=0), r"config\.json: global_attn_every_n_layers=0 must be "
     r"an integer >= 1 .*or give layer_types"),
    (dict(global_attn_every_n_layers=-2), r"global_attn_every_n_layers=-2"),
])
def test_invalid_modernbert_variants_are_named(extra, match):
  with pytest.raises(errors.ModelFileError, match=match):
    hf_config.encoder_config_from_hf({**MB, **extra})


def test_invalid_nomic_rope_type_is_named():
  cfg = {**MB, "model_type": "nomic_bert", "rope_parameters": {"rope_type": "yarn"}}
  with pytest.raises(ValueError, match=r"rope_parameters\.rope_type='yarn'"):
    hf_config.encoder_config_from_hf(cfg)
  with pytest.raises(ValueError, match=r"original remote-code format.*rotary_emb_fraction"):
    hf_config.encoder_config_from_hf({**cfg, "rotary_emb_fraction": 0.5})


def test_invalid_rotary_and_window_flags_are_named():
  base = dict(vocab_size=10, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=8,
              max_position_embeddings=8)
  for kw, match in ((dict(local_window=2, attention="disentangled"), "local_window need"),
                    (dict(rotary_theta=10.0, head_dim=3), "even head dimension"),
                    (dict(rotary_theta_local=10.0), "rotary_theta_local needs"),
                    (dict(norm_placement="middle"), "norm_placement"),
                    (dict(mlp="moe"), "mlp")):
    with pytest.raises(ValueError, match=match):
      pj.EncoderConfig(**base, **kw)


def test_modernbert_global_every_from_the_old_field():
  c = hf_config.encoder_config_from_hf({**MB, "global_attn_every_n_layers": 2,
                                        "local_attention": 10})
  assert (c.global_every, c.local_window) == (2, 5)
  assert hf_config.encoder_config_from_hf(
      {**MB, "layer_types": ["full_attention"] * 3}).local_window == 0


def test_existing_fingerprints_leave_the_new_flags_out():
  c = pj.EncoderConfig(vocab_size=10, hidden_size=8, num_layers=1, num_heads=2,
                       intermediate_size=8, max_position_embeddings=8)
  for key in ("norm_placement", "mlp", "final_norm", "rotary_theta", "local_window",
              "global_every", "attention_bias", "mlp_bias", "norm_bias"):
    assert key not in c.architecture_dict()
    assert key in c.replace(**{key: {"norm_placement": "pre", "mlp": "gated"}.get(
        key, 2 if key in ("local_window", "global_every") else
        (1.0 if key == "rotary_theta" else not getattr(c, key)))}).architecture_dict()


def test_mixing_refuses_pre_ln_layers(model):
  ids = np.ones((1, 6), np.int32)
  with pytest.raises(ValueError, match="norm_placement='pre'"):
    model.apply(ids, np.ones_like(ids), capture=pj.Capture(layer_norms=True))
  from papa_jax.measures import mixing
  with pytest.raises(ValueError, match=r"norm_placement='pre'"):
    mixing.check_decomposable(model.config)
  from types import SimpleNamespace as NS
  from papa_jax.analysis import mixing_stats
  from papa_jax.errors import ConfigError
  setup = NS(model=model, config=NS(mixing=NS(allow_low_precision=False, methods=("alti",),
                                              alti_chunk=4, vz_chunk=4, reference_quirks=False)))
  with pytest.raises(ConfigError, match=r"stage=mixing: .*norm_placement='pre'"):
    mixing_stats.Mixing.from_setup(setup)


def test_means_pass_of_local_heads_stays_in_the_window(model, batch):
  """PAPA's own means pass (raw and effective) on ModernBERT: raw means and row means of
  local heads are exactly 0 outside the window; every variant applied leaks nothing."""
  from papa_jax import parallel
  from papa_jax.papa import means as means_lib
  c, (ids, mask) = model.config, batch
  data = dict(input_ids=ids.astype(np.int32), attention_mask=mask.astype(np.int32),
              token_type_ids=np.zeros_like(ids, np.int32))
  mesh = parallel.make_mesh(1)
  real = mask.astype(bool)
  for variant in ("raw", "effective"):
    state = means_lib.accumulate(c, model.params, data, mesh, batch_size=2, attention=variant)
    avgs = state.averages()
    for l in range(c.num_layers):
      if c.is_local(l) and variant == "raw":
        assert np.all(avgs[l][:, _outside(c, l)] == 0.0)
        rm = papa_constants.row_mean(state.extras["row_sums"], state.extras["row_counts"])
        assert np.all(rm[l][:, _outside(c, l)] == 0.0)
    out = model.apply(ids, mask, capture_attention=True,
                      override=pj.AttentionOverride.constant(jnp.asarray(avgs, jnp.float32)))
    for l in range(c.num_layers):
      if c.is_local(l):
        assert _leak(np.asarray(out.attentions[l]), c, l, real) == 0.0, variant
