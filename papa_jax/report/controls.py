"""PAPA's controls in the report: does the learned order beat random, the mean beat uniform?

For one experiment whose workdir ran other head orderings (`papa.orderings`)
or constant choices (`papa.variants`), `analyse` gives:
  * curves: the score at every static-head count for each ordering with the
    raw mean (mean and std over probe seeds; for "random", the draws x seeds
    pooled, with the spread of the per-draw means: the null curve);
  * vs_random: per ordering and per fraction strictly between 0 and 1, the
    paired-bootstrap interval of `score(ordering) - score(random)`;
  * vs_uniform: per fraction, the interval of `score(mean) - score(uniform)`
    (and of the other constants against uniform), with PAPA's ordering;
  * vs_optimal: the same against the loss-optimal constant (`papa/optimal.py`):
    how far PAPA's mean and uniform attention fall short of the best constant;
  * spearman: the rank correlation of every two orderings (with p-values);
  * sentences saying, per comparison, whether one beats the other or the
    difference is within noise (its interval contains 0).
Every condition is resampled on the same dev examples as the main report
(`uncertainty.task_seed`), so the differences are paired; seeds (and draws) are
resampled independently per condition.
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import scipy.stats

from papa_jax import significance, uncertainty
from papa_jax.report.markdown import fraction_label

RANDOM = "random"
CONTROL_VARIANTS = ("uniform", "row_mean", "compressed", "optimal")  # papa/constants.py
REFERENCES = ("uniform", "optimal")  # Every other constant is compared with each present.

def _split(condition: str) -> tuple[str, str]:
  """`results.condition`'s name back into (variant, ordering)."""
  variant, _, ordering = condition.partition("/")
  return variant, ordering or "lambda"


def _groups(exp) -> dict[tuple[str, str, int], dict]:
  """(variant, ordering, k) -> {seed or (draw, seed): predictions}; draws pooled as "random"."""
  out: dict[tuple[str, str, int], dict] = {}
  for (condition, k), by_seed in exp.predictions.items():
    variant, ordering = _split(condition)
    if ordering.startswith(RANDOM + "_"):
      draw = int(ordering.split("_")[1])
      out.setdefault((variant, RANDOM, k), {}).update({(draw, s): p for s, p in by_seed.items()})
    else:
      out[(variant, ordering, k)] = dict(by_seed)
  return out


def _stream(condition: tuple) -> int:
  """The seed-resampling stream of a condition (reproducible across processes)."""
  return zlib.crc32(("controls/" + "/".join(map(str, condition))).encode())


def _draw_spread(preds: dict, task, labels, metric) -> float | None:
  """Std over random draws of each draw's mean score over seeds (the null curve's spread)."""
  per_draw: dict[int, list[float]] = {}
  for (draw, _), p in preds.items():
    per_draw.setdefault(draw, []).append(uncertainty.metric_score(task, labels, p, metric))
  means = [np.mean(v) for v in per_draw.values()]
  return float(np.std(means, ddof=1)) if len(means) > 1 else None


def _verdict(ci, better: str, worse: str) -> str:
  if not np.all(np.isfinite(ci)):
    return "undefined"
  if ci[0] > 0:
    return f"{better} beats {worse}"
  if ci[1] < 0:
    return f"{worse} beats {better}"
  return "within noise"


