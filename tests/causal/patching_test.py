"""Activation patching at every layer site against Hugging Face PyTorch with forward hooks
(float64), a sweep against a loop over its targets, and attribution patching against
finite differences."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from papa_jax import parallel
from papa_jax.causal import metrics, patching
from tests import hf_oracle

L, LENGTHS = 12, (12, 9, 8)
# Where each site is in a Hugging Face layer: (module path under the layer, hook kind).
# "out": the module's output; "in": its first input. BERT's SelfOutput/Output dense layers
# are the projections before dropout and the residual LayerNorm; ModernBERT's Wo likewise.
def _hf_map(layers: str, out_proj: str, mlp_out: str) -> dict:
  return dict(layers=layers, residual_in=("", "in"), residual_out=("", "out"),
              attention_output=(out_proj, "out"), context=(out_proj, "in"),
              mlp_output=(mlp_out, "out"))


BERT_LIKE = _hf_map("encoder.layer", "attention.output.dense", "output.dense")
HF_SITES = {
    "bert": BERT_LIKE, "roberta": BERT_LIKE, "electra": BERT_LIKE, "deberta": BERT_LIKE,
    "deberta-v3": BERT_LIKE,
    "distilbert": _hf_map("transformer.layer", "attention.out_lin", "ffn.lin2"),
    "mpnet": _hf_map("encoder.layer", "attention.attn.o", "output.dense"),
    "modernbert": _hf_map("layers", "attn.Wo", "mlp.Wo"),
    "nomic_bert": _hf_map("layers", "self_attn.o_proj", "mlp.down_proj"),
}
# ALBERT is left out: its layers share one module, so a hook cannot tell them apart.
LAYER_SITES = ("residual_in", "attention_output", "context", "mlp_output", "residual_out")


def _pair(config, seed=0):
  """Two batches of equal lengths (12, 9, 8): the source (clean) and target (corrupt) runs.
  (Every padded row keeps a real key within ModernBERT's local window: HF's eager attention
  gives NaN for a row without one, which its next layer spreads to the real tokens.)"""
  ids, mask = hf_oracle.padded_batch(config.vocab_size, LENGTHS, L, config.pad_token_id, seed)
  other, _ = hf_oracle.padded_batch(config.vocab_size, LENGTHS, L, config.pad_token_id, seed + 1)
  return ids, other, mask


def _hf_patched(model, family, site, ids, mask, source, targets):
  """HF's hidden states of `ids` with `source[layer][b]` (the site's layout) written in by a
  forward hook where each example's target says."""
  import torch  # pylint: disable=import-outside-toplevel
  spec = HF_SITES[family]
  name, kind = spec[site]
  layers = model.get_submodule(spec["layers"])
  hooks = []
  for l in range(len(layers)):
    mod = layers[l].get_submodule(name) if name else layers[l]

    def put(x, l=l):
      shape = x.shape
      x = x.clone()
      if site == "context":  # [B, L, H * d] -> [B, L, H, d]
        x = x.reshape(shape[:2] + source.shape[-2:])
      for b, (tl, tp, th) in enumerate(zip(*targets)):
        if tl != l:
          continue
        pos = slice(None) if tp < 0 else slice(tp, tp + 1)
        head = slice(None) if th < 0 else slice(th, th + 1)
        src = torch.tensor(np.asarray(source[l, b]))
        if site == "context":
          x[b, pos, head] = src[pos, head]
        else:
          x[b, pos] = src[pos]
      return x.reshape(shape)

    if kind == "in":
      hooks.append(mod.register_forward_pre_hook(
          lambda m, args, kwargs, put=put: ((put(args[0]),) + args[1:], kwargs),
          with_kwargs=True))
    else:
      hooks.append(mod.register_forward_hook(
          lambda m, args, out, put=put: (put(out[0]),) + tuple(out[1:])
          if isinstance(out, tuple) else put(out)))
  try:
    with torch.no_grad():
      out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    return out.last_hidden_state.numpy()
  finally:
    for h in hooks:
      h.remove()


@pytest.mark.unit
@pytest.mark.parametrize("family", hf_oracle.LAYOUTS)
@pytest.mark.parametrize("site", LAYER_SITES)
def test_patch_at_every_layer_site_equals_hf_with_forward_hooks(family, site, random_hf):
  """The clean run's activation patched into the corrupt one: example 0 at layer 1, position 3
  (head 2 where the site has heads), example 1 at layer 0 everywhere, example 2 nowhere; the
  last hidden state equals HF's with hooks doing the same, in float64, at real tokens;
  example 2 equals the unpatched run, and patching changed examples 0 and 1. The sites are in
  the one stack's code, which branches on the layer layout: a post-LN and a pre-LN family
  here, every other family (but ALBERT) in the integration tier."""
  _check_patch_against_hf(family, site, *random_hf(family))


