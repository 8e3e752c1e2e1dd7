"""Bootstrap p-values, Holm's adjustment and the rank-correlation interval against oracles."""

import numpy as np
import pytest
import scipy.stats

from papa_jax import significance
from papa_jax.measures import rank_agreement

pytestmark = pytest.mark.unit


def test_bootstrap_p_value_inverts_the_printed_percentile_interval():
  """p >= 1 - level exactly when numpy's percentile interval at `level` contains 0, for
  any replicates (ties, many exact zeros, few replicates); p is twice the share of
  replicates beyond 0 up to the bootstrap's resolution."""
  rng = np.random.default_rng(0)
  for t in range(600):
    b = int(rng.integers(2, 300))
    x = rng.normal(rng.normal() * 0.8, 1.0, b)
    if t % 5 == 0:
      x = np.round(x, 1)  # Ties and exact zeros.
    p = significance.bootstrap_p_value(x)
    for level in (0.5, 0.9, 0.95, 0.99):
      lo, hi = np.percentile(x, [50 * (1 - level), 50 * (1 + level)])
      assert (lo <= 0 <= hi) == (p >= 1 - level), (t, level, p, lo, hi)
    share = min(1.0, 2 * min(np.mean(x <= 0), np.mean(x >= 0)))
    assert abs(p - share) <= 2 / (b - 1) + 1e-12
  assert significance.bootstrap_p_value(np.zeros(50)) == 1.0  # Identical conditions.
  assert significance.bootstrap_p_value(np.linspace(0.1, 1, 50)) == 0.0
  assert significance.bootstrap_p_value(-np.linspace(0.1, 1, 50)) == 0.0
  assert np.isnan(significance.bootstrap_p_value([0.1, np.nan, 0.2]))
  assert significance.format_p(0.0, 10_000) == "< 0.0001"
  assert significance.format_p(float("nan"), 10_000) == "–"


def _holm_reference(p):
  """Holm (1979) as written: the adjusted p_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))
  over the sorted p-values, by plain loops; NaN is not in the family."""
  p = np.asarray(p, np.float64)
  idx = [i for i in range(len(p)) if np.isfinite(p[i])]
  srt = sorted(idx, key=lambda i: p[i])
  m, out = len(srt), np.full(len(p), np.nan)
  for i_pos, i in enumerate(srt):
    out[i] = max(min(1.0, (m - j_pos) * p[j]) for j_pos, j in enumerate(srt[:i_pos + 1]))
  return out


def _holm_rejects(p, alpha):
  """Holm's step-down test at alpha: reject the smallest p-values while
  p_(k) <= alpha / (m - k + 1) (k from 1), stop at the first that fails."""
  p = np.asarray(p, np.float64)
  srt = np.argsort(p, kind="stable")
  m, out = len(p), np.zeros(len(p), bool)
  for k, i in enumerate(srt):
    if p[i] > alpha / (m - k):
      break
    out[i] = True
  return out


def test_holm_against_step_down_references():
  rng = np.random.default_rng(1)
  try:
    from statsmodels.stats.multitest import multipletests  # Test-only oracle where present.
  except ImportError:
    multipletests = None
  for t in range(200):
    m = int(rng.integers(1, 25))
    p = rng.uniform(0, 0.2, m) ** rng.uniform(0.5, 3)
    if t % 4 == 0:
      p = np.round(p, 2)  # Ties.
    got = np.array(rank_agreement.holm(list(p)), np.float64)
    np.testing.assert_allclose(got, _holm_reference(p), rtol=0, atol=1e-15)
    for alpha in (0.01, 0.05, 0.1):
      np.testing.assert_array_equal(got <= alpha, _holm_rejects(p, alpha))
    if multipletests is not None:
      np.testing.assert_allclose(got, multipletests(p, method="holm")[1], atol=1e-12)
  with_none = rank_agreement.holm([0.01, None, 0.04, 0.03])
  assert with_none[1] is None
  np.testing.assert_allclose([with_none[i] for i in (0, 2, 3)], [0.03, 0.06, 0.06])


def test_rank_correlation_interval_against_scipy():
  """rho is scipy's spearmanr; the interval is the percentile interval of spearmanr on
  each replicate (here: replicates that perturb every pair, with ties)."""
  rng = np.random.default_rng(2)
  n, b = 7, 400
  x, y = rng.normal(size=n), rng.normal(size=n)
  xr = np.round(x + 0.3 * rng.normal(size=(b, n)), 1)
  yr = np.round(y + 0.3 * rng.normal(size=(b, n)), 1)
  got = significance.rank_correlation(x, y, xr, yr, level=0.9)
  assert got["rho"] == pytest.approx(scipy.stats.spearmanr(x, y).statistic, abs=1e-12)
  per = [scipy.stats.spearmanr(xr[i], yr[i]).statistic for i in range(b)]
  np.testing.assert_allclose(got["ci"], np.percentile(per, [5, 95]), rtol=0, atol=1e-12)
  assert got["n"] == n and got["verdict"] in ("positive", "negative", "within noise")


def test_rank_correlation_pairs_bootstrap_equals_scipy_bootstrap():
  """Replicates that resample whole pairs give scipy.stats.bootstrap's paired percentile
  interval, draw for draw (same generator, same index matrix)."""
  rng = np.random.default_rng(3)
  n, b = 9, 999
  x = rng.normal(size=n)
  y = x + rng.normal(size=n)
  idx = np.random.default_rng(5).integers(0, n, (b, n))
  got = significance.rank_correlation(x, y, x[idx], y[idx])
  want = scipy.stats.bootstrap((x, y), lambda a, c: scipy.stats.spearmanr(a, c).statistic,
                               paired=True, vectorized=False, n_resamples=b,
                               method="percentile", rng=np.random.default_rng(5))
  ci = want.confidence_interval
  np.testing.assert_allclose(got["ci"], (ci.low, ci.high), rtol=0, atol=1e-12)


def test_rank_correlation_refused_below_n_min_and_verdicts():
  x = np.arange(4.0)
  few = significance.rank_correlation(x, x, np.tile(x, (10, 1)), np.tile(x, (10, 1)))
  assert few["verdict"] == "not tested" and few["rho"] is None and few["ci"] is None
  assert few["note"] == f"not tested: n = 4 < {significance.N_MIN_PAIRS} pairs"
  x = np.arange(6.0)
  reps = np.tile(x, (20, 1))
  assert significance.rank_correlation(x, x, reps, reps)["verdict"] == "positive"
  assert significance.rank_correlation(x, -x, reps, -reps)["verdict"] == "negative"
  flat = significance.rank_correlation(x, np.ones(6), reps, np.ones((20, 6)))
  assert flat["verdict"] == "undefined"
  with pytest.raises(ValueError, match="x_reps"):
    significance.rank_correlation(x, x, reps[:, :5], reps)
