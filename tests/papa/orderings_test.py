"""PAPA's controls: head orderings and constant choices, each against an independent oracle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import papa_jax as pj
from papa_jax import attention, convert, parallel
from papa_jax.papa import constants, orderings
from papa_jax.papa import means as means_lib
from tests.testing import require_shared, sst2_dev_sample


def _means_and_attention(model, data):
  """The means pass's state, and every example's attention `[B, layers, H, L, L]` (float64)."""
  state = means_lib.accumulate(model.config, model.params, data, parallel.make_mesh(1),
                               batch_size=8)
  out = model.apply(data.input_ids, data.attention_mask, token_type_ids=data.token_type_ids,
                    capture_attention=True)
  return state, np.stack([np.asarray(a, np.float64) for a in out.attentions], 1)


def _two_pass(A, mask):
  """Entropy, variance and generalised KL per head, the slow way (float64)."""
  m = mask.astype(bool)
  pair = (m[:, :, None] & m[:, None, :]).astype(np.float64)
  n = pair.sum(0)
  C = np.where(n > 0, np.einsum("blhqk,bqk->lhqk", A, pair) / np.maximum(n, 1), 0.0)
  ent, kl, sq, rows = 0.0, 0.0, 0.0, 0
  for b in range(len(A)):
    v = m[b]
    a, c = A[b][:, :, v][:, :, :, v], C[:, :, v][:, :, :, v]  # [layers, H, n, n]
    ent = ent - np.sum(np.where(a > 0, a * np.log(np.where(a > 0, a, 1)), 0), (-1, -2))
    kl = kl + np.sum(np.where(a > 0, a * np.log(np.where(a > 0, a, 1) / np.where(
        c > 0, c, 1)), 0) - a + c, (-1, -2))
    sq = sq + np.sum((a - c) ** 2, (-1, -2))
    rows += int(v.sum())
  return dict(entropy=ent / rows, kl=kl / rows, variance=sq / np.maximum(n - 1, 0).sum())


@pytest.fixture(scope="module")
def sst2_padded(minilm_tokenizer, sst2_dir):
  return sst2_dev_sample(minilm_tokenizer, sst2_dir, longest=3, first=13, max_length=32)


@pytest.mark.integration
def test_orderings_input_dependence_equals_two_pass_numpy(minilm, sst2_padded):
  state, A = _means_and_attention(minilm, sst2_padded)
  m = means_lib.Means(state.averages(), state.sums, state.counts, {}, state.extras)
  got = orderings.input_dependence(m)
  want = _two_pass(A, sst2_padded.attention_mask)
  for k in ("entropy", "variance", "kl"):
    np.testing.assert_allclose(got[k], want[k], rtol=2e-4, atol=1e-7, err_msg=k)
  assert np.all(got["kl"] >= -1e-6) and np.all(got["variance"] >= 0)
  # The orderings these scores give: high entropy, low variance and low KL first.
  for k, first in (("entropy", np.argmax), ("variance", np.argmin), ("kl", np.argmin)):
    ranking = orderings.ranking_from_scores(got[k], orderings.DIRECTIONS[k])
    assert ranking[0] == list(np.unravel_index(first(got[k]), got[k].shape))


@pytest.mark.unit
def test_orderings_input_dependence_on_deberta_with_padding():
  """DeBERTa's pad query rows are uniform over all positions: the scores never read them."""
  model = convert.load_pretrained(str(require_shared("fixtures", "tiny-random", "deberta-v2",
                                                     "DebertaV2Model")))
  rng = np.random.default_rng(3)
  ids = rng.integers(5, model.config.vocab_size, (6, 10)).astype(np.int32)
  mask = np.ones_like(ids)
  for b, n in enumerate((10, 7, 4, 9, 2, 6)):
    mask[b, n:] = 0
  data = dict(input_ids=ids, attention_mask=mask, token_type_ids=np.zeros_like(ids),
              labels=np.zeros(6, np.int32))
  state = means_lib.accumulate(model.config, model.params, data, parallel.make_mesh(1),
                               batch_size=4)
  out = model.apply(ids, mask, capture_attention=True)
  A = np.stack([np.asarray(a, np.float64) for a in out.attentions], 1)
  got = orderings.input_dependence(means_lib.Means(state.averages(), state.sums, state.counts,
                                                   {}, state.extras))
  want = _two_pass(A, mask)
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=2e-4, atol=1e-7, err_msg=k)


@pytest.mark.unit
def test_orderings_random_draws_are_reproducible_permutations():
  a = orderings.random_ranking(6, 12, draw=0, seed=0)
  assert a == orderings.random_ranking(6, 12, draw=0, seed=0)
  assert sorted(map(tuple, a)) == [(l, h) for l in range(6) for h in range(12)]
  assert a != orderings.random_ranking(6, 12, draw=1, seed=0)
  assert a != orderings.random_ranking(6, 12, draw=0, seed=1)
  from configs import quickstart
  c = quickstart.get_config()
  c.papa.orderings = ("random,entropy",)
  c.papa.random_draws = 3
  assert orderings.names(c) == ("lambda", "random_0", "random_1", "random_2", "entropy")