@pytest.mark.integration
@pytest.mark.parametrize("family", [f for f in HF_SITES if f not in hf_oracle.LAYOUTS])
def test_patch_at_every_layer_site_equals_hf_on_every_family(family, random_hf):
  for site in LAYER_SITES:
    _check_patch_against_hf(family, site, *random_hf(family))


def _check_patch_against_hf(family, site, path, model):
  c = model.config
  assert family in HF_SITES, f"no HF hook map for {family}"
  clean, corrupt, mask = _pair(c)
  targets = ([1, 0, -1], [3, -1, -1], [2, -1, -1])
  hf = hf_oracle.load_hf(path, "float64")
  with jax.enable_x64(True):
    m64 = pj.Pretrained(c, jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), model.params),
                        model.model_dir)
    source = patching.activations(m64, dict(input_ids=clean, attention_mask=mask), site)
    rows = source[np.maximum(targets[0], 0), np.arange(3)]
    out = m64.apply(corrupt, mask, override=pj.AttentionOverride.intervene(
        pj.Patch(rows, *targets, site=site)))
    plain = m64.apply(corrupt, mask)
    source = np.asarray(source)
  want = _hf_patched(hf, family, site, corrupt, mask, source, targets)
  real = mask.astype(bool)
  last, stock = np.asarray(out.hidden_states[-1]), np.asarray(plain.hidden_states[-1])
  # HF's DeBERTa keeps some terms in float32 even in a float64 model: the unpatched gap.
  gap = np.abs(stock - _hf_patched(hf, family, site, corrupt, mask, source, ([-1] * 3,) * 3))
  np.testing.assert_allclose(last[real], want[real], atol=1e-9 + 10 * gap[real].max())
  last, stock = np.asarray(out.hidden_states[-1]), np.asarray(plain.hidden_states[-1])
  np.testing.assert_array_equal(last[2], stock[2])
  for b in (0, 1):
    assert np.abs(last[b] - stock[b])[real[b]].max() > 1e-3, (site, b)


W = np.random.default_rng(7).normal(size=64)


def _cls_metric(out, batch):
  """A probe-like readout: the last layer's first token against a fixed direction."""
  del batch
  return out.hidden_states[-1][:, 0] @ jnp.asarray(W, out.hidden_states[-1].dtype)


def _batch(ids, mask):
  return dict(input_ids=np.asarray(ids, np.int32), attention_mask=np.asarray(mask, np.int32))


@pytest.mark.unit
def test_patch_at_probs_and_values_equals_the_ablations_it_generalises(random_hf):
  """A uniform source patched into one head's probabilities is HeadAblation('uniform'); a zero
  source at one token's values is ValueZeroing."""
  model = random_hf("bert")[1]
  clean, corrupt, mask = _pair(model.config)
  probs = patching.activations(model, _batch(corrupt, mask), "probs")  # [layers, B, H, L, L]
  uniform = np.asarray(mask / mask.sum(-1, keepdims=True), np.float32)[:, None, None, :]
  uniform = np.broadcast_to(uniform * mask[:, None, :, None], probs.shape[1:])
  got = model.apply(corrupt, mask, override=pj.AttentionOverride.intervene(
      pj.Patch(uniform, [1, 2, -1], [-1, -1, -1], [3, 0, -1], site="probs")))
  want = model.apply(corrupt, mask, override=pj.AttentionOverride.intervene(
      pj.HeadAblation([1, 2, -1], [3, 0, -1], kind="uniform")))
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(got.hidden_states[-1])[real],
                             np.asarray(want.hidden_states[-1])[real], atol=2e-5)
  values = patching.activations(model, _batch(corrupt, mask), "values")
  got = model.apply(corrupt, mask, override=pj.AttentionOverride.intervene(
      pj.Patch(jnp.zeros_like(values[0]), [0, -1, 2], [4, -1, 1], [-1, -1, -1], site="values")))
  want = model.apply(corrupt, mask, override=pj.AttentionOverride.intervene(
      pj.ValueZeroing([0, -1, 2], [4, -1, 1])))
  np.testing.assert_allclose(np.asarray(got.hidden_states[-1])[real],
                             np.asarray(want.hidden_states[-1])[real], atol=2e-5)
  del clean


