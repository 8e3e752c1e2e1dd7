"""Agreement between per-head scores: Spearman rho with a within-layer permutation test,
and Holm's adjustment for a table of them."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.stats


def head_rank_agreement(x: np.ndarray, y: np.ndarray, *, n_perm: int = 2000,
                        seed: int = 0) -> dict:
  """Spearman rho of two per-head scores `[layers, heads]`, with scipy's two-sided p-value
  and a permutation p-value that shuffles `y`'s heads within each layer (depth drives most
  head scores; shared/spec/context_mixing.md §12.4). None where undefined (a constant input).

  Returns:
    dict(rho, p_value, p_within_layers, heads, permutations).
  """
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.shape != y.shape or x.ndim != 2:
    # caller's argument
    raise ValueError(f"head scores must both be [layers, heads]; got {x.shape} and {y.shape}")
  out = dict(rho=None, p_value=None, p_within_layers=None, heads=int(x.size),
             permutations=n_perm)
  if not (np.ptp(x) > 0 and np.ptp(y) > 0) or x.size < 4:
    return out
  r = scipy.stats.spearmanr(x.ravel(), y.ravel())
  rx = scipy.stats.rankdata(x.ravel())
  ry = scipy.stats.rankdata(y.ravel()).reshape(y.shape)
  perms = np.random.default_rng([seed, 2718]).permuted(
      np.broadcast_to(ry, (n_perm,) + y.shape), axis=-1).reshape(n_perm, -1)
  cx = rx - rx.mean()
  cy = perms - perms.mean(-1, keepdims=True)
  null = cy @ cx / (np.linalg.norm(cy, axis=-1) * np.linalg.norm(cx))
  hits = np.sum(np.abs(null) >= abs(float(r.statistic)) - 1e-12)
  out.update(rho=float(r.statistic), p_value=float(r.pvalue),
             p_within_layers=float((1 + hits) / (1 + n_perm)))
  return out


def holm(p_values: Sequence[float | None]) -> list[float | None]:
  """Holm's step-down adjustment of a family of p-values (None stays None)."""
  idx = [i for i, p in enumerate(p_values) if p is not None]
  order = sorted(idx, key=lambda i: p_values[i])
  out: list[float | None] = [None] * len(p_values)
  running = 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (len(order) - rank) * p_values[i]))
    out[i] = running
  return out
