"""Seed statistics and paired bootstrap intervals for task scores.

Prediction layouts (one array per probe seed, on the dev set):
  classification: int class ids `[N]`; regression: float `[N]`;
  tagging: int tag ids `[N, L]`, labels in the same layout with -100 at
  unscored positions. The resampling unit is the example (the sentence for
  tagging).

Scores are recomputed on each resample with the task's own metric, exactly:
every metric except Pearson/Spearman is a function of per-example sufficient
statistics summed over the dev set (`example_stats`, `aggregate`), so a
resample is `counts @ stats`, with `counts[b, i]` how often example i was
drawn. Pearson and Spearman are computed on the resampled arrays themselves
(ties from repeated draws get average ranks, as `metrics.spearman`).

Random streams (so that a plain loop can reproduce every number):
  example indices: `np.random.default_rng([seed, 0]).integers(0, N, size=N)`,
    B times in a row (the same values as one `(B, N)` draw); shared by every
    condition resampled with that `seed`, which makes comparisons paired.
  seed indices of condition `stream`:
    `np.random.default_rng([seed, 1, stream]).integers(0, S, size=(B, S))`.

Intervals are percentile intervals of the B bootstrap replicates. Considered
and not used: the basic (reverse-percentile) interval, which can leave a
metric's range; BCa, whose acceleration needs a jackknife over examples and
seeds; studentized intervals, which need a nested bootstrap. With S seeds the
seed bootstrap sees only S values, and the bootstrap variance of their mean is
(S-1)/S times the usual s^2/S (2/3 of it for 3 seeds): few seeds make every
interval optimistic.

Speed (2 shared CPU cores, 3+3 seeds, `paired_bootstrap`, B=1000 / 10,000):
SST-2 (872) 0.02-0.05 / 0.3 s, MNLI (9,815) 0.1-0.4 / 2.7-4.3 s, QQP (40,430)
0.9-1.6 / 10-13 s, STS-B (1,500) 0.13-0.23 / 1.7-2.1 s, CoNLL NER dev (3,250
sentences) 0.3-0.5 / 1.6 s (chunking each distinct tag sequence once); 370 MB.
"""

from __future__ import annotations

import math
import zlib
from typing import Mapping, Sequence

import numpy as np
import scipy.stats

from papa_jax import significance
from papa_jax.probing import metrics

# Rows of the [rows, N] count matrix built at once: bounds memory (16 MiB)
# on large dev sets (QQP: 40k examples) without slowing small ones.
_CHUNK_ELEMENTS = 1 << 21
# Replicates by default: a 2.5% percentile's Monte Carlo error is 0.083 sigma at
# B = 1,000, 0.026 sigma at 10,000 (normal replicates of spread sigma).
N_BOOT = 10_000


def task_seed(seed: int, task_name: str) -> int:
  """The bootstrap RNG seed of a task: one per task, shared by its models (the report's, and
  every run's learned-nothing check)."""
  return zlib.crc32(f"{seed}/{task_name}".encode())


def seed_summary(scores: Sequence[float]) -> dict:
  """Mean and sample standard deviation (ddof=1) of per-seed scores.

  One seed has no seed variance to estimate: std is NaN (shown as "–"),
  never 0.0, which would read as "no seed noise".

  Returns:
    dict(mean, std, n).
  """
  x = np.asarray(list(scores), np.float64)
  if x.size == 0:
    raise ValueError("seed_summary needs at least one score.")  # caller's argument
  std = float(np.std(x, ddof=1)) if x.size > 1 else float("nan")
  return dict(mean=float(np.mean(x)), std=std, n=int(x.size))


def _metric(task, metric: str | None) -> str:
  metric = metric or task.headline_metric
  if metric not in task.metrics:
    # caller's argument
    raise ValueError(f"Task {task.name!r} has no metric {metric!r}; it has {task.metrics}.")
  return metric