@pytest.mark.unit
@pytest.mark.parametrize("site,heads", [("residual_out", (-1,)), ("context", (0, 3))])
def test_a_sweep_equals_a_loop_over_its_targets_and_compiles_once(random_hf, site, heads):
  """Every (layer, position[, head]) target, in chunks of 7 (the last padded), equals one
  patched forward per target (of the whole encoder: the sweep starts each layer's targets
  there); one program per layer, which a second target set of as many targets per layer
  reuses."""
  model = random_hf("bert")[1]
  clean, corrupt, mask = _pair(model.config)
  source = patching.activations(model, _batch(clean, mask), site)
  targets = patching.Targets.grid(model.config.num_layers, positions=range(0, L, 2),
                                  heads=heads)
  before = patching._patched._cache_size()  # pylint: disable=protected-access
  got = patching.sweep(model, _batch(corrupt, mask), source, site, targets, _cls_metric,
                       chunk=7)
  assert got.shape == (len(targets), 3)
  for t in range(len(targets)):
    l, p, h = targets.layers[t], targets.positions[t], targets.heads[t]
    out = model.apply(corrupt, mask, override=pj.AttentionOverride.intervene(
        pj.Patch(source[l], [l] * 3, [p] * 3, [h] * 3, site=site)))
    np.testing.assert_allclose(got[t], np.asarray(_cls_metric(out, None)), atol=1e-5,
                               err_msg=f"target {t}: layer {l} position {p} head {h}")
  compiled = patching._patched._cache_size()  # pylint: disable=protected-access
  assert compiled == before + model.config.num_layers  # One program per layer.
  other = patching.Targets.grid(model.config.num_layers, positions=range(1, L, 2), heads=heads)
  patching.sweep(model, _batch(corrupt, mask), source, site, other, _cls_metric, chunk=7)
  assert patching._patched._cache_size() == compiled  # pylint: disable=protected-access
  base = patching.run_metric(model, _batch(corrupt, mask), _cls_metric)
  assert np.abs(got - base).max() > 1e-3  # Patching the clean run in moved the metric.
  none = patching.Targets(np.array([-1, 0], np.int32), np.array([0, 0], np.int32),
                          np.array([-1, targets.heads[0]], np.int32))
  both = patching.sweep(model, _batch(corrupt, mask), source, site, none, _cls_metric)
  np.testing.assert_allclose(both[0], base, atol=1e-6)  # Layer -1 patches nothing.
  np.testing.assert_allclose(both[1], got[0], atol=1e-5)


def _two_layer_metric(out, batch):
  """Reads an earlier layer's state too (the sweep's rows must carry every cached layer the
  metric needs) and a per-example batch field (rows must stay in order)."""
  h = out.hidden_states
  w = jnp.asarray(W, h[-1].dtype)
  return h[-1][:, 0] @ w + batch["scale"] * (h[1][:, 1] @ w)


@pytest.mark.unit
def test_a_sweep_split_over_eight_devices_equals_one_device(random_hf, caplog):
  """The rows of every call split over 8 CPU devices (3 examples: the chunk rounds up to 8
  targets so that 24 rows split evenly), gathered back in order: equal to the one-device
  sweep, with a metric that reads layer 1's cached state and a per-example field; a call's
  rows come back sharded over the 8 devices."""
  model = random_hf("bert")[1]
  clean, corrupt, mask = _pair(model.config)
  batch = dict(_batch(corrupt, mask), scale=np.asarray([1.0, -2.0, 0.5], np.float32))
  source = patching.activations(model, _batch(clean, mask), "residual_out")
  targets = patching.Targets.grid(model.config.num_layers, positions=(0, 3, 7))
  mesh = parallel.make_mesh(8)
  one = patching.sweep(model, batch, source, "residual_out", targets, _two_layer_metric, chunk=5)
  with caplog.at_level(logging.INFO):
    eight = patching.sweep(model, batch, source, "residual_out", targets, _two_layer_metric,
                           chunk=5, mesh=mesh, desc="sweep")
  t = len(targets)  # Progress by targets, the last line at the end.
  assert f"sweep: {t}/{t} (100%)" in caplog.text and "targets/s" in caplog.text
  np.testing.assert_allclose(eight, one, rtol=1e-5, atol=1e-5)
  for t in range(len(targets)):  # And both equal a patched forward of the whole encoder.
    l, p = targets.layers[t], targets.positions[t]
    out = model.apply(corrupt, mask, override=pj.AttentionOverride.intervene(
        pj.Patch(source[l], [l] * 3, [p] * 3, [-1] * 3, site="residual_out")))
    np.testing.assert_allclose(one[t], np.asarray(_two_layer_metric(out, batch)), atol=1e-5,
                               err_msg=f"target {t}: layer {l} position {p}")
  assert np.abs(one - patching.run_metric(model, batch, _two_layer_metric)).max() > 1e-3
  groups, chunk, tiled = patching.layer_groups(targets.layers, batch, 5, devices=8)
  assert chunk == 8 and len(tiled["example"]) == 24 and len(groups) == model.config.num_layers
  example = tiled.pop("example")
  rows = patching._patched(  # pylint: disable=protected-access
      model.module, model.params, source, source, metrics.as_metric(_two_layer_metric), tiled,
      example, example, example, site="residual_out", layer=1, mesh=mesh)
  assert rows.shape == (24,) and len(rows.sharding.device_set) == 8


