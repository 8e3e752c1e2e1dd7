"""The report's claims: which cells may enter them, averages, Holm, the correlation.

Informative cells. A (model, task) cell enters the claims (per-model averages,
the comparison with the paper's 8%, the correlation, the counts of drops
within noise) only if its baseline probe is clearly above chance: the
`level` percentile interval of `baseline - constant` excludes 0 from above,
where `constant` is the score of the best constant prediction on the dev set
(`papa_jax.chance`, the check every run writes), resampled on the same dev examples as
the baseline. Other cells
are *uninformative*: still tabled, never counted. A cell without baseline
predictions cannot be checked and is left out too.

Multiplicity. The relative drops of the main table (all and half the heads
constant, informative cells, defined intervals) and the per-model average
drops over two or more tasks form one family; each has the bootstrap p-value dual to its printed
interval (`significance.bootstrap_p_value`) and a Holm-adjusted p-value
(`rank_agreement.holm`). The adjusted verdict is "within noise" when the
adjusted p is >= 1 - level; it is never less cautious than the interval's.
"""

from __future__ import annotations

import math

import numpy as np

from papa_jax import results as results_lib, significance, uncertainty
from papa_jax.measures import rank_agreement

PAPER_ALL_HEADS_DROP = 0.08  # Hassid et al. 2022: about 8% with every head constant.
HALF_HEADS_MARGIN = 0.02  # "Almost no drop" with half the heads constant: below 2%.


def informative(r: dict) -> bool:
  return bool(r.get("check") and r["check"]["informative"])


def _finite(x) -> bool:
  return x is not None and math.isfinite(x)


def _no_interval(drop: float | None, reps: np.ndarray | None) -> str:
  """Why a relative drop has no interval ("" when it has one)."""
  if not _finite(drop):
    return "relative drop undefined"
  if reps is None:
    return "relative drop without replicates"
  return "" if np.all(np.isfinite(reps)) else "relative drop undefined in some resamples"


def _variants(names) -> list[str]:
  return sorted(set(names), key=lambda v: (v != "raw", v))


def _average(rows: list[tuple[str, float, np.ndarray]], level: float) -> dict:
  """The mean of relative drops `(name, drop, replicates)` with the interval of the
  per-replicate means."""
  mean = np.mean([d for _, _, d in rows], 0)
  ci = uncertainty.percentile_interval(mean, level)
  return dict(mean_relative_drop=float(np.mean([x for _, x, _ in rows])), ci=ci,
              p_value=significance.bootstrap_p_value(mean),
              within_noise=bool(ci[0] <= 0.0 <= ci[1]))


def _drops(results: list[dict], reps: list[dict], variant: str, which: str,
           model: str | None = None) -> tuple[list[tuple[str, float, np.ndarray]], list[str]]:
  """The drops that may enter an average, and the ones left out, named with why.

  Every informative cell (of `model`) with a defined drop for `variant` with all or half
  ("which") the heads constant enters with its replicates, if the drop has an interval:
  one undefined in some resamples (baseline <= 0 there), or without replicates, would
  carry its point value alone into a mean whose interval then could not be drawn, so it is
  left out (`_no_interval`: the one rule for per-model averages, the paper's claims and the
  correlation).

  Returns:
    ([(cell, relative drop, replicates)], [left-out cell with its reason]).
  """
  rows, left_out = [], []
  for r, d in zip(results, reps):
    if not informative(r) or model not in (None, r["model"]):
      continue
    for s in r["summary"]:
      c = s[which]
      if s["variant"] != variant or not c:
        continue
      cell = f"{r['model']}/{r['task']}"
      drop, dreps = c.get("relative_drop"), d["drops"].get((variant, c["static_heads"]))
      if why := _no_interval(drop, dreps):
        left_out.append(f"{cell} ({why})")
      else:
        rows.append((cell, drop, dreps))
  return rows, left_out