def _stack(preds) -> np.ndarray:
  """Per-seed predictions (mapping seed -> array, or a sequence) as `[S, ...]`."""
  if isinstance(preds, Mapping):
    preds = [preds[s] for s in sorted(preds)]
  out = np.stack([np.asarray(p) for p in preds])
  if out.shape[0] == 0:
    raise ValueError("No seeds given.")  # caller's argument
  return out


def tagging_context(task, labels: np.ndarray) -> tuple[list, dict] | None:
  """Gold entities per sentence, and a memo of chunked tag sequences.

  Chunking is the slow part (pure Python); most predicted sentences repeat
  across seeds and conditions (often equal to gold), so each distinct
  sequence is chunked once.
  """
  if task.kind != "tagging" or "f1" not in task.metrics:
    return None
  memo, names = {}, np.asarray(task.label_names)
  return [_entities(names, t[t != -100], memo) for t in labels], memo, names


def _entities(names: np.ndarray, ids: np.ndarray, memo: dict) -> set:
  key = ids.astype(np.int64).tobytes()
  if key not in memo:
    memo[key] = metrics.entities(list(names[ids]))
  return memo[key]


def _tagging_stats(task, pred: np.ndarray, labels: np.ndarray, context=None) -> np.ndarray:
  """Per sentence: (tp, n_pred, n_true) entities, then (correct, total) tokens."""
  keep = labels != -100
  correct = ((pred == labels) & keep).sum(1)
  total = keep.sum(1)
  if "f1" not in task.metrics:
    return np.stack([correct, total], 1).astype(np.float64)
  gold, memo, names = context or tagging_context(task, labels)
  out = np.zeros((len(labels), 5), np.float64)
  for i, (p, k, et) in enumerate(zip(pred, keep, gold)):
    ep = _entities(names, p[k], memo)
    out[i, :3] = len(ep & et), len(ep), len(et)
  out[:, 3], out[:, 4] = correct, total
  return out


def example_stats(task, labels: np.ndarray, pred: np.ndarray, metric: str | None = None,
                  *, context=None):
  """Per-example sufficient statistics of `metric`, `[N, K]` float64.

  Returns None for Pearson/Spearman, which have none (see module docstring).
  `context`: `tagging_context(task, labels)`, to share across seeds.
  """
  metric = _metric(task, metric)
  labels, pred = np.asarray(labels), np.asarray(pred)
  if pred.shape != labels.shape:
    # caller's argument
    raise ValueError(f"Predictions {pred.shape} and labels {labels.shape} differ in shape.")
  if task.kind == "tagging":
    return _tagging_stats(task, pred, labels, context)
  if metric in ("pearson", "spearman"):
    return None
  if metric == "accuracy":
    return np.stack([pred == labels, np.ones(len(labels))], 1).astype(np.float64)
  if metric == "f1":
    p, t = pred == 1, labels == 1
    return np.stack([p & t, p, t], 1).astype(np.float64)
  if metric == "matthews_correlation":
    # Confusion-matrix cell (label, pred) of each example, one-hot; classes
    # absent from both arrays add zero rows and columns, which leave MCC as is.
    k = max(len(task.label_names), int(max(pred.max(), labels.max())) + 1)
    out = np.zeros((len(labels), k * k), np.float64)
    out[np.arange(len(labels)), labels * k + pred] = 1.0
    return out
  raise ValueError(f"Unknown metric {metric!r}.")  # caller's argument