@pytest.mark.unit
@pytest.mark.parametrize("site", ("residual_out", "context", "probs"))
def test_attribution_is_the_first_order_effect_of_patching(random_hf, site):
  """The gradient at every layer's site equals central finite differences (float64), and AtP
  of a small step towards the clean run equals the exact patching effect to first order."""
  _, model = random_hf("bert")
  clean, corrupt, mask = _pair(model.config)
  with jax.enable_x64(True):
    m64 = pj.Pretrained(model.config, jax.tree.map(lambda x: jnp.asarray(x, jnp.float64),
                                                   model.params), model.model_dir)
    batch = _batch(corrupt, mask)
    acts = patching.activations(m64, batch, site)
    grads = np.asarray(patching.gradients(m64, batch, site, _cls_metric))
    rng = np.random.default_rng(3)
    eps = 1e-6
    def f(d):
      out = m64.apply(corrupt, mask, override=pj.AttentionOverride.intervene(
          pj.Add(jnp.asarray(d), site=site)))
      return float(_cls_metric(out, None).sum())

    for _ in range(4):
      cell = tuple(int(rng.integers(n)) for n in acts.shape)
      delta = np.zeros(acts.shape)
      delta[cell] = eps
      fd = (f(delta) - f(-delta)) / (2 * eps)
      np.testing.assert_allclose(grads[cell], fd, rtol=1e-5, atol=1e-9, err_msg=str(cell))
    source = acts + 1e-4 * (patching.activations(m64, _batch(clean, mask), site) - acts)
    targets = patching.Targets.grid(model.config.num_layers, positions=(0, 2, -1),
                                    heads=(-1, 1) if site != "residual_out" else (-1,))
    exact = patching.sweep(m64, batch, source, site, targets, _cls_metric, chunk=8)
    exact = exact - patching.run_metric(m64, batch, _cls_metric)[None]
    estimate = patching.at_targets(
        patching.attribution(m64, batch, {site: source}, _cls_metric)[site], targets)
  assert np.abs(exact).max() > 1e-7
  np.testing.assert_allclose(estimate, exact, rtol=1e-3, atol=1e-3 * np.abs(exact).max())