def model_averages(results: list[dict], reps: list[dict], level: float) -> list[dict]:
  """Per model, variant and (all, half): the relative drop averaged over informative tasks.

  The interval averages the per-replicate drops over tasks (tasks are resampled
  independently). A task whose drop has no interval is left out and named (`_drops`).
  """
  out = []
  for model in dict.fromkeys(r["model"] for r in results):
    mine = [r for r in results if r["model"] == model and informative(r)]
    for v in _variants(s["variant"] for r in mine for s in r["summary"]):
      for which in ("all", "half"):
        rows, left_out = _drops(results, reps, v, which, model)
        if not rows:
          continue
        row = dict(model=model, variant=v, heads=which,
                   tasks=[c.split("/", 1)[1] for c, _, _ in rows], **_average(rows, level),
                   vs_paper=None, left_out=left_out)
        if which == "all":
          lo, hi = row["ci"]
          row["vs_paper"] = ("above 8%" if lo > PAPER_ALL_HEADS_DROP else "below 8%"
                             if hi < PAPER_ALL_HEADS_DROP else "8% inside the interval")
        out.append(row)
  return out


# Streams of the cell-level resampling (`numpy.random.default_rng([seed, stream])`), apart
# from `uncertainty`'s example (0) and seed (1) streams.
CELLS_STREAM, TASKS_STREAM = 2, 3
MIN_PAIRS_PER_TASK = 3  # A task's Spearman over fewer models is +-1 or undefined.
DROP, CORRELATION = "mean relative drop", "rank correlation"  # A claim's `kind`.
# A claim's `test` against its `threshold`: "about" a value (supported when the interval
# holds it and excludes 0), "below" or "above" it.
ABOUT, BELOW, ABOVE = "about", "below", "above"


def over_cells(reps: np.ndarray, seed: int, weights: np.ndarray | None = None,
               stream: int = CELLS_STREAM) -> np.ndarray:
  """Replicates of a (weighted) mean over units, with the units resampled too: `[B, C]`
  per-unit replicates (unit c's value on resample b of its examples and seeds) -> `[B]`,
  where replicate b first draws C units with replacement
  (`default_rng([seed, stream]).integers(0, C, size=(B, C))`), then averages their b-th
  replicates: a two-level (hierarchical) bootstrap."""
  b, c = reps.shape
  idx = np.random.default_rng([seed, stream]).integers(0, c, size=(b, c))
  w = np.ones(c) if weights is None else np.asarray(weights, np.float64)
  return (np.take_along_axis(reps, idx, 1) * w[idx]).sum(1) / w[idx].sum(1)


def verdict(test: str, threshold: float, ci) -> str:
  """A claim's verdict from one interval (`claims`): the one rule for every interval."""
  if ci is None:
    return "not tested"
  lo, hi = ci
  if not (math.isfinite(lo) and math.isfinite(hi)):
    return "undefined"
  if test == ABOUT:  # "About 8%": against 8%, and against no drop at all.
    return "contradicted" if not lo <= threshold <= hi else "supported" if lo > 0 else (
        "within noise")
  if test == BELOW:
    return "supported" if hi < threshold else "contradicted" if lo > threshold else (
        "within noise")
  return "supported" if lo > threshold else "contradicted" if hi < threshold else "within noise"