def aggregate(task, sums: np.ndarray, metric: str | None = None) -> np.ndarray:
  """Scores from summed sufficient statistics: `[..., K] -> [...]`.

  Same operations as `papa_jax.probing.metrics` on integer-valued float64 sums, so
  the full-data result equals it bit for bit.
  """
  metric = _metric(task, metric)
  s = np.asarray(sums, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    if task.kind == "tagging":
      if metric == "accuracy":
        c, n = s[..., -2], s[..., -1]
        return np.where(n > 0, c / n, 0.0)
      tp, n_pred, n_true = s[..., 0], s[..., 1], s[..., 2]
      prec = np.where(n_pred > 0, tp / n_pred, 0.0)
      rec = np.where(n_true > 0, tp / n_true, 0.0)
      if metric == "precision":
        return prec
      if metric == "recall":
        return rec
      return np.where(prec + rec > 0, 2 * prec * rec / (prec + rec), 0.0)
    if metric == "accuracy":
      return np.where(s[..., 1] > 0, s[..., 0] / s[..., 1], 0.0)
    if metric == "f1":
      denom = s[..., 1] + s[..., 2]
      return np.where(denom > 0, 2 * s[..., 0] / denom, 0.0)
    if metric == "matthews_correlation":
      k = math.isqrt(s.shape[-1])
      c = s.reshape(s.shape[:-1] + (k, k))
      t, p = c.sum(-1), c.sum(-2)
      n = c.sum((-1, -2))
      correct = np.trace(c, axis1=-2, axis2=-1)
      denom = np.sqrt((n * n - (p * p).sum(-1)) * (n * n - (t * t).sum(-1)))
      return np.where(denom > 0, (correct * n - (t * p).sum(-1)) / denom, 0.0)
  raise ValueError(f"Metric {metric!r} has no sufficient statistics.")  # caller's argument


def _rowwise_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """`metrics.pearson` of each row pair of `[R, N]` arrays."""
  x = x - x.mean(1, keepdims=True)
  y = y - y.mean(1, keepdims=True)
  denom = np.sqrt((x * x).sum(1) * (y * y).sum(1))
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(denom > 0, (x * y).sum(1) / denom, 0.0)


def metric_score(task, labels: np.ndarray, pred: np.ndarray, metric: str | None = None, *,
                 context=None) -> float:
  """The metric on the full data through the bootstrap's code path (weights 1)."""
  metric = _metric(task, metric)
  stats = example_stats(task, labels, pred, metric, context=context)
  if stats is None:  # Correlations: the pipeline's own scorer, to the last bit.
    return float(metrics.classification_scores(
        [metric], np.asarray(pred, np.float64), np.asarray(labels, np.float64))[metric])
  return float(aggregate(task, stats.sum(0), metric))


def _example_index_chunks(n: int, n_boot: int, seed: int):
  """Yields `[rows, N]` example-index blocks of the documented stream."""
  rng = np.random.default_rng([seed, 0])
  rows = max(1, _CHUNK_ELEMENTS // max(n, 1))
  for start in range(0, n_boot, rows):
    yield rng.integers(0, n, size=(min(rows, n_boot - start), n))


def seed_scores(task, labels: np.ndarray, preds, *, n_boot: int = N_BOOT, seed: int = 0,
                metric: str | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Each probe seed's metric on the full dev set and on each example resample.

  Args:
    preds: per-seed predictions, `{seed: array}` or a sequence, each in the
      layout of `labels`.
    seed: the RNG seed (module docstring); equal seeds resample the same examples.

  Returns:
    full `[S]` and resampled `[B, S]` float64 scores; column s is the s-th seed
    in sorted order.
  """
  return seed_scores_many(task, labels, [preds], n_boot=n_boot, seed=seed, metric=metric)[0]


def seed_scores_many(task, labels: np.ndarray, conditions: Sequence, *, n_boot: int = N_BOOT,
                     seed: int = 0,
                     metric: str | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
  """`seed_scores` of several conditions on the same resamples, drawn once."""
  metric = _metric(task, metric)
  labels = np.asarray(labels)
  preds = [_stack(c) for c in conditions]
  sizes = [len(p) for p in preds]
  n = len(labels)
  out = np.empty((n_boot, sum(sizes)), np.float64)
  row = 0
  context = tagging_context(task, labels)
  stats = [example_stats(task, labels, p, metric, context=context) for c in preds for p in c]
  if stats[0] is not None:
    full = aggregate(task, np.stack([s.sum(0) for s in stats]), metric)
    k = stats[0].shape[1]
    flat = np.concatenate(stats, 1)  # [N, seeds * K], every condition's seeds.
    for idx in _example_index_chunks(n, n_boot, seed):
      r = len(idx)
      counts = np.bincount((idx + n * np.arange(r)[:, None]).ravel(),
                           minlength=r * n).reshape(r, n).astype(np.float64)
      out[row:row + r] = aggregate(task, (counts @ flat).reshape(r, len(stats), k), metric)
      row += r
  else:
    full = np.array([metric_score(task, labels, p, metric) for c in preds for p in c])
    y_all = labels.astype(np.float64)
    x_all = [p.astype(np.float64) for c in preds for p in c]
    for idx in _example_index_chunks(n, n_boot, seed):
      y = y_all[idx]
      if metric == "spearman":
        y = scipy.stats.rankdata(y, axis=1)
      for s, x in enumerate(x_all):
        x = x[idx]
        if metric == "spearman":
          x = scipy.stats.rankdata(x, axis=1)
        out[row:row + len(idx), s] = _rowwise_pearson(x, y)
      row += len(idx)
  ends = np.cumsum(sizes)
  return [(full[e - z:e], out[:, e - z:e]) for z, e in zip(sizes, ends)]


def seed_means(per_seed: np.ndarray, *, seed: int = 0, stream: int = 0) -> np.ndarray:
  """Resamples seeds with replacement in each replicate and averages: `[B, S] -> [B]`."""
  n_boot, n_seeds = per_seed.shape
  idx = np.random.default_rng([seed, 1, stream]).integers(0, n_seeds, size=(n_boot, n_seeds))
  return np.take_along_axis(per_seed, idx, 1).mean(1)


def percentile_interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
  """Percentile interval (numpy's linear interpolation); NaN if any replicate is NaN."""
  samples = np.asarray(samples, np.float64)
  if not np.all(np.isfinite(samples)):
    return float("nan"), float("nan")
  lo, hi = np.percentile(samples, [50 * (1 - level), 50 * (1 + level)])
  return float(lo), float(hi)


def relative_drop(base, treat):
  """`(base - treat) / base`; NaN where base <= 0 (a drop relative to a
  non-positive score, e.g. MCC <= 0, has no meaning)."""
  base, treat = np.asarray(base, np.float64), np.asarray(treat, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    out = np.where(base > 0, (base - treat) / base, np.nan)
  return float(out) if out.ndim == 0 else out


def compare(base_samples: np.ndarray, treat_samples: np.ndarray, base_point: float,
            treat_point: float, level: float = 0.95) -> dict:
  """Relative drop and absolute difference with percentile intervals.

  Args:
    base_samples, treat_samples: `[B]` paired bootstrap replicates.
    base_point, treat_point: the full-data estimates (means over seeds).

  Returns:
    dict(relative_drop, relative_drop_ci, abs_diff, abs_diff_ci,
    undefined_resamples, p_value, within_noise). `within_noise` is whether
    `relative_drop_ci` (the interval the report prints) contains 0, and
    `p_value` is `significance.bootstrap_p_value` of the same replicates
    (`p_value >= 1 - level` exactly when `within_noise`). A drop relative to a
    baseline <= 0, on the data or in any replicate, is undefined: its
    interval is NaN, `p_value` NaN and `within_noise` None, never True.
  """
  rel = relative_drop(base_samples, treat_samples)
  diff = np.asarray(base_samples) - np.asarray(treat_samples)
  rel_ci, diff_ci = percentile_interval(rel, level), percentile_interval(diff, level)
  point = relative_drop(base_point, treat_point)
  defined = bool(np.isfinite(point) and np.all(np.isfinite(rel_ci)))
  return dict(relative_drop=point, relative_drop_ci=rel_ci,
              abs_diff=float(base_point - treat_point), abs_diff_ci=diff_ci,
              undefined_resamples=int(np.sum(~np.isfinite(rel))),
              p_value=significance.bootstrap_p_value(rel) if defined else float("nan"),
              within_noise=bool(rel_ci[0] <= 0.0 <= rel_ci[1]) if defined else None)


def paired_bootstrap(task, labels: np.ndarray, baseline, treatment, *, n_boot: int = N_BOOT,
                     seed: int = 0, metric: str | None = None, level: float = 0.95,
                     streams: tuple[int, int] = (0, 1), return_samples: bool = False) -> dict:
  """Paired bootstrap of the drop from `baseline` to `treatment`.

  Each replicate draws N dev examples with replacement (the same ones for both
  conditions), and S seeds with replacement per condition from its `streams`
  entry; each condition's score is its metric averaged over the drawn seeds.
  Equal streams draw the same seed positions for both conditions (seed
  pairing: right when the conditions ran with the same seeds, since a seed
  fixes a probe's initialisation, data order and dropout; the report's
  default); different streams resample them independently (wider).

  Args:
    baseline, treatment: per-seed predictions (`{seed: array}` or sequence);
      the seed counts may differ.
    streams: seed-resampling streams of the two conditions (module docstring).

  Returns:
    dict(metric, n_examples, n_boot, level, method, n_seeds_baseline,
    n_seeds_treatment, baseline, treatment (full-data means over seeds),
    baseline_seeds, treatment_seeds (per-seed full-data scores), and the
    keys of `compare`); with `return_samples`, `samples` holds the `[B]`
    replicates of baseline, treatment, relative_drop and abs_diff.
  """
  metric = _metric(task, metric)
  (base_full, base_b), (treat_full, treat_b) = seed_scores_many(
      task, labels, [baseline, treatment], n_boot=n_boot, seed=seed, metric=metric)
  base_b = seed_means(base_b, seed=seed, stream=streams[0])
  treat_b = seed_means(treat_b, seed=seed, stream=streams[1])
  out = dict(metric=metric, n_examples=len(labels), n_boot=n_boot, level=level,
             method="percentile", n_seeds_baseline=len(base_full),
             n_seeds_treatment=len(treat_full), baseline=float(base_full.mean()),
             treatment=float(treat_full.mean()), baseline_seeds=base_full.tolist(),
             treatment_seeds=treat_full.tolist())
  out.update(compare(base_b, treat_b, out["baseline"], out["treatment"], level))
  if return_samples:
    out["samples"] = dict(baseline=base_b, treatment=treat_b,
                          relative_drop=relative_drop(base_b, treat_b), abs_diff=base_b - treat_b)
  return out


def score_band(task, labels: np.ndarray, preds, *, n_boot: int = N_BOOT, seed: int = 0,
               metric: str | None = None, level: float = 0.95, stream: int = 0) -> dict:
  """One condition's score: mean ± std over seeds and a bootstrap interval.

  Returns:
    dict(mean, std, n (seeds), ci, seeds (per-seed full-data scores)).
  """
  metric = _metric(task, metric)
  full, b = seed_scores(task, labels, preds, n_boot=n_boot, seed=seed, metric=metric)
  b = seed_means(b, seed=seed, stream=stream)
  return dict(seed_summary(full), ci=percentile_interval(b, level), seeds=full.tolist())


def curve(task, labels: np.ndarray, preds_by_k: Mapping[int, object], *, n_boot: int = N_BOOT,
          seed: int = 0, metric: str | None = None, level: float = 0.95) -> list[dict]:
  """`score_band` for each number of constant heads k, ascending.

  Every k is resampled on the same dev examples (one `seed`), so differences
  between points of a curve are paired; the seed stream of point k is k.
  """
  ks = sorted(preds_by_k)
  scored = seed_scores_many(task, labels, [preds_by_k[k] for k in ks], n_boot=n_boot, seed=seed,
                            metric=metric)
  return [dict(k=int(k), **seed_summary(full), seeds=full.tolist(), ci=percentile_interval(
      seed_means(b, seed=seed, stream=int(k)), level)) for k, (full, b) in zip(ks, scored)]
