"""Attention knockout and constant attention at the probabilities site against Hugging Face
PyTorch (float64, every family: its softmax output edited by a torch function mode), and the
knockout sweep against a loop over its targets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import papa_jax as pj
from papa_jax import interventions, parallel
from papa_jax.causal import knockout
from tests import hf_oracle

# Every padded query keeps a real key in the smallest ModernBERT window here (|i - j| <= 3):
# HF's eager attention gives NaN for a row without one, which its next layer spreads.
L, LENGTHS = 12, (12, 10, 9)
W = np.random.default_rng(7).standard_normal(64)  # The random models' hidden size.


def _batch(config, seed=0):
  ids, mask = hf_oracle.padded_batch(config.vocab_size, LENGTHS, L, config.pad_token_id, seed)
  return dict(input_ids=ids.astype(np.int32), attention_mask=mask.astype(np.int32))


def _f64(model):
  return pj.Pretrained(model.config, jax.tree.map(lambda x: jnp.asarray(x, jnp.float64),
                                                  model.params), model.model_dir)


def _tolerance(model, hf, batch) -> float:
  """1e-9 of the output's scale, plus 10x the unmodified runs' gap: HF's DeBERTa keeps some
  terms in float32 even in a float64 model (7e-7); every other family agrees to ~1e-15."""
  ids, mask = batch["input_ids"], batch["attention_mask"]
  with jax.enable_x64(True):
    ours = np.asarray(_f64(model).apply(ids, mask).last_hidden_state)
  stock = hf_oracle.run_hf_editing_probs(hf, ids, mask, lambda l, p: p,
                                         model.config.num_layers)
  real = mask.astype(bool)
  return 1e-9 * np.abs(stock[real]).max() + 10 * np.abs(ours - stock)[real].max()


def _knocked_torch(probs, blocked, on, rule):
  """Geva et al.'s knockout of `probs` `[B, H, L, L]` written in torch: blocked edges of the
  examples `on` set to 0, and (renormalize) those rows renormalised over the other keys."""
  import torch  # pylint: disable=import-outside-toplevel
  cut = torch.tensor(blocked & on[:, None, None])[:, None]  # [B, 1, L, L]
  kept = probs.masked_fill(cut, 0.0)
  if rule == "zero":
    return kept
  lost = cut.any(-1, keepdim=True)
  return torch.where(lost, kept / kept.sum(-1, keepdim=True), probs)


FAMILIES = [hf_oracle.by_path(arch) for arch in hf_oracle.ARCHS]


@pytest.mark.parametrize("arch", FAMILIES)
def test_knockout_equals_hf_with_its_softmax_output_edited(arch, random_hf):
  """Example 0: every query's edges to position 0 and to the next token blocked in layers
  1..2; example 1: the previous token's in layer 0 only; example 2: no window. Both rules;
  float64; the last hidden state at real tokens equals HF's with the same edges cut from its
  softmax's output; example 2 equals the unmodified run."""
  path, model = random_hf(arch)
  batch = _batch(model.config)
  mask = batch["attention_mask"]
  first_key = np.zeros(mask.shape, bool)
  first_key[:, 0] = True
  blocked = np.array(interventions.edges(mask, first_key)
                       | interventions.shifted_edges(mask, +1))
  blocked[1] = np.asarray(interventions.shifted_edges(mask, -1))[1]
  first, last = np.array([1, 0, -1]), np.array([2, 0, -1])
  hf = hf_oracle.load_hf(path, "float64")
  real = mask.astype(bool)
  tol = _tolerance(model, hf, batch)
  for rule in interventions.KNOCKOUT_RULES:
    with jax.enable_x64(True):
      ko = pj.Knockout(blocked, first, last, rule=rule)
      ours = np.asarray(_f64(model).apply(
          batch["input_ids"], mask, override=pj.AttentionOverride.intervene(ko)
      ).last_hidden_state)
    want = hf_oracle.run_hf_editing_probs(
        hf, batch["input_ids"], mask,
        lambda l, p, rule=rule: _knocked_torch(p, blocked, (first <= l) & (l <= last), rule),
        model.config.num_layers)
    stock = hf_oracle.run_hf_editing_probs(hf, batch["input_ids"], mask, lambda l, p: p,
                                           model.config.num_layers)
    np.testing.assert_allclose(ours[real], want[real], atol=tol, err_msg=rule)
    np.testing.assert_allclose(ours[2][real[2]], stock[2][real[2]], atol=tol)
    for b in (0, 1):  # The cut counted in both knocked-out examples.
      assert np.abs(want[b] - stock[b])[real[b]].max() > 1e-3, (rule, b)