def claims(results: list[dict], reps: list[dict], corr: dict, level: float,
           seed: int = 0) -> list[dict]:
  """The paper's three claims tested on the informative cells (PAPA's raw constants).

  Each claim has its `kind` (DROP or CORRELATION), `threshold`, estimate, n and two intervals,
  each with its verdict (`verdict`): supported, contradicted, within noise (the interval
  cannot tell), undefined or not tested.
    - `ci`, `verdict`: given these cells (models x tasks): dev examples and probe seeds
      resampled within each cell, the cells fixed.
    - `general`: over cells too (`over_cells`: the cells resampled, then examples and seeds
      within each); for the correlation, tasks are resampled (each keeps its models).
  All heads constant, "about 8%": the mean relative drop over cells; supported when the
  interval holds 8% and excludes 0, contradicted when it excludes 8%. Where cells ran the
  loss-optimal constant (`papa/optimal.py`), the same with it ("all_optimal"): the lower
  bound beside PAPA's upper one. Half the heads, "almost no drop": supported below
  `HALF_HEADS_MARGIN`, contradicted above it. Better models lose more: the within-task
  Spearman rho pooled over tasks (`within_task_correlation`), supported above 0,
  contradicted below; the rho pooled across tasks (`correlations`) is kept as
  `across_tasks`, secondary: it mostly measures differences between tasks' metrics.
  `without`: each claim re-tested without each model's cells.
  """
  out = []
  optimal = any(s["variant"] == "optimal" for r in results for s in r["summary"])
  for key, variant, which, test, threshold, claim, measure in (
      ("all", "raw", "all", ABOUT, PAPER_ALL_HEADS_DROP,
       "All heads constant: about 8% average relative drop.",
       "mean relative drop over cells, all heads constant"),
      ("all_optimal", "optimal", "all", ABOUT, PAPER_ALL_HEADS_DROP,
       "The same with the loss-optimal constant (the lower bound).",
       "mean relative drop over cells, all heads constant with the loss-optimal constant"),
      ("half", "raw", "half", BELOW, HALF_HEADS_MARGIN, "Half the heads constant: almost no drop.",
       f"mean relative drop over cells, half the heads (almost none: below "
       f"{100 * HALF_HEADS_MARGIN:.0f}%)")):
    if variant == "optimal" and not optimal:
      continue
    rows, left_out = _drops(results, reps, variant, which)
    if variant == "optimal":  # A fit that scores below the mean found no better constant.
      worse, free = not_optimal(results), task_free(results)
      left_out += [f"{c} (optimal.objective={free[c]}: a task-free fit, not the loss-optimal "
                   "constant for this task, so no lower bound)" for c, _, _ in rows if c in free]
      left_out += [f"{c} (the fitted constant scores below PAPA's mean: not loss-optimal, "
                   "so no lower bound)" for c, _, _ in rows if c in worse and c not in free]
      rows = [r for r in rows if r[0] not in worse and r[0] not in free]
    row = dict(key=key, kind=DROP, test=test, threshold=threshold, percent=True,
               claim=claim, measure=measure, cells=[c for c, _, _ in rows],
               **_drop_claim(rows, test, threshold, level, seed),
               note="" if rows else "no informative cell with a defined drop",
               left_out=left_out)
    models = list(dict.fromkeys(c.split("/", 1)[0] for c, _, _ in rows))
    row["without"] = {m: _drop_claim([x for x in rows if not x[0].startswith(m + "/")],
                                     test, threshold, level, seed)
                      for m in models} if len(models) > 1 else {}
    out.append(row)
  w = within_task_correlation(results, reps, level, seed)
  c = corr.get("raw") or dict(n=0, rho=None, ci=None, verdict="not tested", pairs=[],
                              undefined=[])
  out.append(dict(
      key="correlation", kind=CORRELATION, test=ABOVE, threshold=0.0, percent=False,
      claim="Better-performing models lose more.",
      measure="Spearman's rho of baseline against relative drop (all heads) within each "
      "task, pooled over tasks (weighted by pairs)", **{k: w[k] for k in (
          "n", "n_tasks", "estimate", "ci", "verdict", "general", "note", "per_task",
          "small_tasks", "without")},
      cells=w["cells"], left_out=w["left_out"],
      across_tasks=dict(n=c["n"], estimate=c["rho"], ci=c["ci"], verdict=verdict(
          ABOVE, 0.0, c["ci"]) if c["verdict"] != "not tested" else "not tested",
                        note=c.get("note", ""))))
  return out


def task_free(results: list[dict]) -> dict[str, str]:
  """Cells whose `optimal` constants were fitted without the task (`optimal.objective` other
  than "task"), by objective: they bound nothing for the task."""
  return {f"{r['model']}/{r['task']}": r.get("optimal_objective", "task") for r in results
          if r.get("optimal_objective", "task") != "task"}


def not_optimal(results: list[dict]) -> set[str]:
  """Cells whose `optimal` constant scores below PAPA's mean with all heads constant: its fit
  (`papa/optimal.py`) did not reach a better constant, so its drop bounds nothing."""
  return {f"{r['model']}/{r['task']}" for r in results if results_lib.not_optimal(
      {s["variant"]: s["all"]["mean"] for s in r["summary"] if s["all"]})}


def _drop_claim(rows: list[tuple[str, float, np.ndarray]], test: str, threshold: float,
                level: float, seed: int) -> dict:
  """n, estimate, both intervals and verdicts of a drop claim over `rows`."""
  out = dict(n=len(rows), estimate=None, ci=None, verdict="not tested",
             general=dict(ci=None, verdict="not tested", resampled="cells"))
  if not rows:
    return out
  avg = _average(rows, level)
  gen = uncertainty.percentile_interval(
      over_cells(np.stack([d for _, _, d in rows], 1), seed), level)
  out.update(estimate=avg["mean_relative_drop"], ci=avg["ci"],
             verdict=verdict(test, threshold, avg["ci"]),
             general=dict(ci=gen, verdict=verdict(test, threshold, gen), resampled="cells"))
  return out


