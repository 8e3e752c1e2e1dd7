"""The capture spec on every family, and interventions at their sites, against oracles."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

import papa_jax as pj
from papa_jax import convert
from tests import hf_oracle, testing

SENTS = ["the movie was a gorgeous , witty , seductive thing .", "dull",
         "a film that proves its point a little too well"]


@pytest.fixture(scope="module")
def batch(minilm_tokenizer):
  enc = minilm_tokenizer(SENTS, padding="max_length", max_length=16, truncation=True,
                         return_tensors="np")
  return enc["input_ids"], enc["attention_mask"]


def _ln(x, p, eps):
  return testing.np_layer_norm(x, p, eps)


def _f64(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


@pytest.mark.unit
@pytest.mark.parametrize("family", hf_oracle.LAYOUTS)
def test_capture_every_piece_satisfies_its_identity(family, random_hf):
  """Each captured piece recombines into the next one, with the layer's own parameters;
  capturing changes no number. The capture code branches only on the layer layout, so one
  post-LN and one pre-LN family (`hf_oracle.LAYOUTS`) cover it."""
  model = random_hf(family)[1]
  c = model.config
  rng = np.random.default_rng(0)
  ids = rng.integers(5, c.vocab_size, (2, 12))
  mask = np.ones((2, 12), np.int32)
  mask[1, 8:] = 0
  plain = model.apply(ids, mask)
  everything = pj.Capture.everything()
  pre = c.norm_placement == "pre"
  if pre:  # Pre-LN layers have no post-LN sums to record: refused, the rest is checked.
    with pytest.raises(ValueError, match="norm_placement='pre'"):
      model.apply(ids, mask, capture=everything)
    everything = dataclasses.replace(everything, layer_norms=False)
  out = model.apply(ids, mask, capture=everything)
  assert plain.layers is None and len(out.layers) == c.num_layers
  real = mask.astype(bool)
  for a, b in zip(plain.hidden_states, out.hidden_states):
    np.testing.assert_allclose(np.asarray(a)[real], np.asarray(b)[real], atol=1e-6)
  for l, lay in enumerate(out.layers):
    p = _f64(model.params[f"layer_{l}"])
    x, got = np.asarray(out.hidden_states[l], np.float64), _f64(lay)
    wo = p["attention"]["out_kernel"]  # [H, d, D]
    np.testing.assert_allclose(got.transformed_values,
                               np.einsum("bhkd,hde->bhke", got.values, wo), atol=1e-5)
    np.testing.assert_allclose(got.head_outputs, np.einsum(
        "bhqk,bhke->bhqe", got.probs, got.transformed_values), atol=1e-5)
    np.testing.assert_allclose(got.attention_output, got.head_outputs.sum(1) +
                               p["attention"].get("out_bias", 0.0), atol=1e-5)
    if pre:
      continue
    np.testing.assert_allclose(got.attention_norm_input, x + got.attention_output, atol=1e-5)
    for u, scale, norm, h in (
        (got.attention_norm_input, got.attention_norm_scale, "attention_norm",
         got.attention_norm_output),
        (got.output_norm_input, got.output_norm_scale, "output_norm",
         np.asarray(out.hidden_states[l + 1], np.float64))):
      np.testing.assert_allclose(scale, np.sqrt(u.var(-1) + c.layer_norm_eps), rtol=1e-5)
      np.testing.assert_allclose(h[real], _ln(u, p[norm], c.layer_norm_eps)[real], atol=2e-5)


def _tail(u, p, eps):
  """The position-wise rest of a post-LN BERT layer after the attention residual (float64)."""
  h = _ln(u, p["attention_norm"], eps)
  f = h @ p["intermediate"]["kernel"] + p["intermediate"]["bias"]
  f = (0.5 * f * (1 + erf(f / np.sqrt(2)))) @ p["output"]["kernel"] + p["output"]["bias"]
  return _ln(h + f, p["output_norm"], eps)


@pytest.mark.integration
def test_intervention_value_zeroing_equals_the_exact_tail_form(minilm, batch):
  """Zeroing token j's values in layer l changes query i's residual by exactly -z_ij
  (Mohebbi et al.'s value zeroing; shared/spec/context_mixing.md §7.2): an oracle from the
  uninterrupted run's captured probabilities and v W_O, through a float64 layer tail."""
  ids, mask = batch
  c = minilm.config
  l, tokens = 2, np.array([3, -1, 0])  # Row 1 zeroes nothing.
  ref = minilm.apply(ids, mask, capture=pj.Capture(probs=True, transformed_values=True,
                                                   layer_norms=True))
  out = minilm.apply(ids, mask, override=pj.AttentionOverride.intervene(
      pj.ValueZeroing(np.full(3, l), tokens)))
  lay = _f64(ref.layers[l])
  p = _f64(minilm.params[f"layer_{l}"])
  real = mask.astype(bool)
  for b, j in enumerate(tokens):
    u = lay.attention_norm_input[b]
    if j >= 0:  # z_ij = sum_h alpha^h_ij f^h_j
      u = u - np.einsum("hq,he->qe", lay.probs[b, :, :, j], lay.transformed_values[b, :, j])
    want = _tail(u, p, c.layer_norm_eps)
    got = np.asarray(out.hidden_states[l + 1], np.float64)[b]
    np.testing.assert_allclose(got[real[b]], want[real[b]], atol=3e-5)
  for k in range(l + 1):  # Layers before the zeroing are untouched.
    np.testing.assert_array_equal(np.asarray(out.hidden_states[k]),
                                  np.asarray(ref.hidden_states[k]))


@pytest.mark.integration
def test_intervention_head_mask_zero_equals_a_numpy_layer_without_that_head(minilm, batch):
  ids, mask = batch
  c = minilm.config
  scale = np.ones((c.num_layers, c.num_heads), np.float32)
  scale[0, 4] = 0.0
  out = minilm.apply(ids, mask, override=pj.AttentionOverride.intervene(pj.HeadMask(scale)))
  p = _f64(minilm.params["layer_0"])
  x = np.asarray(out.hidden_states[0], np.float64)
  m = mask.astype(np.float64)
  probs = testing.np_softmax_probs(x, m, p["attention"], list(range(c.num_heads)),
                                   c.dim_per_head)
  probs[:, 4] = 0.0
  want = testing.np_bert_layer(x, probs, p, c.layer_norm_eps)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.hidden_states[1])[real], want[real], atol=3e-5)
  # Per example: only example 0 loses the head, the others keep every head.
  per_example = np.ones((3, c.num_layers, c.num_heads), np.float32)
  per_example[0, 0, 4] = 0.0
  mixed = minilm.apply(ids, mask, override=pj.AttentionOverride.intervene(
      pj.HeadMask(per_example)))
  stock = minilm.apply(ids, mask)
  for got, a, b in zip(mixed.hidden_states, out.hidden_states, stock.hidden_states):
    np.testing.assert_allclose(np.asarray(got)[0], np.asarray(a)[0], atol=1e-5)
    np.testing.assert_allclose(np.asarray(got)[1:], np.asarray(b)[1:], atol=1e-5)


