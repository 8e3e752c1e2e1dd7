"""Bootstrap tests for the report: p-values dual to its intervals, a rank correlation.

p-values. For bootstrap replicates d*_1..d*_B of a statistic, the report's
interval at `level` is the percentile interval (`uncertainty.percentile_interval`,
numpy's linear interpolation). `bootstrap_p_value` is the two-sided p-value of
"d = 0" that inverts exactly that interval: the smallest alpha at which the
(1 - alpha) percentile interval excludes 0. So `p < 1 - level` holds exactly
when the printed interval excludes 0, and a verdict from p never contradicts
the interval beside it. It is twice the (interpolated) share of replicates on
the far side of 0, capped at 1: within 2 / (B - 1) of
2 min(#{d* <= 0}, #{d* >= 0}) / B. With
every replicate on one side p is 0, i.e. below the bootstrap's resolution
1 / (B - 1); the report prints it as "< 1/(B-1)". Holm's step-down adjustment
of a family of them is `rank_agreement.holm` (valid under any dependence
between the tests, which share dev examples).

Rank correlation. `rank_correlation` gives Spearman's rho of n pairs with a
percentile interval over replicates supplied by the caller (the report's:
each cell's baseline score and relative drop on the same resample of its dev
examples and probe seeds), and refuses to test below `N_MIN_PAIRS` pairs.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.stats

# Fewest pairs for a correlation claim: with 4 pairs even a perfect ranking
# (rho = +-1) arises by chance 2 times in 24 (8%, exact permutation test), so
# no result on 4 could reach 5%; with 5 it is 2 in 120.
N_MIN_PAIRS = 5


def _share_at_most_zero(x: np.ndarray) -> float:
  """sup{q in [0, 1]: Q(q) <= 0} for the linear-interpolation quantile Q of sorted `x`
  (0 when Q(0) > 0)."""
  if x[0] > 0:
    return 0.0
  if x[-1] <= 0:
    return 1.0
  j = int(np.searchsorted(x, 0.0, side="right")) - 1  # x[j] <= 0 < x[j + 1].
  return (j + (-x[j]) / (x[j + 1] - x[j])) / (len(x) - 1)


def bootstrap_p_value(samples) -> float:
  """Two-sided bootstrap p-value of "statistic = 0", dual to the percentile interval.

  Returns:
    p in [0, 1]; NaN if there are no replicates or any is not finite (the
    interval is then undefined too).
  """
  x = np.sort(np.asarray(samples, np.float64).ravel())
  if x.size == 0 or not np.all(np.isfinite(x)):
    return float("nan")
  if x.size == 1:
    return 1.0 if x[0] == 0 else 0.0
  # Lower end Q(alpha/2) > 0 iff alpha > 2 q0; upper end Q(1 - alpha/2) < 0 iff
  # alpha > 2 (1 - q1), q1 = inf{q: Q(q) >= 0}; by symmetry 1 - q1 is q0 of -x.
  return float(min(1.0, 2 * _share_at_most_zero(x), 2 * _share_at_most_zero(-x[::-1])))


def format_p(p, n_boot: int) -> str:
  """A p-value as the report prints it ("–" undefined, "< 1/(B-1)" for 0)."""
  if p is None or not math.isfinite(p):
    return "–"
  if p == 0:
    return f"< {1 / max(n_boot - 1, 1):.1g}"
  return f"{p:.2g}" if p < 0.01 else f"{p:.3f}"


def rowwise_spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Spearman's rho of each row pair of `[R, n]` arrays (average ranks for ties); NaN
  for a row where either side is constant (scipy.stats.spearmanr's answer too)."""
  x = scipy.stats.rankdata(x, axis=1)
  y = scipy.stats.rankdata(y, axis=1)
  x = x - x.mean(1, keepdims=True)
  y = y - y.mean(1, keepdims=True)
  denom = np.sqrt((x * x).sum(1) * (y * y).sum(1))
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(denom > 0, (x * y).sum(1) / denom, np.nan)


def rank_correlation(x, y, x_reps, y_reps, *, level: float = 0.95,
                     n_min: int = N_MIN_PAIRS) -> dict:
  """Spearman's rho of the pairs (x_i, y_i) with a percentile bootstrap interval.

  Args:
    x, y: `[n]` full-data values.
    x_reps, y_reps: `[B, n]` replicates; row b of both comes from one
      bootstrap draw, so the pairing of x_i and y_i is kept.
    n_min: fewer pairs than this are not tested (verdict "not tested").

  Returns:
    dict(n, n_min, rho, ci, verdict, note): verdict "positive" or "negative"
    when the interval excludes 0 on that side, "within noise" when it
    contains 0, "undefined" when rho is (a constant side, in the data or in
    a replicate), "not tested" below n_min; rho and ci are None when not
    tested.
  """
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  x_reps, y_reps = np.asarray(x_reps, np.float64), np.asarray(y_reps, np.float64)
  n = int(x.size)
  if x_reps.shape != y_reps.shape or x_reps.shape[1:] != (n,) or y.shape != (n,):
    # caller's argument
    raise ValueError(f"rank_correlation: x {x.shape}, y {y.shape}, x_reps {x_reps.shape} and "
                     f"y_reps {y_reps.shape} must be [n] and [B, n] with one n.")
  out = dict(n=n, n_min=n_min, rho=None, ci=None, verdict="not tested",
             note=f"not tested: n = {n} < {n_min} pairs")
  if n < n_min:
    return out
  rho = float(rowwise_spearman(x[None], y[None])[0])
  reps = rowwise_spearman(x_reps, y_reps)
  ci = (float("nan"),) * 2
  if np.all(np.isfinite(reps)):
    ci = tuple(float(v) for v in np.percentile(reps, [50 * (1 - level), 50 * (1 + level)]))
  out.update(rho=rho, ci=ci, note="")
  if not (math.isfinite(rho) and np.all(np.isfinite(ci))):
    out.update(verdict="undefined", note="a constant side (in the data or a replicate)")
  else:
    out["verdict"] = ("positive" if ci[0] > 0 else "negative" if ci[1] < 0 else "within noise")
  return out
