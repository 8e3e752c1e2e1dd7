"""Context-mixing measures against independent oracles (shared/spec/context_mixing.md §10)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

import papa_jax as pj
from papa_jax import convert
from papa_jax.measures import mixing
from tests import hf_oracle, testing
from tests.testing import require_shared

SENTS = ["the movie was a gorgeous , witty , seductive thing .", "dull .",
         "a film that proves its point a little too well , then keeps going"]


@pytest.fixture(scope="module")
def batch(minilm_tokenizer):
  enc = minilm_tokenizer(SENTS, padding="max_length", max_length=20, truncation=True,
                         return_tensors="np")
  return enc["input_ids"], enc["attention_mask"]


def _f64(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def _brute(model, ids, mask, l):
  """Every measure of layer l in float64 NumPy from the full [B, H, N, N, D] tensor."""
  c = model.config
  out = model.apply(ids, mask, capture=mixing.CAPTURE)
  lay, p = _f64(out.layers[l]), _f64(model.params[f"layer_{l}"])
  x = np.asarray(out.hidden_states[l], np.float64)
  m = mask.astype(np.float64)
  alpha = lay.probs * m[:, None, :, None] * m[:, None, None, :]
  zh = alpha[..., None] * lay.transformed_values[:, :, None, :, :]  # [B, H, N, N, D]
  z = zh.sum(1)
  eye = np.eye(x.shape[1])[None, :, :, None]
  res = z + eye * x[:, :, None, :]
  center = lambda w: w - w.mean(-1, keepdims=True)
  g1, g2 = p["attention_norm"]["scale"], p["output_norm"]["scale"]
  u = x + z.sum(2) + p["attention"]["out_bias"]
  s1 = np.sqrt(u.var(-1) + c.layer_norm_eps)
  ln = lambda w, q: center(w) / np.sqrt(w.var(-1, keepdims=True) + c.layer_norm_eps) * (
      q["scale"]) + q["bias"]

  def tail(w):
    h = ln(w, p["attention_norm"])
    f = h @ p["intermediate"]["kernel"] + p["intermediate"]["bias"]
    f = (0.5 * f * (1 + erf(f / np.sqrt(2)))) @ p["output"]["kernel"] + p["output"]["bias"]
    return ln(h + f, p["output_norm"]), h + f

  _, r = tail(u)
  s2 = np.sqrt(r.var(-1) + c.layer_norm_eps)
  pair = m[:, :, None] * m[:, None, :]
  k1res = g1 * center(res)
  t = k1res / s1[:, :, None, None]  # ALTI's T_i(x_j).
  y = (t * m[:, None, :, None]).sum(2) + g1 * center(p["attention"]["out_bias"]) / s1[..., None] \
      + p["attention_norm"]["bias"]
  contrib = np.maximum(np.abs(y).sum(-1)[:, :, None] - np.abs(y[:, :, None] - t).sum(-1), 0) * pair
  outs = {"head": np.linalg.norm(zh, axis=-1), "attn": np.linalg.norm(z, axis=-1) * pair,
          "attnres": np.linalg.norm(res, axis=-1) * pair,
          "attnresln": np.linalg.norm(k1res, axis=-1) / s1[:, :, None] * pair,
          "enc": np.linalg.norm(g2 * center(k1res), axis=-1) / (s1 * s2)[:, :, None] * pair,
          "alti": contrib / np.maximum(contrib.sum(-1, keepdims=True), 1e-300), "y": y,
          "h": lay.attention_norm_output}
  clean, _ = tail(u)
  unit = lambda w: w / np.linalg.norm(w, axis=-1, keepdims=True)
  vz = 1 - (unit(tail(u[:, :, None] - z)[0]) * unit(clean)[:, :, None]).sum(-1)
  vz = vz * pair
  outs["vz_raw"] = vz
  outs["vz"] = vz / np.maximum(vz.sum(-1, keepdims=True), 1e-300)
  off = z.sum(2) - np.einsum("biid->bid", z)
  diag = np.einsum("biid->bid", res)
  for kind, k in (("attn", lambda w: w), ("attnres", lambda w: w),
                  ("attnresln", lambda w: g1 * center(w))):
    d = np.einsum("biid->bid", z) if kind == "attn" else diag
    a, b = np.linalg.norm(k(off), axis=-1), np.linalg.norm(k(d), axis=-1)
    outs[f"ratio_{kind}"] = np.where(m > 0, a / np.where(m > 0, a + b, 1), 0.0)
  return outs, out


def _terms(model, out, mask, l):
  return mixing.layer_terms(out.layers[l], out.hidden_states[l], jnp.asarray(mask),
                            model.params[f"layer_{l}"])


@pytest.mark.integration
@pytest.mark.parametrize("l", [0, 4])
def test_mixing_every_measure_equals_float64_brute_force(minilm, batch, l):
  ids, mask = batch
  want, out = _brute(minilm, ids, mask, l)
  np.testing.assert_allclose(want["y"][mask > 0], want["h"][mask > 0], atol=1e-4)  # §2.2.
  t = _terms(minilm, out, mask, l)
  got = dict(head=mixing.head_norms(t), alti=mixing.alti(t, chunk=7),
             vz=mixing.value_zeroing(t, minilm.config, chunk=6),
             vz_raw=mixing.value_zeroing(t, minilm.config, normalize=False),
             **{k: mixing.summed_norms(t, k) for k in mixing.KINDS if k != "enc"},
             enc=mixing.summed_norms(t, "enc"),
             **{f"ratio_{k}": mixing.mixing_ratios(t, k) for k in ("attn", "attnres",
                                                                   "attnresln")})
  for k, v in got.items():
    v, w = np.asarray(v, np.float64), want[k]
    scale = np.abs(w).max(-1, keepdims=True) if w.ndim >= 3 else 1.0
    assert np.all(np.abs(v - w) <= 2e-5 * np.maximum(scale, 1e-12) + 1e-7), k
  pad = mask == 0  # Pad rows and columns exactly 0.
  for k in ("alti", "vz", "attnres", "enc"):
    v = np.asarray(got[k])
    assert np.all(v[pad] == 0) and np.all(v.transpose(0, 2, 1)[pad] == 0), k


@pytest.mark.unit
def test_mixing_hand_made_two_tokens():
  """§10 T4: one head, W_V = W_O = I, no biases, no LayerNorm, identity tail."""
  alpha = jnp.asarray([[[[0.75, 0.25], [0.5, 0.5]]]])
  x = jnp.asarray([[[1.0, 0.0], [0.0, 1.0]]])
  f = x[:, None]
  zsum = jnp.einsum("bhij,bhjd->bid", alpha, f)
  one = jnp.ones((1, 2))
  t = mixing.LayerTerms(alpha, f, x, zsum, x + zsum, one, one, one,
                        {"attention": {"out_bias": jnp.zeros(2)}}, ln=False)
  np.testing.assert_allclose(mixing.alti(t)[0], [[0.875, 0.125], [0.25, 0.75]], atol=1e-6)
  np.testing.assert_allclose(mixing.summed_norms(t, "attnres")[0], [[1.75, 0.25], [0.5, 1.5]],
                             atol=1e-6)
  np.testing.assert_allclose(mixing.mixing_ratios(t, "attnres")[0], [0.125, 0.25], atol=1e-6)
  np.testing.assert_allclose(mixing.value_zeroing(t, None, normalize=False)[0],
                             [[0.0053082, 0.0100505], [0.0513167, 0.0100505]], atol=1e-6)
  np.testing.assert_allclose(mixing.value_zeroing(t, None)[0],
                             [[0.345615, 0.654385], [0.836224, 0.163776]], atol=1e-5)
  second = jnp.asarray([[[0.2, 0.8], [0.6, 0.4]]])
  np.testing.assert_allclose(mixing.rollout([alpha[:, 0], second], one)[-1][0],
                             [[0.625, 0.375], [0.4375, 0.5625]], atol=1e-6)


@pytest.mark.integration
@pytest.mark.parametrize("fused", ["0", "1"])
def test_mixing_value_zeroing_equals_rerunning_the_layer(minilm, batch, monkeypatch, fused):
  """§10 T10: the tail form equals the layer re-run with token j's values zeroed (the
  ValueZeroing intervention, fused attention on and off); every layer's raw map is non-zero
  and the layers differ (the inseq#266 failure: identical scores in every layer)."""
  monkeypatch.setenv("PAPA_FUSED_ATTENTION", fused)
  ids, mask = batch
  out = minilm.apply(ids, mask, capture=mixing.CAPTURE)
  b, n, layers = 0, int(mask[0].sum()), []
  for l in range(minilm.config.num_layers):
    t = _terms(minilm, out, mask, l)
    fast = np.asarray(mixing.value_zeroing(t, minilm.config, normalize=False))[b, :n, :n]
    zero = np.repeat(ids[b:b + 1], n, 0), np.repeat(mask[b:b + 1], n, 0)
    rerun = minilm.apply(*zero, start_layer=l, start_hidden=jnp.repeat(
        out.hidden_states[l][b:b + 1], n, 0), override=pj.AttentionOverride.intervene(
            pj.ValueZeroing(np.full(n, l), np.arange(n))))
    clean = np.asarray(out.hidden_states[l + 1])[b, :n]
    slow = np.asarray(mixing.cosine_distance(jnp.asarray(rerun.hidden_states[1])[:, :n],
                                             jnp.asarray(clean)[None])).T  # [i, j]
    np.testing.assert_allclose(fast, slow, atol=2e-6, err_msg=f"layer {l}")
    layers.append(fast)
  assert _vz_sane(layers)
  # The inseq#266 mutant: zeroing a tensor the output never reads (here: the captured
  # probabilities' column j after the fact) leaves every output unchanged.
  assert not _vz_sane([np.zeros_like(a) for a in layers])


def _vz_sane(raw_layers) -> bool:
  """§10 T10 (c) and (d): every layer's raw map is non-zero, and the normalised maps differ
  between layers."""
  norm = [a / np.maximum(a.sum(-1, keepdims=True), 1e-30) for a in raw_layers]
  gaps = [np.linalg.norm(a - c) for i, a in enumerate(norm) for c in norm[i + 1:]]
  return all(a.max() > 1e-6 for a in raw_layers) and min(gaps) > 1e-3


@pytest.mark.unit
def test_mixing_padding_invariance_on_deberta():
  """§10 T7 on a pair-mask family: the valid block of a padded example equals the same
  example without padding, for every measure."""
  model = convert.load_pretrained(str(require_shared("fixtures", "tiny-random", "deberta-v2",
                                                     "DebertaV2Model")))
  rng = np.random.default_rng(0)
  ids = rng.integers(5, model.config.vocab_size, (1, 7)).astype(np.int32)
  padded, pmask = np.pad(ids, ((0, 0), (0, 5))), np.pad(np.ones((1, 7), np.int32), ((0, 0), (0, 5)))

  @jax.jit  # One compile per input shape (op-by-op, each op would compile apart).
  def maps(i, m):
    out = model.module.apply({"params": model.params}, i, m, capture=mixing.CAPTURE)
    return [[f[0, :7, :7] for f in (
        mixing.alti(t), mixing.value_zeroing(t, model.config), mixing.summed_norms(t, "enc"),
        mixing.summed_norms(t, "attnresln"))]
            for t in (_terms(model, out, m, l) for l in range(model.config.num_layers))]

  alone, in_padding = maps(ids, np.ones_like(ids)), maps(padded, pmask)
  assert len(alone) == model.config.num_layers
  for a, b in zip(jax.tree.leaves(alone), jax.tree.leaves(in_padding), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.integration
def test_mixing_rollout_equals_numpy_and_the_api_returns_every_map(minilm, batch):
  ids, mask = batch
  data = _encoded(ids, mask)
  maps = pj.context_mixing(minilm, data, methods=("attention", "alti"))
  m = mask.astype(np.float64)
  for b in range(len(ids)):
    v = m[b] > 0
    r = None
    for l in range(minilm.config.num_layers):
      a = np.asarray(maps["attention"][b, l], np.float64)[np.ix_(v, v)]
      a = 0.5 * a + 0.5 * np.eye(len(a))
      a = a / a.sum(-1, keepdims=True)
      r = a if r is None else a @ r
      np.testing.assert_allclose(np.asarray(maps["attention_rollout"][b, l])[np.ix_(v, v)], r,
                                 atol=1e-5)
    np.testing.assert_allclose(np.asarray(maps["alti"][b]).sum(-1)[:, v], 1.0, atol=1e-5)
  assert maps["alti_rollout"].shape == (3, 6, 20, 20)
  with pytest.raises(ValueError, match="Unknown context-mixing methods"):
    pj.context_mixing(minilm, data, methods=("rollout_magic",))


def _encoded(ids, mask):
  """Token ids and a mask as an `Encoded` split (labels unused)."""
  from papa_jax.data import preprocess
  return preprocess.Encoded(ids.astype(np.int32), mask.astype(np.int32),
                            np.zeros_like(ids, np.int32), np.zeros(len(ids), np.int32))


@pytest.mark.integration
def test_mixing_stage_8_devices_equal_1(minilm, batch):
  from papa_jax.analysis import mixing_stats
  ids, mask = batch
  arrays = _encoded(ids, mask).arrays()
  analysis = mixing_stats.Mixing(minilm.config, methods=("norms", "alti"))
  one, eight = (testing.analysis_means(analysis, minilm, arrays, devices=d, batch_size=8)
                for d in (1, 8))
  for k in one:
    np.testing.assert_allclose(eight[k], one[k], atol=2e-6, err_msg=k)
  assert one["count"] == 3 and one["norm_mass"].shape == (6, 12)
  np.testing.assert_allclose(one["head_share"].sum(-1), 1.0, atol=1e-5)


@pytest.fixture(scope="module", params=["bert", "distilbert"])
def tiny_pair(request, tmp_path_factory):
  """A tiny random Hugging Face model (PyTorch) with random biases and LayerNorm scales (HF
  initialises them to 0 and 1, which would hide every bias term) and the same weights
  converted."""
  import torch

  cls = {"bert": "BertModel", "distilbert": "DistilBertModel"}[request.param]
  hf = hf_oracle.load_hf(require_shared("fixtures", "tiny-random", request.param, cls))
  torch.manual_seed(0)
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  path = tmp_path_factory.mktemp(request.param)
  hf.save_pretrained(str(path))
  model = convert.load_pretrained(str(path))
  ids = np.random.default_rng(1).integers(5, model.config.vocab_size, 11)
  return hf, model, ids


def _row_close(got, want, rtol, name):
  """|got - want| <= rtol of each row's maximum (§3.4: norms are resolved relative to it)."""
  scale = np.maximum(np.abs(want).max(-1, keepdims=True), 1e-12)
  err = np.max(np.abs(np.asarray(got, np.float64) - want) / scale)
  assert err <= rtol, f"{name}: {err:.2e} of the row maximum"


@pytest.mark.integration  # Compiles the whole context-mixing API program per family.
def test_mixing_equals_pytorch_reference_procedures(tiny_pair):
  """§10 T8, T9, T10b: norms, GlobEnc (rollout unnormalised), ALTI (with and without the
  reference's quirks) and value zeroing against PyTorch re-implementations of the reference
  procedures (tests/mixing_reference.py) on a tiny random HF model, one unpadded sentence."""
  from tests import mixing_reference as ref
  hf, model, ids = tiny_pair
  data = _encoded(ids[None], np.ones((1, len(ids))))
  got = {k: v[0] for k, v in pj.context_mixing(model, data, batch_size=1).items()}
  want = ref.norms(hf, ids)
  for k in ("attn", "attnres", "attnresln"):
    _row_close(got[k], want[k], 1e-5, k)
  _row_close(got["globenc"], want["enc"], 1e-5, "N-Enc")
  _row_close(got["head_norms"], want["head"], 1e-5, "head_norms")
  _row_close(got["globenc_rollout"], want["globenc"], 1e-5, "globenc rollout")
  want_alti = ref.alti(hf, ids)
  _row_close(got["alti"], want_alti, 1e-4, "alti (exact)")
  out = model.apply(ids[None], np.ones((1, len(ids)), np.int32), capture=mixing.CAPTURE)
  mask = np.ones((1, len(ids)), np.float32)
  for l in range(model.config.num_layers):
    quirks = mixing.alti(_terms(model, out, mask, l), reference_quirks=True)[0]
    _row_close(quirks, want_alti[l], 3e-6, f"alti quirks layer {l}")  # float32 noise: 2e-6.
  # The random model's raw distances are ~1e-6, which float32 outputs resolve to ~1e-4 of
  # themselves (the float64 reference's row sums differ from ours by 4e-5 of the row max).
  _row_close(got["value_zeroing"], ref.value_zeroing(hf, ids), 1e-4, "value zeroing")


# One of each family whose layers the decomposition covers (post-LN; pre-LN is refused below),
# from the converter's registry (`papa_jax/convert/families`).
FAMILIES = hf_oracle.POST_LN


@pytest.mark.parametrize("family", [hf_oracle.by_path(f) for f in FAMILIES])
def test_mixing_decomposition_holds_on_every_family(family, random_hf):
  """§10 T1, T2 per family: the tail recomputed from u is the next hidden state, the ALTI /
  K21 summands plus the bias terms are the captured LN1 output, and the per-layer matrices
  are finite, zero on padding and row-stochastic."""
  model = random_hf(family)[1]
  ids, mask = hf_oracle.padded_batch(model.config.vocab_size, [9, 6], 9,
                                     model.config.pad_token_id, seed=2)

  @jax.jit  # One compile per family (op by op, each op would compile apart).
  def layers(ids, mask):
    out = model.module.apply({"params": model.params}, ids, mask, capture=mixing.CAPTURE)
    got = []
    for l in range(model.config.num_layers):
      t = _terms(model, out, mask, l)
      k, s1 = mixing.metric(t, "attnresln")
      summands = jnp.einsum("bhij,bhjd->bid", t.alpha, k(t.f)) + k(t.x)
      bias = (k(t.params["attention"].get("out_bias", jnp.zeros(t.x.shape[-1])))
              + t.params["attention_norm"]["bias"] * s1[..., None])
      got.append(dict(
          tail=mixing.layer_tail(model.config, t.params, t.u), next=out.hidden_states[l + 1],
          ln1=(summands + bias) / s1[..., None], captured_ln1=out.layers[l].attention_norm_output,
          alti=mixing.alti(t), value_zeroing=mixing.value_zeroing(t, model.config)))
    return got

  real = mask > 0
  pad_pair = ~(real[:, :, None] & real[:, None, :])
  for g in jax.tree.map(np.asarray, layers(ids, mask)):
    np.testing.assert_allclose(g["tail"][real], g["next"][real], atol=2e-5)
    np.testing.assert_allclose(g["ln1"][real], g["captured_ln1"][real], atol=2e-5)
    for c in (g["alti"], g["value_zeroing"]):
      assert np.isfinite(c).all() and np.all(c[pad_pair] == 0)
      np.testing.assert_allclose(c.sum(-1)[real], 1.0, atol=1e-5)


def _stochastic(rng, *shape):
  a = rng.random(shape) ** 3  # Peaked rows, so capacities bind.
  return a / a.sum(-1, keepdims=True)


@pytest.mark.unit
def test_attention_flow_equals_min_cuts():
  """§10 T11: one layer's flow is its matrix; two layers' flow is the min cut, which for
  this layered graph is `sum_k min(A2[i, k], A1[k, j])` (each middle node is cut on one
  side or the other); rows sum to 1; padding is absent."""
  from papa_jax.measures import attention_flow as af
  rng = np.random.default_rng(3)
  one = af.layer_matrices(_stochastic(rng, 1, 4, 4))
  np.testing.assert_allclose(af.flow(one), one[0], atol=4 * 2.0 ** -24)
  a1, a2 = af.layer_matrices(_stochastic(rng, 2, 3, 3))
  cut = np.minimum(a2[:, :, None], a1[None, :, :]).sum(1)
  np.testing.assert_allclose(af.flow(np.stack([a1, a2])), cut / cut.sum(-1, keepdims=True),
                             atol=1e-6)
  three = _stochastic(rng, 3, 5, 5)
  padded = np.zeros((3, 7, 7))
  padded[:, :5, :5] = three
  got = af.example_flow(padded, np.array([1] * 5 + [0] * 2))
  np.testing.assert_array_equal(got[5:], 0)
  np.testing.assert_array_equal(got[:, 5:], 0)
  np.testing.assert_allclose(got[:5, :5], af.flow(af.layer_matrices(three)), atol=0)
  np.testing.assert_allclose(got[:5].sum(-1), 1.0, atol=1e-9)


@pytest.mark.integration
def test_context_mixing_flow_route_and_guards(minilm, minilm_tokenizer, monkeypatch):
  """The API's flow on a short sentence equals the flow of its own attention maps; it warns
  above the token limit; a bfloat16 model is refused unless allowed."""
  import dataclasses

  from papa_jax.measures import attention_flow as af
  enc = minilm_tokenizer(["dull ."], padding="max_length", max_length=6, return_tensors="np")
  data = _encoded(enc["input_ids"], enc["attention_mask"])
  maps = pj.context_mixing(minilm, data, methods=("attention", "attention_flow"))
  n = int(enc["attention_mask"].sum())
  want = af.flow(af.layer_matrices(np.asarray(maps["attention"][0, :, :n, :n], np.float64)))
  np.testing.assert_allclose(maps["attention_flow"][0, :n, :n], want, atol=1e-6)
  assert set(pj.context_mixing(minilm, data, methods=("attention_flow",))) == {"attention_flow"}
  monkeypatch.setattr(af, "LIMIT", 3)
  with pytest.warns(UserWarning, match="max-flow solves"):
    pj.context_mixing(minilm, data, methods=("attention_flow",))
  low = dataclasses.replace(minilm, config=dataclasses.replace(minilm.config,
                                                               compute_dtype="bfloat16"))
  with pytest.raises(ValueError, match="float32"):
    pj.context_mixing(low, data, methods=("alti",))


@pytest.mark.unit
def test_mixing_invariances_under_reparametrisation():
  """§10 T5 on the tiny BERT: permuting heads consistently (Q, K, V, W_O blocks) permutes the
  per-head norms and leaves every head-summed measure unchanged; adding c to every entry of
  b_O changes nothing (LayerNorm centring removes it, and b_O is in no summand); scaling one
  head's W_O block by t scales its per-head norms by t."""
  import dataclasses
  model = convert.load_pretrained(str(require_shared("fixtures", "tiny-random", "bert",
                                                     "BertModel")))
  ids = np.random.default_rng(4).integers(5, model.config.vocab_size, (2, 9)).astype(np.int32)
  mask = np.array([[1] * 9, [1] * 7 + [0] * 2], np.int32)
  data = _encoded(ids, mask)
  methods = ("head_norms", "attnres", "attnresln", "globenc", "alti", "value_zeroing")

  def maps(params):
    return pj.context_mixing(dataclasses.replace(model, params=params), data, methods=methods,
                             rollout=False)

  def edit(fn, layers):
    p = jax.tree.map(np.array, model.params)
    for l in layers:
      fn(p[f"layer_{l}"]["attention"])
    return p

  base = maps(model.params)
  perm = np.array([2, 0, 3, 1])

  def permute(a):
    for k in ("query", "key", "value"):
      a[k]["kernel"], a[k]["bias"] = a[k]["kernel"][:, perm], a[k]["bias"][perm]
    a["out_kernel"] = a["out_kernel"][perm]

  def shift(a):
    a["out_bias"] = a["out_bias"] + 0.7

  def scale(a):
    a["out_kernel"][1] *= 3.0

  every = range(model.config.num_layers)
  for name, fn in (("permute", permute), ("shift", shift), ("scale", scale)):
    # Scaling changes the layer's output, so later layers see other inputs: layer 0 only.
    got = maps(edit(fn, [0] if name == "scale" else every))
    if name == "scale":
      got, base0 = got["head_norms"][:, :1], base["head_norms"][:, :1]
      np.testing.assert_allclose(got, base0 * np.array([1, 3, 1, 1])[None, None, :, None, None],
                                 rtol=1e-5, atol=1e-6, err_msg=name)
      continue
    for k in methods[1:]:
      np.testing.assert_allclose(got[k], base[k], atol=2e-5, err_msg=f"{name} {k}")
    want = base["head_norms"][:, :, perm] if name == "permute" else base["head_norms"]
    np.testing.assert_allclose(got["head_norms"], want, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.unit
def test_mixing_registry_is_the_config_and_the_api_computes_every_method():
  """The registry (papa_jax/measures/mixing_methods.py) is what the config lists and the stage and
  explorer read; `api.context_mixing` computes every registered method (and the rollouts
  it declares) on the tiny BERT, each map shaped, finite, 0 on padding and, where the
  record says so, row-stochastic."""
  from papa_jax.config import fields as config_fields, schema as config_schema
  from papa_jax.measures import mixing_methods as mm
  from papa_jax.analysis import mixing_stats
  from papa_jax.explorer import collect
  assert config_schema.EXPLORE_MIXING == tuple(mm.LABELS) == tuple(collect.MIXING_LABELS)
  assert all(not mm.METHODS[n.removesuffix(mm.ROLLOUT)].heads for n in mm.LABELS)
  # mixing.methods: the same names (its order is its default's, a results field).
  assert sorted(config_fields.MIXING_METHODS) == sorted(mm.STAGE_METHODS) == sorted(
      set(mixing_stats.METHODS))
  assert pj.api.MIXING == mm.NAMES and mixing_stats.RATIOS == mm.RATIOS
  for m in mm.METHODS.values():
    assert m.head_form in mixing_stats.PER_HEAD and m.head_form in mixing_stats.Mixing.infos
    assert m.cost and (m.label or m.heads) and (m.rollout_label or not m.rollout) and (
        m.residual is None or m.rollout) and (not m.ratio or m.name in mixing.KINDS), m.name
  model = convert.load_pretrained(str(require_shared("fixtures", "tiny-random", "bert",
                                                     "BertModel")))
  ids = np.random.default_rng(5).integers(5, model.config.vocab_size, (2, 7)).astype(np.int32)
  mask = np.array([[1] * 7, [1] * 5 + [0] * 2], np.int32)
  maps = pj.context_mixing(model, _encoded(ids, mask))  # Every method, rollouts on.
  rolled = {n + mm.ROLLOUT: m for n, m in mm.METHODS.items() if m.rollout}
  assert set(maps) == set(mm.METHODS) | set(rolled)
  layers, heads = model.config.num_layers, model.config.num_heads
  real = mask > 0
  pad_pair = ~(real[:, :, None] & real[:, None, :])
  for name, v in maps.items():
    m = mm.METHODS.get(name) or rolled[name]
    assert v.shape == (2, layers) + ((heads,) if m.heads else ()) + (7, 7), name
    assert np.isfinite(v).all() and v.max() > 0, name
    for b in range(2):
      assert np.all(v[b][..., pad_pair[b]] == 0), name
      if name in mm.METHODS:  # `normalized` says whether the stage must renormalise.
        assert np.allclose(v[b].sum(-1)[..., real[b]], 1.0, atol=1e-5) == m.normalized, name


@pytest.mark.unit
def test_mixing_refuses_layers_it_cannot_decompose(tmp_path):
  """Pre-LN layers (ModernBERT): the API and the tail form refuse by the model's property
  instead of returning a wrong number."""
  from tests import hf_oracle
  model = hf_oracle.converted_random("modernbert", tmp_path)
  match = r"modernbert has norm_placement='pre'"
  with pytest.raises(ValueError, match=match):
    pj.context_mixing(model, None)
  with pytest.raises(ValueError, match=match):
    mixing.layer_tail(model.config, model.params["layer_1"], jnp.zeros((1, 2, 64)))
