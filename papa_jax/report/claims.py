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

from papa_jax import significance, uncertainty
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


def claims(results: list[dict], reps: list[dict], corr: dict, level: float) -> list[dict]:
  """The paper's three claims tested on the informative cells (PAPA's raw constants), each
  with its estimate, interval, n and a verdict: supported, contradicted, within noise (the
  interval cannot tell) or not tested.

  All heads constant, "about 8%": the mean relative drop over cells; supported when its
  interval holds 8% and excludes 0, contradicted when it excludes 8%. Half the heads,
  "almost no drop": supported when the interval lies below `HALF_HEADS_MARGIN`,
  contradicted when above it. Better models lose more: Spearman's rho (`correlations`);
  supported when its interval lies above 0, contradicted when below.
  """
  out = []
  for which, claim, measure in (
      ("all", "All heads constant: about 8% average relative drop.",
       "mean relative drop over cells, all heads constant"),
      ("half", "Half the heads constant: almost no drop.",
       f"mean relative drop over cells, half the heads (almost none: below "
       f"{100 * HALF_HEADS_MARGIN:.0f}%)")):
    rows, left_out = _drops(results, reps, "raw", which)
    row = dict(key=which, percent=True, claim=claim, measure=measure,
               cells=[c for c, _, _ in rows], **_drop_claim(rows, which, level),
               note="" if rows else "no informative cell with a defined drop",
               left_out=left_out)
    models = list(dict.fromkeys(c.split("/", 1)[0] for c, _, _ in rows))
    row["without"] = {m: _drop_claim([x for x in rows if not x[0].startswith(m + "/")],
                                     which, level) for m in models} if len(models) > 1 else {}
    out.append(row)
  c = corr.get("raw") or dict(n=0, rho=None, ci=None, verdict="not tested", pairs=[])
  verdict = _CORR_VERDICT.get(c["verdict"], "not tested")
  out.append(dict(key="correlation", percent=False, claim="Better-performing models lose more.",
                  measure="Spearman's rho of baseline against relative drop (all heads)",
                  n=c["n"], cells=[f"{p['model']}/{p['task']}" for p in c.get("pairs", [])],
                  estimate=c["rho"], ci=c["ci"], verdict=verdict,
                  note=c.get("note", ""), left_out=c.get("undefined", []),
                  without={m: dict(n=w["n"], estimate=w["rho"], ci=w["ci"],
                                   verdict=_CORR_VERDICT.get(w["verdict"], "not tested"))
                           for m, w in c.get("without", {}).items()}))
  return out


_CORR_VERDICT = {"positive": "supported", "negative": "contradicted",
                 "within noise": "within noise"}


def _drop_claim(rows: list[tuple[str, float, np.ndarray]], which: str, level: float) -> dict:
  """n, estimate, interval and verdict of a drop claim ("all" or "half") over `rows`."""
  out = dict(n=len(rows), estimate=None, ci=None, verdict="not tested")
  if not rows:
    return out
  avg = _average(rows, level)
  lo, hi = avg["ci"]
  out.update(estimate=avg["mean_relative_drop"], ci=avg["ci"])
  if which == "all":
    out["verdict"] = ("contradicted" if not lo <= PAPER_ALL_HEADS_DROP <= hi else
                      "supported" if lo > 0 else "within noise")
  else:
    out["verdict"] = ("supported" if hi < HALF_HEADS_MARGIN else "contradicted"
                      if lo > HALF_HEADS_MARGIN else "within noise")
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