@pytest.mark.integration
def test_constants_row_mean_and_uniform_equal_numpy_on_padded_batches(minilm, sst2_padded):
  state, A = _means_and_attention(minilm, sst2_padded)
  m = sst2_padded.attention_mask.astype(np.float64)
  want = np.einsum("blhqk,bq->lhqk", A * m[:, None, None, None, :], m) / np.maximum(
      m.sum(0), 1)[:, None]
  got = constants.row_mean(state.extras["row_sums"], state.extras["row_counts"])
  np.testing.assert_allclose(got, want, atol=1e-6)
  real_rows = m.sum(0) > 0
  np.testing.assert_allclose(got.sum(-1)[:, :, real_rows], 1.0, atol=1e-5)  # Distributions.
  probs = np.asarray(attention.constant_probs(jnp.asarray(constants.uniform(1, 2, 32))[0],
                                              jnp.asarray(sst2_padded.attention_mask)))
  for b in range(len(m)):
    v = m[b] > 0
    block = np.outer(v, v) / v.sum()
    np.testing.assert_allclose(probs[b], np.broadcast_to(block, probs[b].shape), atol=1e-7)


def _scipy_compressed(avgs: np.ndarray, counts: np.ndarray) -> np.ndarray:
  """The compressed mean of one head, fitted in float64 by SciPy from its definition."""
  mass = avgs.sum(-1, keepdims=True)
  rows = np.where(mass > 0, avgs / np.where(mass > 0, mass, 1), 0)
  w = np.where(mass[:, 0] > 0, np.diag(counts), 0) / np.diag(counts).max()
  L = len(avgs)
  off = np.arange(L)[:, None] - np.arange(L)[None, :] + L - 1

  def f(x):
    logits = x[:L][None, :] + x[L:][off]
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    g = w[:, None] * (np.exp(logp) * rows.sum(-1, keepdims=True) - rows)
    gr = np.zeros(2 * L - 1)
    np.add.at(gr, off, g)
    return -(w[:, None] * np.where(rows > 0, rows * logp, 0)).sum(), np.concatenate([g.sum(0),
                                                                                     gr])
  x = scipy.optimize.minimize(f, np.zeros(3 * L - 1), jac=True, method="L-BFGS-B",
                              options=dict(maxiter=5000, gtol=1e-10)).x
  logits = x[:L][None, :] + x[L:][off]
  p = np.exp(logits - logits.max(-1, keepdims=True))
  return p / p.sum(-1, keepdims=True)


@pytest.mark.integration
def test_constants_compressed_mean_equals_its_scipy_fit_and_masks_like_every_constant(
    minilm, sst2_padded):
  state, _ = _means_and_attention(minilm, sst2_padded)
  avgs = state.averages()
  p, info = constants.fit_compressed(avgs, state.counts)
  seen = state.counts > 0
  for l, h in ((0, 0), (3, 7), (5, 11)):
    want = _scipy_compressed(avgs[l, h].astype(np.float64), state.counts)
    assert np.abs(p[l, h] - want)[seen].max() <= 2e-3, (l, h)
  assert info["loss_change_last_10"] < 1e-2 and 0 < info["mean_kl_from_mean"] < 1
  # Its form, log P(i, j) = a(j) + r(i - j) - Z(i): shifting i, j and k by one changes
  # log P(i, j) - log P(i, k) by a(j) - a(k) - a(j+1) + a(k+1), whatever i is.
  lp = np.log(p[2, 5].astype(np.float64))
  j, k = 1, 4
  shift = [(lp[i, j] - lp[i, k]) - (lp[i + 1, j + 1] - lp[i + 1, k + 1]) for i in (2, 5, 8)]
  np.testing.assert_allclose(shift, shift[0], atol=1e-3)
  mask = jnp.asarray(sst2_padded.attention_mask[:2])
  masked = np.asarray(attention.constant_probs(jnp.asarray(p[1]), mask))
  for b in range(2):
    v = np.asarray(mask[b]) > 0
    q = p[1] * np.outer(v, v)
    np.testing.assert_allclose(masked[b], q / np.maximum(q.sum(-1, keepdims=True), 1e-12),
                               atol=1e-6)


@pytest.mark.integration
def test_orderings_gradient_importance_equals_finite_differences(minilm, sst2_padded):
  """|dL_b/dxi_bh| through HeadMask, against central differences of the loss (float64-free,
  so a loose tolerance), and the per-head mean over examples."""
  from papa_jax.probing import probes, train
  from papa_jax.papa import ordering_stage
  cfg = minilm.config
  probe = probes.SentenceProbe(2, cfg.hidden_size, 0.0)
  data = sst2_padded.take(np.arange(4))
  feats = jnp.stack(minilm.apply(data.input_ids, data.attention_mask).hidden_states, 1)
  params = probe.init(jax.random.key(1), feats[:1], jnp.asarray(data.attention_mask[:1]))["params"]
  batch = dict(data.arrays(), valid=np.ones(4, bool))
  fn = ordering_stage._gradient_fn(  # pylint: disable=protected-access
      train.FrozenEncoder(minilm.params, None, cfg), probe)
  got = jax.jit(fn)(params, batch)
  assert float(got["count"]) == 4

  def loss(b, xi):
    enc = train.FrozenEncoder(minilm.params, pj.AttentionOverride.intervene(pj.HeadMask(xi)),
                              cfg)
    logits = probe.apply({"params": params}, enc.features(batch, train=False),
                         batch["attention_mask"], deterministic=True)
    return float(probes.example_losses("classification", logits, batch["labels"])[b])

  eps = 1e-2
  for l, h in ((0, 3), (4, 9)):
    total = 0.0
    for b in range(4):
      up, down = np.ones((4, 6, 12), np.float32), np.ones((4, 6, 12), np.float32)
      up[b, l, h] += eps
      down[b, l, h] -= eps
      total += abs(loss(b, jnp.asarray(up)) - loss(b, jnp.asarray(down))) / (2 * eps)
    np.testing.assert_allclose(float(got["importance"][l, h]), total, rtol=0.05, atol=1e-5)