@pytest.mark.unit
def test_ablation_sources_and_bad_inputs_are_named():
  """"mean" averages each layer and position over the examples real there (numpy), "resample"
  gives every example another's activations, "zero" zeros; unequal pairs, unknown sites and
  misshapen sources are refused with the pair, site or shape."""
  rng = np.random.default_rng(0)
  acts = rng.normal(size=(2, 3, 4, 5)).astype(np.float32)  # [layers, B, L, D]
  mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
  mean = np.asarray(patching.ablation_source(jnp.asarray(acts), mask, "residual_out", "mean"))
  for l in range(2):
    for p in range(4):
      real = mask[:, p] > 0
      np.testing.assert_allclose(mean[l, :, p], np.broadcast_to(acts[l, real, p].mean(0),
                                                                 (3, 5)), atol=1e-6)
  probs = rng.random((2, 3, 2, 4, 4))  # [layers, B, H, Lq, Lk]: positions on axis 3.
  pm = np.asarray(patching.ablation_source(jnp.asarray(probs), mask, "probs", "mean"))
  np.testing.assert_allclose(pm[1, 0, :, 1], probs[1, :2, :, 1].mean(0), atol=1e-6)
  res = np.asarray(patching.ablation_source(jnp.asarray(acts), mask, "residual_out",
                                            "resample", seed=3))
  picked = [int(np.flatnonzero((acts[0] == res[0, b]).all((1, 2)))[0]) for b in range(3)]
  assert sorted(picked) == [0, 1, 2] and all(p != b for b, p in enumerate(picked))
  assert not np.asarray(patching.ablation_source(jnp.asarray(acts), mask, "mlp_output",
                                                 "zero")).any()
  with pytest.raises(ValueError, match="ablation 'median'"):
    patching.ablation_source(jnp.asarray(acts), mask, "residual_out", "median")
  with pytest.raises(ValueError, match=r"pair 1: the target has 2 tokens and the source 3"):
    patching.check_pairs(mask, np.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]]),
                         "residual_in")
  with pytest.raises(ValueError, match="site 'resid_post'"):
    pj.Patch(np.zeros((3, 4, 5)), [0] * 3, [0] * 3, [0] * 3, site="resid_post")
  with pytest.raises(ValueError, match=r"Add.delta has shape \(3, 4\); expected \[layers, batch"):
    pj.Add(np.zeros((3, 4)), site="mlp_output").validate(num_layers=2, num_heads=2, seq_len=4,
                                                          batch=3)
  with pytest.raises(ValueError, match=r"Patch.heads has shape \(2,\)"):
    pj.Patch(np.zeros((3, 4, 5)), [0] * 3, [0] * 3, [0] * 2).validate(
        num_layers=2, num_heads=2, seq_len=4, batch=3)


@pytest.mark.integration
@pytest.mark.parametrize("site", ("residual_out", "context"))
def test_patching_real_minilm_equals_hf_with_forward_hooks(minilm, minilm_tokenizer, site):
  """pj.patch of a clean sentence into its one-word substitution on real MiniLM (float64):
  each target's readout equals HF PyTorch's with the same hook, and pj.attribution_patch
  ranks the targets it estimates like the exact effects do."""
  pairs = [("a gorgeous , witty , seductive movie .", "a dreadful , witty , seductive movie ."),
           ("the acting is great", "the acting is awful")]
  enc = [minilm_tokenizer([p[i] for p in pairs], padding="max_length", max_length=L,
                          return_tensors="np") for i in (0, 1)]
  clean, corrupt = (_batch(e["input_ids"], e["attention_mask"]) for e in enc)
  targets = patching.Targets.grid(minilm.config.num_layers, positions=(1, 2, -1),
                                  heads=(-1, 5) if site == "context" else (-1,))
  hf = hf_oracle.load_hf(minilm.model_dir, "float64")
  with jax.enable_x64(True):
    m64 = pj.Pretrained(minilm.config, jax.tree.map(lambda x: jnp.asarray(x, jnp.float64),
                                                    minilm.params), minilm.model_dir)
    got = pj.patch(m64, corrupt, clean, site, targets, _cls_metric_384)
    estimate = pj.attribution_patch(m64, corrupt, clean, {site: targets}, _cls_metric_384)[site]
    source = np.asarray(patching.activations(m64, clean, site))
  for t in (0, 4, len(targets) - 1):
    rows = tuple([int(a[t])] * 2 for a in (targets.layers, targets.positions, targets.heads))
    last = _hf_patched(hf, "bert", site, corrupt["input_ids"], corrupt["attention_mask"],
                       source, rows)
    np.testing.assert_allclose(got["patched"][t], last[:, 0] @ W384, rtol=1e-9, atol=1e-9)
  effect = got["patched"] - got["target"][None]
  assert np.abs(effect).max() > 1e-2
  from scipy import stats  # pylint: disable=import-outside-toplevel
  assert stats.spearmanr(effect.ravel(), estimate.ravel())[0] > 0.5


W384 = np.random.default_rng(8).normal(size=384)


def _cls_metric_384(out, batch):
  del batch
  return out.hidden_states[-1][:, 0] @ jnp.asarray(W384, out.hidden_states[-1].dtype)