@pytest.mark.integration
def test_intervention_new_heads_or_tokens_do_not_recompile(minilm, batch):
  """Which head is ablated and which token zeroed are traced data: one program each."""
  ids, mask = batch
  cfg = minilm.config

  @jax.jit
  @chex.assert_max_traces(n=2)  # One program per intervention kind.
  def run(params, ov):
    return pj.Encoder(cfg).apply({"params": params}, ids, mask, override=ov).last_hidden_state

  outs = []
  for layers, targets in (([0, 1, -1], [2, 3, 0]), ([5, 5, 2], [11, 0, 7])):
    outs.append(run(minilm.params, pj.AttentionOverride.intervene(
        pj.HeadAblation(layers, targets, kind="uniform"))))
    run(minilm.params, pj.AttentionOverride.intervene(pj.ValueZeroing(layers, targets)))
  assert np.abs(np.asarray(outs[0]) - np.asarray(outs[1])).max() > 1e-3  # They did differ.
  with pytest.raises(AssertionError, match="traced > 2 times"):  # Another kind retraces.
    run(minilm.params, pj.AttentionOverride.intervene(
        pj.HeadAblation([0, 0, 0], [1, 1, 1], kind="effective")))


@pytest.mark.unit
def test_invalid_interventions_are_named():
  ov = pj.AttentionOverride.intervene(pj.HeadAblation([0, 1], [2, 3]))
  with pytest.raises(ValueError, match=r"HeadAblation.layers has shape \(2,\); expected "
                                       r"\[batch\] = \(3,\)"):
    ov.validate(2, 4, 8, batch=3)
  with pytest.raises(ValueError, match="needs constants of shape"):
    pj.AttentionOverride.intervene(pj.HeadAblation([0], [1], kind="constant")).validate(
        2, 4, 8, batch=1)
  with pytest.raises(ValueError, match="ablation kind 'zero'"):
    pj.HeadAblation([0], [1], kind="zero")
  with pytest.raises(ValueError, match=r"HeadMask.scale has shape \(4,\)"):
    pj.AttentionOverride.intervene(pj.HeadMask(jnp.ones(4))).validate(2, 4, 8)
  with pytest.raises(ValueError, match="is not an intervention"):
    pj.AttentionOverride.intervene(lambda x, **kw: x).validate(2, 4, 8)