def within_task_correlation(results: list[dict], reps: list[dict], level: float,
                            seed: int = 0, drop_model: str | None = None) -> dict:
  """Better models lose more, within tasks: per task, Spearman's rho of baseline score
  against relative drop (all heads constant, raw) over its informative cells with a defined
  drop (`_drops`; tasks with fewer than `MIN_PAIRS_PER_TASK` such cells are left out and
  listed in `small_tasks`, as the task's property rather than the cells'), each
  with the interval over the report's replicates; pooled over tasks as the mean of the tasks'
  rhos weighted by their pairs. Its interval given the cells averages the per-replicate rhos;
  the general one resamples tasks too (`over_cells`, `TASKS_STREAM`; models within a task are
  not resampled: a Spearman needs distinct models). Tested from `significance.N_MIN_PAIRS`
  pairs over the tasks used. `drop_model`: leave that model's cells out."""
  rows, left_out = _drops(results, reps, "raw", "all")
  index = {f"{r['model']}/{r['task']}": (r, d) for r, d in zip(results, reps)}
  by_task: dict[str, list] = {}
  for cell, drop, dreps in rows:
    r, d = index[cell]
    if r["model"] != drop_model:
      by_task.setdefault(r["task"], []).append((cell, r["baseline"]["mean"], drop,
                                                d["baseline"], dreps))
  per_task, cols, weights, cells, small = [], [], [], [], {}
  for task, pairs in by_task.items():
    if len(pairs) < MIN_PAIRS_PER_TASK:
      small[task] = [p[0] for p in pairs]
      continue
    x, y = np.array([[p[1], p[2]] for p in pairs]).T
    xr, yr = np.stack([p[3] for p in pairs], 1), np.stack([p[4] for p in pairs], 1)
    rho = float(significance.rowwise_spearman(x[None], y[None])[0])
    r_reps = significance.rowwise_spearman(xr, yr)
    ci = uncertainty.percentile_interval(r_reps, level)
    per_task.append(dict(task=task, n=len(pairs), models=[p[0].split("/")[0] for p in pairs],
                         rho=rho, ci=ci, verdict=verdict(ABOVE, 0.0, ci)))
    cols.append(r_reps)
    weights.append(len(pairs))
    cells += [p[0] for p in pairs]
  n = int(sum(weights))
  out = dict(n=n, n_tasks=len(per_task), estimate=None, ci=None, verdict="not tested",
             general=dict(ci=None, verdict="not tested", resampled="tasks"),
             per_task=per_task, small_tasks=small, cells=cells, left_out=left_out,
             without={},
             note=f"not tested: n = {n} < {significance.N_MIN_PAIRS} pairs in tasks with "
             f"{MIN_PAIRS_PER_TASK} or more models")
  if n < significance.N_MIN_PAIRS:
    return out
  w = np.asarray(weights, np.float64)
  reps_m = np.stack(cols, 1)
  ci = uncertainty.percentile_interval((reps_m * w).sum(1) / w.sum(), level)
  gen = (uncertainty.percentile_interval(over_cells(reps_m, seed, w, TASKS_STREAM), level)
         if len(per_task) > 1 else None)
  out.update(estimate=float(np.dot(w, [t["rho"] for t in per_task]) / w.sum()), ci=ci,
             verdict=verdict(ABOVE, 0.0, ci), note="",
             general=dict(ci=gen, verdict=verdict(ABOVE, 0.0, gen) if gen else
                          "not tested", resampled="tasks"))
  if drop_model is None:
    models = list(dict.fromkeys(c.split("/", 1)[0] for c in cells))
    out["without"] = {m: {k: v for k, v in within_task_correlation(
        results, reps, level, seed, m).items() if k in ("n", "estimate", "ci", "verdict",
                                                         "general")}
                      for m in models} if len(models) > 1 else {}
  return out


def mark_cells(results: list[dict], tested: list[dict]) -> None:
  """Writes into each cell which claims it entered (`in_claims`: keys) and why it was left
  out of the others (`left_out_of_claims`), from the claims' own lists."""
  for r in results:
    cell = f"{r['model']}/{r['task']}"
    r["in_claims"] = [c["key"] for c in tested if cell in c["cells"]]
    r["left_out_of_claims"] = sorted({x[len(cell) + 2:-1] for c in tested
                                      for x in c["left_out"] if x.startswith(cell + " (")})