@pytest.mark.parametrize("arch", FAMILIES)
def test_constant_attention_from_logits_equals_hf_with_its_softmax_output_replaced(
    arch, random_hf):
  """The optimal variant's forward: static heads (half of them, mixed per layer) attend by a
  softmax of free `[L, L]` logits over each example's real keys (and, on ModernBERT's local
  layers, its window), the other heads as usual; float64, the last hidden state at real
  tokens equals HF's with those heads' softmax output replaced by that rule written in torch."""
  import torch  # pylint: disable=import-outside-toplevel
  path, model = random_hf(arch)
  c = model.config
  batch = _batch(c, seed=1)
  mask = batch["attention_mask"]
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((c.num_layers, c.num_heads, L, L)) * 2
  static = rng.random((c.num_layers, c.num_heads)) < 0.5
  static[0], static[-1] = True, False  # One all-static layer, one all-dynamic.
  hf = hf_oracle.load_hf(path, "float64")
  windows = hf_oracle.local_windows(hf.config, L, c.num_layers)
  with jax.enable_x64(True):
    const = jax.nn.softmax(jnp.asarray(logits), -1)
    ov = pj.AttentionOverride.constant(const, static)
    ours = np.asarray(_f64(model).apply(batch["input_ids"], mask, override=ov)
                      .last_hidden_state)

  def replace(l, probs):
    keep = mask[:, None, :].astype(bool) & mask[:, :, None].astype(bool)  # [B, L, L]
    if windows[l] is not None:
      keep = keep & windows[l]
    e = np.exp(logits[l] - logits[l].max(-1, keepdims=True))[None] * keep[:, None]
    rows = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    return torch.where(torch.tensor(static[l])[None, :, None, None], torch.tensor(rows), probs)

  want = hf_oracle.run_hf_editing_probs(hf, batch["input_ids"], mask, replace, c.num_layers)
  stock = hf_oracle.run_hf_editing_probs(hf, batch["input_ids"], mask, lambda l, p: p,
                                         c.num_layers)
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], want[real], atol=_tolerance(model, hf, batch))
  assert np.abs(want - stock)[real].max() > 1e-2


def _cls_metric(out, batch):
  del batch
  h = out.hidden_states[-1]
  return h[:, 0] @ jnp.asarray(W, h.dtype)


@pytest.mark.unit
def test_a_knockout_sweep_equals_a_loop_and_compiles_once_per_first_layer(random_hf):
  """Every window of widths 1 and 2 times 3 classes (chunks of 4, the last padded) equals one
  knocked-out forward of the whole encoder per target; one program per first layer, which
  other classes and windows with the same first layers reuse."""
  model = random_hf("bert")[1]
  batch = _batch(model.config)
  mask = batch["attention_mask"]
  cls = interventions.position_classes(batch["input_ids"], mask, cls_id=int(
      batch["input_ids"][0, 0]), sep_ids=(int(batch["input_ids"][2, 7]),))
  blocked = np.stack([np.asarray(interventions.edges(mask, cls["cls"])),
                      np.asarray(interventions.edges(mask, cls["other"])),
                      np.asarray(interventions.shifted_edges(mask, -1))])
  n = model.config.num_layers
  wins = [(l, l) for l in range(n)] + [(l, l + 1) for l in range(n - 1)]
  before = knockout._knocked._cache_size()  # pylint: disable=protected-access
  got = pj.knockout(model, batch, blocked, wins, _cls_metric, chunk=4)
  assert got["knocked"].shape == (len(wins), 3, 3)
  for w, (first, last) in enumerate(wins):
    for k in range(3):
      out = model.apply(batch["input_ids"], mask, override=pj.AttentionOverride.intervene(
          pj.Knockout(blocked[k], [first] * 3, [last] * 3)))
      np.testing.assert_allclose(got["knocked"][w, k], np.asarray(_cls_metric(out, None)),
                                 rtol=1e-5, atol=1e-5,
                                 err_msg=f"window {first}-{last}, class {k}")
  compiled = knockout._knocked._cache_size()  # pylint: disable=protected-access
  assert compiled == before + n  # One program per first layer.
  knockout.sweep(model, batch, blocked[::-1], wins[::-1], _cls_metric, chunk=4)
  assert knockout._knocked._cache_size() == compiled  # pylint: disable=protected-access
  np.testing.assert_allclose(got["base"], np.asarray(_cls_metric(model.apply(
      batch["input_ids"], mask), None)), rtol=1e-5)  # Two programs: float32 rounding.
  assert np.abs(got["knocked"] - got["base"]).max() > 1e-3  # The knockouts moved the metric.


@pytest.mark.unit
def test_a_knockout_sweep_split_over_eight_devices_equals_one_device(random_hf):
  """Each call's rows split over 8 CPU devices (3 examples x a chunk rounded up to 8):
  equal to the one-device sweep (itself equal to a loop, above), rows in order."""
  model = random_hf("bert")[1]
  batch = _batch(model.config)
  mask = batch["attention_mask"]
  blocked = np.stack([np.asarray(interventions.shifted_edges(mask, s)) for s in (-1, 1)])
  wins = [(0, 0), (1, 1), (0, 1)]
  one = knockout.sweep(model, batch, blocked, wins, _cls_metric, chunk=3)
  eight = knockout.sweep(model, batch, blocked, wins, _cls_metric, chunk=3,
                         mesh=parallel.make_mesh(8))
  np.testing.assert_allclose(eight, one, rtol=1e-5, atol=1e-5)
  assert np.ptp(one) > 1e-3


@pytest.mark.unit
def test_knockout_sweep_names_bad_windows_and_shapes(random_hf):
  model = random_hf("bert")[1]
  batch = _batch(model.config)
  blocked = np.zeros((2, 3, L, L), bool)
  n = model.config.num_layers
  with pytest.raises(ValueError, match=rf"windows\[1\] = \(2, {n}\): use 0 <= first <= last "
                                       rf"< {n}"):
    knockout.sweep(model, batch, blocked, [(0, 0), (2, n)], _cls_metric)
  with pytest.raises(ValueError, match=r"windows\[0\] = \(2, 1\)"):
    knockout.sweep(model, batch, blocked, [(2, 1)], _cls_metric)
  with pytest.raises(ValueError, match=r"blocked has shape \(3, 12, 12\); expected "
                                       r"\[classes, B, L, L\] = \[C, 3, 12, 12\]"):
    knockout.sweep(model, batch, blocked[0], [(0, 0)], _cls_metric)
  with pytest.raises(ValueError, match="knockout rule 'soft'"):
    knockout.sweep(model, batch, blocked, [(0, 0)], _cls_metric, rule="soft")