def analyse(exp, *, rng_seed: int, n_boot: int = uncertainty.N_BOOT,
            level: float = 0.95) -> dict | None:
  """The controls of one `report.Experiment` (None when it ran none)."""
  task, labels, total = exp.task, exp.labels, exp.total_heads
  metric = task.headline_metric
  groups = _groups(exp)
  orderings = sorted({o for _, o, _ in groups}, key=lambda o: (o != "lambda", o))
  variants = sorted({v for v, _, _ in groups}, key=lambda v: (v != "raw", v))
  if labels is None or (orderings == ["lambda"] and not set(variants) & set(CONTROL_VARIANTS)):
    return None
  ks = sorted({k for _, _, k in groups})
  base = groups.get(("raw", "lambda", 0))
  keys = list(groups)
  scored = dict(zip(keys, uncertainty.seed_scores_many(
      task, labels, [list(groups[c].values()) for c in keys], n_boot=n_boot, seed=rng_seed,
      metric=metric)))
  reps = {c: uncertainty.seed_means(b, seed=rng_seed, stream=_stream(c))
          for c, (_, b) in scored.items()}

  def get(variant: str, ordering: str, k: int):
    """A condition; k = 0 is the shared baseline, and k = total is the same for every order."""
    if k == 0 and base is not None:
      return ("raw", "lambda", 0)
    for c in ((variant, ordering, k), (variant, "lambda", k) if k == total else None):
      if c in scored:
        return c
    return None

  curves = []
  for variant, ordering in [("raw", o) for o in orderings] + [(v, "lambda") for v in variants
                                                              if v != "raw"]:
    for k in ks:
      c = get(variant, ordering, k)
      if c is None:
        continue
      full = scored[c][0]
      row = dict(variant=variant, ordering=ordering, static_heads=k,
                 fraction=k / total, fraction_label=fraction_label(k, total),
                 **uncertainty.seed_summary(full),
                 ci=uncertainty.percentile_interval(reps[c], level))
      if ordering == RANDOM and c[1] == RANDOM:
        row["draw_std"] = _draw_spread(groups[c], task, labels, metric)
      curves.append(row)

  def compare(a, b, better, worse, **tags):
    diff = reps[a] - reps[b]
    ci = uncertainty.percentile_interval(diff, level)
    point = float(scored[a][0].mean() - scored[b][0].mean())
    return dict(tags, diff=point, ci=ci, within_noise=bool(ci[0] <= 0 <= ci[1]),
                p_value=significance.bootstrap_p_value(diff), verdict=_verdict(ci, better, worse))

  interior = [k for k in ks if 0 < k < total]
  vs_random = [compare(get("raw", o, k), get("raw", RANDOM, k), o, RANDOM, ordering=o,
                       static_heads=k, fraction_label=fraction_label(k, total))
               for o in orderings if o != RANDOM for k in interior
               if get("raw", o, k) and get("raw", RANDOM, k)]
  against = {ref: [compare(get(v, "lambda", k), get(ref, "lambda", k), v, ref, variant=v,
                           static_heads=k, fraction_label=fraction_label(k, total))
                   for v in variants if v != ref for k in ks if k > 0
                   if get(v, "lambda", k) and get(ref, "lambda", k)] for ref in REFERENCES}
  return dict(model=exp.model, task=task.name, metric=metric, total_heads=total,
              orderings=orderings, variants=variants, curves=curves, vs_random=vs_random,
              vs_uniform=against["uniform"], vs_optimal=against["optimal"],
              spearman=spearman(exp.orderings or {}),
              optimal_objective=getattr(exp, "optimal_objective", "task"),
              sentences=sentences(vs_random, against["uniform"], against["optimal"]))


def comparisons(control: dict) -> list[dict]:
  """Every comparison of an experiment's controls (one Holm family over the report)."""
  return control["vs_random"] + control["vs_uniform"] + control.get("vs_optimal", [])


def spearman(rankings: dict[str, list]) -> list[dict]:
  """Rank correlation of every two orderings' head positions, with p-values."""
  names = [n for n in rankings if not n.startswith(RANDOM + "_")]
  names += sorted(n for n in rankings if n.startswith(RANDOM + "_"))[:1]  # One random draw.
  pos = {}
  for name in names:
    order = np.asarray(rankings[name])
    heads = int(order[:, 1].max()) + 1
    p = np.empty(len(order))
    p[order[:, 0] * heads + order[:, 1]] = np.arange(len(order))
    pos[name] = p
  out = []
  for a, b in itertools.combinations(names, 2):
    r = scipy.stats.spearmanr(pos[a], pos[b])
    out.append(dict(a=a, b=b, rho=float(r.statistic), p_value=float(r.pvalue), heads=len(pos[a])))
  return out


def sentences(vs_random: list[dict], vs_uniform: list[dict],
              vs_optimal: list[dict] = ()) -> list[str]:
  """One sentence per question: each ordering against random, each constant against uniform
  and against the loss-optimal constant."""
  out = []
  for key, rows, what in (("ordering", vs_random, "random"), ("variant", vs_uniform, "uniform"),
                          ("variant", vs_optimal, "optimal")):
    for name in dict.fromkeys(r[key] for r in rows):
      mine = [r for r in rows if r[key] == name]
      parts = [f"{r['fraction_label']}: {r['diff']:+.4f} [{r['ci'][0]:+.4f}, {r['ci'][1]:+.4f}] "
               f"({r['verdict']})" for r in mine]
      wins = sum(r["verdict"] == f"{name} beats {what}" for r in mine)
      losses = sum(r["verdict"] == f"{what} beats {name}" for r in mine)
      out.append(f"{name} vs {what}: {name} is better at {wins}, worse at {losses} and within "
                 f"noise at {len(mine) - wins - losses} of {len(mine)} fractions (" +
                 "; ".join(parts) + ").")
  return out