def family(results: list[dict]) -> list[tuple[dict, dict]]:
  """(cell, condition) of every main-table drop in the Holm family (module docstring)."""
  return [(r, s[w]) for r in results if informative(r) for s in r["summary"]
          for w in ("all", "half") if s[w] and s[w]["static_heads"] > 0
          and _finite(s[w].get("p_value"))]


def adjust(results: list[dict], averages: list[dict], level: float) -> dict:
  """Holm over the family; writes `holm_p` and `within_noise_adjusted` into its members.

  An average over one task is that task's drop, the same test: it is not counted twice
  and shows the drop's adjusted p-value.
  """
  drops = family(results)
  members = [c for _, c in drops] + [a for a in averages
                                     if _finite(a["p_value"]) and len(a["tasks"]) > 1]
  for c, p in zip(members, rank_agreement.holm([c["p_value"] for c in members])):
    c.update(holm_p=p, within_noise_adjusted=bool(p >= 1 - level))
  by = {(r["model"], r["task"], s["variant"], w): s[w] for r in results if informative(r)
        for s in r["summary"] for w in ("all", "half")}
  for a in averages:
    if _finite(a["p_value"]) and len(a["tasks"]) == 1:
      c = by[(a["model"], a["tasks"][0], a["variant"], a["heads"])]
      a.update(holm_p=c["holm_p"], within_noise_adjusted=c["within_noise_adjusted"])
  return dict(method="holm", level=level, n_tests=len(members),
              within_noise=sum(bool(c["within_noise"]) for c in members),
              within_noise_adjusted=sum(c["within_noise_adjusted"] for c in members))


def correlations(results: list[dict], reps: list[dict], level: float) -> dict:
  """Per variant: Spearman's rho of baseline score vs relative drop (all heads constant)
  over the informative (model, task) cells, with a bootstrap interval.

  Replicate b pairs each cell's baseline and drop on that cell's b-th resample of
  dev examples and probe seeds (the report's replicates: models on a task share
  the example resamples, tasks are independent). Pairs are not resampled: they
  share models and tasks, so they are not independent draws from a population,
  and a handful of pairs drawn with repeats mostly measures which pairs were
  drawn. The interval is therefore conditional on these models and tasks: how
  sure the ranking is given dev-set and seed noise, not whether it holds for
  other models or tasks.
  """
  out = {}
  for v in _variants(s["variant"] for r in results for s in r["summary"]):
    pairs, left_out, undefined = [], [], []
    for r, d in zip(results, reps):
      for s in r["summary"]:
        c = s["all"]
        if s["variant"] != v or not r["baseline"] or not c or "relative_drop" not in c:
          continue
        cell = f"{r['model']}/{r['task']}"
        drop = d["drops"].get((v, c["static_heads"]))
        if not informative(r):
          why = "uninformative" if r["check"] and r["check"]["informative"] is False else (
              "not checked")
          left_out.append(f"{cell} ({why})")
        elif why := _no_interval(c["relative_drop"], drop):
          undefined.append(f"{cell} ({why})")
        else:
          pairs.append((dict(model=r["model"], task=r["task"], metric=r["metric"],
                             baseline=r["baseline"]["mean"], relative_drop=c["relative_drop"],
                             relative_drop_ci=c.get("relative_drop_ci")), d["baseline"], drop))
    left_out += undefined
    x = [p["baseline"] for p, _, _ in pairs]
    y = [p["relative_drop"] for p, _, _ in pairs]
    b = len(pairs[0][1]) if pairs else 0
    xr = np.stack([bx for _, bx, _ in pairs], 1) if pairs else np.zeros((b, 0))
    yr = np.stack([dy for _, _, dy in pairs], 1) if pairs else np.zeros((b, 0))
    models = list(dict.fromkeys(p["model"] for p, _, _ in pairs))
    without = {}
    for m in models if len(models) > 1 else ():
      keep = [i for i, (p, _, _) in enumerate(pairs) if p["model"] != m]
      without[m] = significance.rank_correlation(
          [x[i] for i in keep], [y[i] for i in keep], xr[:, keep], yr[:, keep], level=level)
    out[v] = dict(significance.rank_correlation(x, y, xr, yr, level=level),
                  pairs=[p for p, _, _ in pairs], left_out=left_out, undefined=undefined,
                  without=without)
  return out