@pytest.mark.unit
def test_attribution_of_several_sites_in_one_pass_equals_each_alone(random_hf):
  """pj.attribution_patch over {residual_in, context} (one forward and one backward) equals
  each site's own pass."""
  model = random_hf("bert")[1]
  clean, corrupt, mask = _pair(model.config)
  targets = {"residual_in": patching.Targets.grid(3, positions=(0, 5, -1)),
             "context": patching.Targets.grid(3, heads=(0, 2, -1))}
  both = pj.attribution_patch(model, _batch(corrupt, mask), _batch(clean, mask), targets,
                              _cls_metric)
  for site, t in targets.items():
    alone = pj.attribution_patch(model, _batch(corrupt, mask), _batch(clean, mask), {site: t},
                                 _cls_metric)[site]
    assert np.abs(alone).max() > 1e-3
    np.testing.assert_allclose(both[site], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.unit
def test_at_targets_sums_each_targets_positions_and_heads():
  """Every kind of target (one or all positions, one or all heads) in one list, against a
  loop over them in numpy."""
  per_site = np.random.default_rng(0).standard_normal((3, 2, 5, 4))
  t = patching.Targets(np.array([0, 2, 1, 1, 2, 0]), np.array([3, -1, 0, -1, 4, -1]),
                       np.array([1, 2, -1, -1, 0, 3]))
  got = patching.at_targets(per_site, t)
  for i, (l, p, h) in enumerate(zip(t.layers, t.positions, t.heads)):
    x = per_site[l][:, slice(None) if p < 0 else slice(p, p + 1)]
    want = x[..., slice(None) if h < 0 else slice(h, h + 1)].sum((1, 2))
    np.testing.assert_allclose(got[i], want, err_msg=str(i))


@pytest.mark.unit
def test_grad_drop_is_the_first_order_effect_with_one_layers_blocks_frozen(random_hf):
  """AtP with layer l's gradient dropped equals, to first order, the effect of a small step
  towards the clean run when layer l's attention and MLP outputs are held at their unpatched
  values (Patch of their own activations: no stop_gradient involved), for every l, in float64;
  GradDrop is the mean over layers of their magnitudes (sum / (layers - 1))."""
  _, model = random_hf("bert")
  clean, corrupt, mask = _pair(model.config)
  n = model.config.num_layers
  with jax.enable_x64(True):
    m64 = pj.Pretrained(model.config, jax.tree.map(lambda x: jnp.asarray(x, jnp.float64),
                                                   model.params), model.model_dir)
    batch = _batch(corrupt, mask)
    acts = patching.activations(m64, batch, "residual_in")
    source = acts + 1e-4 * (patching.activations(m64, _batch(clean, mask), "residual_in")
                            - acts)
    frozen = {s: patching.activations(m64, batch, s) for s in patching.GRAD_DROP_SITES}
    base = np.asarray(_cls_metric(m64.apply(corrupt, mask), None))
    per_drop = []
    for drop in range(n):
      est = patching.attribution(m64, batch, {"residual_in": source}, _cls_metric,
                                 drop=drop)["residual_in"]
      per_drop.append(est)
      for layer, pos in ((0, 3), (1, 5), (2, 1)):
        hold = [pj.Patch(frozen[s][drop], [drop] * 3, [-1] * 3, [-1] * 3, site=s)
                for s in patching.GRAD_DROP_SITES]
        step = pj.Patch(source[layer], [layer] * 3, [pos] * 3, [-1] * 3, site="residual_in")
        out = m64.apply(corrupt, mask, override=pj.AttentionOverride.intervene(step, *hold))
        exact = np.asarray(_cls_metric(out, None)) - base
        np.testing.assert_allclose(est[layer, :, pos, 0], exact, rtol=2e-3,
                                   atol=1e-3 * np.abs(exact).max() + 1e-12,
                                   err_msg=f"drop {drop}, layer {layer}, position {pos}")
    plain = patching.attribution(m64, batch, {"residual_in": source}, _cls_metric)
    targets = patching.Targets.grid(n, positions=(0, 4, -1))
    dropped = patching.grad_drop(m64, batch, {"residual_in": source},
                                 {"residual_in": targets}, _cls_metric)["residual_in"]
  # Dropping the last layer's blocks changes every earlier node's estimate.
  assert np.abs(per_drop[-1] - plain["residual_in"])[:n - 1].max() > 1e-9
  want = sum(np.abs(patching.at_targets(p, targets)) for p in per_drop) / (n - 1)
  np.testing.assert_allclose(dropped, want, rtol=1e-6)  # |.| of each target's whole sum.


@pytest.mark.unit
def test_attribution_patch_names_an_unknown_method(random_hf):
  model = random_hf("bert")[1]
  clean, corrupt, mask = _pair(model.config)
  with pytest.raises(ValueError, match=r"method 'atp\*'; choose one of \('atp', 'grad_drop'\)"):
    pj.attribution_patch(model, _batch(corrupt, mask), _batch(clean, mask),
                         {"context": patching.Targets.grid(3, heads=(0,))}, _cls_metric,
                         method="atp*")
