"""`report.md` and `report.csv` rendered from `report.analyse`'s dictionary."""

from __future__ import annotations

import math
import os

from typing import Sequence

import numpy as np

from papa_jax.papa.schedule import PAPER_FRACTIONS
from papa_jax.significance import N_MIN_PAIRS, format_p


def fraction_label(k: int, total: int) -> str:
  """The schedule's nominal fraction ("1/2", "15/16") for k of total heads."""
  for f in PAPER_FRACTIONS:
    if int(np.floor(f * total + 1e-9)) == k:
      return {0.0: "0", 1.0: "1", 0.5: "1/2", 0.875: "7/8", 0.9375: "15/16"}[f]
  return f"{k}/{total}"


def jsonable(x):
  if isinstance(x, dict):
    return {str(k): jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [jsonable(v) for v in x]
  if isinstance(x, (np.floating, float)):
    return float(x) if math.isfinite(x) else None
  if isinstance(x, np.integer):
    return int(x)
  if isinstance(x, np.bool_):
    return bool(x)
  return x


def number(v, pct: bool = False) -> str:
  """A score (4 decimals) or a percentage (2); "–" when undefined; never "-0.00"."""
  if v is None or (isinstance(v, float) and not math.isfinite(v)):
    return "–"
  out = f"{100 * v:.2f}" if pct else f"{v:.4f}"
  out = out[1:] if out.startswith("-") and out.lstrip("-0.") == "" else out
  return out + "%" if pct else out


def _score(c: dict | None) -> str:
  return "–" if c is None else f"{number(c['mean'])} ± {number(c['std'])}"


def _drop(c: dict | None, n_boot: int = 0) -> str:
  """A relative drop with its interval; the verdict is the printed interval's."""
  if c is None or "relative_drop" not in c:
    return "–"
  if c["relative_drop"] is None or not math.isfinite(c["relative_drop"]):  # NaN; JSON: null.
    return "undefined (baseline <= 0)"
  ci = c.get("relative_drop_ci")
  text = number(c["relative_drop"], pct=True)
  if ci is not None and not all(x is not None and math.isfinite(x) for x in ci):
    return text + (f" [undefined: baseline <= 0 in {c.get('undefined_resamples')} of "
                   f"{n_boot} resamples]")
  if ci is not None:
    text += f" [{number(ci[0], True)}, {number(ci[1], True)}]"
  return text + (" (within noise)" if c.get("within_noise") is True else "")


def _holm(c: dict | None, r: dict, n_boot: int) -> str:
  """The adjusted reading beside a drop: Holm's p, and "(within noise)" by it."""
  if c is None or "relative_drop" not in c:
    return "–"
  if r.get("check") and not r["check"]["informative"]:
    return "uninformative" if r["check"]["informative"] is False else "not checked"
  if c.get("holm_p") is None:
    return "undefined" if c.get("relative_drop_ci") is not None else "–"
  return format_p(c["holm_p"], n_boot) + (" (within noise)" if c["within_noise_adjusted"]
                                          else "")


def _check(r: dict) -> list[str]:
  """First-table cells: best constant prediction, baseline − it, in the claims or not."""
  c = r.get("check")
  if c is None:
    return ["–", "–", "no: no baseline"]
  if c["constant"] is None:
    return ["–", "–", "no: not checked"]
  ci = "" if not c["diff_ci"] else f" [{c['diff_ci'][0]:+.4f}, {c['diff_ci'][1]:+.4f}]"
  verdict = {True: "yes", False: "no: *uninformative*", None: "no: not checked"}[
      c["informative"]]
  if c["informative"] and r.get("left_out_of_claims"):  # Informative, but a drop had no
    why = "; ".join(r["left_out_of_claims"])  # interval: left out of the claims it feeds.
    verdict = f"no: {why}" if not r.get("in_claims") else (
        f"partly ({', '.join(r['in_claims'])}); {why}")
  return [f"{c['constant']}: {number(c['constant_score'])}", f"{c['diff']:+.4f}{ci}", verdict]


def _multiplicity(report: dict, lv: str) -> list[str]:
  st, m = report["settings"], report["multiplicity"]
  n = m["intervals"]
  alpha = f"{1 - st['level']:.2g}"
  return [
      f"**How many intervals.** report.md prints {sum(n.values())} {lv} intervals: "
      f"{n['relative_drops']} relative drops (main table), {n['averages']} per-model "
      f"averages, {n.get('claims', 0)} intervals of the paper's claims (two each), "
      f"{n.get('within_task', 0)} per-task correlations, "
      f"{n['baseline_vs_constant']} baseline − constant differences, "
      f"{n['correlation']} rank correlations and {n['controls']} control differences. Each "
      f"is a per-interval statement: of many drops that are truly 0, about "
      f"{100 - 100 * st['level']:.0f}% of the intervals exclude 0 by chance, so with many "
      "intervals some \"findings\" are noise.",
      "", f"**Adjusted reading (Holm).** The drops of the main table in informative cells "
      "and the per-model averages over two or more tasks (an average over one task is that "
      f"task's drop) form one family of {m['n_tests']} tests. Each has the "
      "two-sided bootstrap p-value that inverts its printed interval (the smallest alpha at "
      "which the (1 − alpha) percentile interval excludes 0; p < "
      f"{alpha} exactly when the {lv} interval excludes 0), and the *Holm* column gives it "
      "after Holm's step-down adjustment, which keeps the chance of any false finding in "
      f"the family below {alpha} whatever the dependence between the tests; \"(within "
      f"noise)\" there marks an adjusted p >= {alpha}. {m['within_noise']} of the "
      f"{m['n_tests']} are within noise per interval, {m['within_noise_adjusted']} after "
      "adjustment." + (f" The {m['n_control_tests']} control comparisons are a second Holm "
                       "family." if m["n_control_tests"] else "")
      + f" \"< {1 / max(st['n_boot'] - 1, 1):.1g}\": every replicate on one side of 0.", "",
      "**Informative cells.** A cell enters the claims (averages, the paper's 8%, the "
      f"correlation, the counts) only if the {lv} interval of baseline − best constant "
      "prediction (majority class or tag; the positive class for F1; 0 for MCC and "
      "correlations), resampled on the same dev examples, lies above 0. Other cells are "
      "marked *uninformative* and tabled but never counted. A relative drop whose baseline "
      "is <= 0 on the dev set or in any resample is *undefined*, never within noise."]


def _interval(ci, pct: bool) -> str:
  return "–" if ci is None else f"[{number(ci[0], pct)}, {number(ci[1], pct)}]"


def claims_table(report: dict) -> list[str]:
  """The paper's three claims (Hassid et al., Findings of EMNLP 2022), each with its
  estimate on the informative cells, n, and two intervals with their verdicts
  (`report_claims.claims`); then the correlation per task and across tasks."""
  lv = f"{100 * report['settings']['level']:.0f}%"
  lines = [
      "What Hassid et al. (Findings of EMNLP 2022) report, tested on the informative cells "
      "with PAPA's constants: *supported* when the interval agrees with the claim and "
      "excludes the alternative (0 for the 8% drop, a drop of 2% or more for 'almost none', "
      "rho <= 0 for the correlation), *contradicted* when it excludes the claim, *within "
      "noise* when it cannot tell. Two intervals each: *given these cells* resamples dev "
      "examples and probe seeds within each (model, task) cell; *over cells* resamples the "
      "cells too (for the correlation, the tasks), then examples and seeds within each: "
      "whether the verdict would hold for other models and tasks like these. The averages "
      "weigh every cell alike. The correlation is Spearman's rho within each task, pooled "
      "over tasks.", "",
      f"| claim | measured as | n | estimate | given these cells [{lv}] | verdict | over cells "
      f"[{lv}] | verdict | left out (besides uninformative cells) |",
      "|---|---|---|---|---|---|---|---|---|"]
  for c in report.get("claims", []):
    pct, g = c["percent"], c["general"]
    verdict = c["note"] if c["verdict"] == "not tested" and c.get("note") else c["verdict"]
    lines.append(f"| {c['claim']} | {c['measure']} | {c['n']} | {number(c['estimate'], pct)} "
                 f"| {_interval(c['ci'], pct)} | **{verdict}** | {_interval(g['ci'], pct)} | "
                 f"**{g['verdict']}** | {'; '.join(c.get('left_out', [])) or '–'} |")
    if c.get("per_task") or c.get("small_tasks"):
      small = "; ".join(f"{t} ({len(v)})" for t, v in c.get("small_tasks", {}).items())
      lines += ["", "Better models lose more, per task (Spearman's rho of baseline against "
                f"relative drop over the task's models, {lv} interval given the cells): "
                + ("; ".join(f"{t['task']} {number(t['rho'])} {_interval(t['ci'], False)}, "
                             f"n = {t['n']} ({t['verdict']})" for t in c["per_task"]) or "none")
                + "." + (f" Tasks with fewer than 3 informative models (left out): {small}."
                         if small else "")]
    if "across_tasks" in c:
      x = c["across_tasks"]
      said = x["note"] if x["verdict"] == "not tested" and x["note"] else x["verdict"]
      lines += ["", "Secondary, pooled across tasks (mostly differences between tasks and "
                f"their metrics): rho {number(x['estimate'])} {_interval(x['ci'], False)}, "
                f"n = {x['n']} ({said})."]
  return lines


def markdown(report: dict, figures: dict[str, str] | None = None) -> str:
  """`report.md`: the tables, how to read them, and their limits."""
  st = report["settings"]
  lv = f"{100 * st['level']:.0f}%"
  exps = report["experiments"]
  lines = [
      "# PAPA report: constant attention vs input-dependent attention", "",
      "Each probe is trained on a frozen encoder whose first k heads in the learned order "
      "use a constant attention matrix (their mean over training data); the baseline "
      "(0 heads constant) uses input-dependent attention.", "",
      "**Columns.** *baseline*, *all heads*, *half heads*: the task's headline metric on the "
      "dev set, mean ± sample std over probe seeds (\"± –\": one seed, no spread). "
      f"*relative drop*: (baseline − score) / baseline from the seed means, with its {lv} "
      "interval in brackets; \"(within noise)\" marks an interval that contains 0: such a "
      "drop is not a finding. *N*: dev examples (sentences for tagging). \"–\": not run.", "",
      f"**Intervals.** {st['resampling']}; B = {st['n_boot']} replicates, {st['method']} "
      f"{lv} intervals, RNG seed {st['seed']} (per-task seeds in report.json).", ""]
  lines += _multiplicity(report, lv)
  nb = st["n_boot"]
  lines += ["", "| model | task | metric | N | train examples | seeds | best constant "
            f"prediction | baseline − constant [{lv}] | in the claims |",
            "|---|---|---|---|---|---|---|---|---|"]
  for r in exps:
    lines.append(f"| {r['model']} | {r['task']} | {r['metric']} | {r['n_examples'] or '–'} | "
                 f"{r['train_examples'] or '–'} | {', '.join(map(str, r['seeds'])) or '–'} | "
                 + " | ".join(_check(r)) + " |")
  lines += ["", "## The paper's claims, tested", ""] + claims_table(report)
  lines += ["", "## Baseline, all heads and half heads constant", "",
            "| model | task | constant attention | baseline | all heads | relative drop "
            f"[{lv}] | Holm p | half heads | relative drop [{lv}] | Holm p |",
            "|---|---|---|---|---|---|---|---|---|---|"]
  for r in exps:
    for s in r["summary"]:
      lines.append(f"| {r['model']} | {r['task']} | {s['variant']} | {_score(r['baseline'])} | "
                   f"{_score(s['all'])} | {_drop(s['all'], nb)} | {_holm(s['all'], r, nb)} | "
                   f"{_score(s['half'])} | {_drop(s['half'], nb)} | {_holm(s['half'], r, nb)} |")
  left = [f"{r['model']}/{r['task']}" for r in exps if r["check"] and not r["check"]["informative"]]
  if left:
    lines += ["", "Left out of every claim (uninformative or not checked; see the first "
              "table and the last section): " + ", ".join(left) + "."]
  fracs = {c["fraction_label"]: c["fraction"] for r in exps for c in r["conditions"]}
  labels = sorted(fracs, key=fracs.get)
  lines += ["", "## Score at each fraction of constant heads (mean ± std over seeds)", "",
            "| model | task | constant attention | " + " | ".join(labels) + " |",
            "|---|---|---|" + "---|" * len(labels)]
  for r in exps:
    for s in r["summary"]:
      by = {c["fraction_label"]: c for c in r["conditions"] if c["variant"] == s["variant"]}
      by.setdefault("0", r["baseline"])
      lines.append(f"| {r['model']} | {r['task']} | {s['variant']} | "
                   + " | ".join(_score(by.get(lb)) for lb in labels) + " |")
  lines += ["", "## Average relative drop per model", "",
            "Averaged over the model's informative tasks; the interval averages the "
            "per-replicate drops over tasks (tasks resampled independently). A task whose drop "
            "has no interval (undefined in some resamples) is left out and named, as in the "
            "claims. *vs the paper*: "
            "where the paper's 8% (all heads constant) lies against the interval.", "",
            f"| model | constant attention | heads | tasks | mean relative drop [{lv}] | Holm p "
            "| vs the paper's 8% | left out (besides uninformative tasks) |",
            "|---|---|---|---|---|---|---|---|"]
  for a in report["model_averages"]:
    ci = "" if a["ci"] is None else f" [{number(a['ci'][0], True)}, {number(a['ci'][1], True)}]"
    holm = "–" if a.get("holm_p") is None else format_p(a["holm_p"], nb) + (
        " (within noise)" if a["within_noise_adjusted"] else "")
    lines.append(f"| {a['model']} | {a['variant']} | {a['heads']} | {len(a['tasks'])} | "
                 f"{number(a['mean_relative_drop'], True)}{ci}"
                 f"{' (within noise)' if a['within_noise'] else ''} | {holm} | "
                 f"{a['vs_paper'] or '–'} | {'; '.join(a.get('left_out', [])) or '–'} |")
  lines += ["", "## Do better models lose more?", "",
            "Spearman's rho of baseline score against relative drop (all heads constant) over "
            f"the informative (model, task) pairs, with a {lv} percentile interval over the "
            "report's replicates (each cell's baseline and drop on the same resample of its "
            "dev examples and probe seeds; the pairs themselves are not resampled, so the "
            "interval is conditional on these models and tasks). Not tested below "
            f"{N_MIN_PAIRS} pairs. *positive*: better models lose more; *negative*: they lose "
            "less.", "",
            f"| constant attention | n | Spearman rho [{lv}] | verdict | left out |",
            "|---|---|---|---|---|"]
  for v, c in report["correlation"].items():
    rho = "–" if c["rho"] is None else f"{number(c['rho'])} [{number(c['ci'][0])}, " \
        f"{number(c['ci'][1])}]"
    verdict = c["note"] if c["verdict"] == "not tested" else c["verdict"]
    lines.append(f"| {v} | {c['n']} | {rho} | {verdict} | {'; '.join(c['left_out']) or '–'} |")
  lines += _controls(report.get("controls", []), lv, nb)
  lines += per_head_lines(report.get("per_head", []))
  lines += ["", "## What these numbers do not show", ""] + [f"- {c}" for c in report["caveats"]]
  if report["warnings"]:
    lines += ["", "## Warnings", ""] + [f"- {w}" for w in report["warnings"]]
  if figures:
    lines += ["", "## Figures", ""] + [f"![{k}]({os.path.basename(p)})"
                                       for k, p in figures.items()]
  return "\n".join(lines) + "\n"


def _holm_control(x: dict, n_boot: int) -> str:
  p = x.get("holm_p")
  return "–" if p is None else f"{format_p(p, n_boot)} ({x['verdict_adjusted']})"


def _ci(x: dict) -> str:
  return f"{x['diff']:+.4f} [{x['ci'][0]:+.4f}, {x['ci'][1]:+.4f}] ({x['verdict']})"


def _controls(controls: list[dict], lv: str, nb: int) -> list[str]:
  """The controls section: other orderings against random, constants against uniform."""
  if not controls:
    return []
  lines = ["", "## Controls: which heads, and which constant", "",
           "Each ordering makes its first k heads constant with the raw mean; *random* pools "
           f"every seeded random ordering's draws and probe seeds (the null curve; *draw std*: "
           "the spread of the per-draw means). Differences are score(row) − score(random) or "
           f"score(constant) − score(uniform), with their paired {lv} intervals; \"within "
           "noise\" means the interval contains 0. *Holm*: the adjusted p-value and verdict "
           "over every control comparison of this report (the sentences use the intervals)."]
  for c in controls:
    fracs = sorted({(x["fraction"], x["fraction_label"]) for x in c["curves"]})
    labels = [lb for _, lb in fracs]
    lines += ["", f"### {c['model']} / {c['task']} ({c['metric']})", "",
              "| ordering | constant | " + " | ".join(labels) + " |",
              "|---|---|" + "---|" * len(labels)]
    for key in dict.fromkeys((x["ordering"], x["variant"]) for x in c["curves"]):
      by = {x["fraction_label"]: x for x in c["curves"] if (x["ordering"], x["variant"]) == key}
      cell = lambda x: "–" if x is None else (_score(x) + (
          f" (draw std {x['draw_std']:.4f})" if x.get("draw_std") is not None else ""))
      lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cell(by.get(lb)) for lb in labels)
                   + " |")
    fit = c.get("optimal_objective", "task")
    optimal = ("the loss-optimal constant" if fit == "task" else
               f"the task-free fitted constant (optimal.objective={fit}; no lower bound)")
    for title, rows, col in (("against random", c["vs_random"], "ordering"),
                             ("against uniform (PAPA's ordering)", c["vs_uniform"], "variant"),
                             (f"against {optimal} (PAPA's ordering)",
                              c.get("vs_optimal", []), "variant")):
      if rows:
        lines += ["", f"Differences {title}:", "",
                  f"| {col} | fraction | difference [{lv}] | Holm p (verdict) |",
                  "|---|---|---|---|"] + [f"| {x[col]} | {x['fraction_label']} | {_ci(x)} | "
                                          f"{_holm_control(x, nb)} |" for x in rows]
    if c["spearman"]:
      lines += ["", "Spearman correlation of the head orders (p-value), over "
                f"{c['spearman'][0]['heads']} heads:", "", "| ordering | ordering | rho (p) |",
                "|---|---|---|"] + [f"| {x['a']} | {x['b']} | {x['rho']:.2f} ({x['p_value']:.2g}) |"
                                    for x in c["spearman"]]
    lines += [""] + [f"- {t}" for t in c["sentences"]]
  return lines


def csv_rows(report: dict) -> list[dict]:
  rows = []
  for r in report["experiments"]:
    for c in r["conditions"]:
      ci, sci = c.get("relative_drop_ci") or (None, None), c["score_ci"] or (None, None)
      rows.append(dict(model=r["model"], task=r["task"], metric=r["metric"],
                       variant=c["variant"], static_heads=c["static_heads"],
                       total_heads=r["total_heads"], fraction=c["fraction"], mean=c["mean"],
                       std=c["std"], n_seeds=c["n"], score_ci_lo=sci[0], score_ci_hi=sci[1],
                       relative_drop=c.get("relative_drop"), relative_drop_ci_lo=ci[0],
                       relative_drop_ci_hi=ci[1], within_noise=c.get("within_noise"),
                       p_value=c.get("p_value"), holm_p=c.get("holm_p"),
                       within_noise_adjusted=c.get("within_noise_adjusted"),
                       in_claims=bool(r.get("in_claims")),
                       source=c["source"]))
  return [{k: "" if v is None or (isinstance(v, float) and not math.isfinite(v)) else v
           for k, v in row.items()} for row in rows]


def readme_block(report: dict, provenance: list[str], limits: list[str], figure: str) -> str:
  """The README's recorded-suite section: where it comes from, the cells, the main table,
  the paper's claims with verdicts, the curves, and what the numbers cannot show."""
  st = report["settings"]
  lv = f"{100 * st['level']:.0f}%"
  nb = st["n_boot"]
  lines = list(provenance) + [
      "", f"| model | task | metric | train examples | dev N | seeds | baseline | all heads "
      f"constant | relative drop [{lv}] | half heads | relative drop [{lv}] | in the claims |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in report["experiments"]:
    for s in r["summary"]:
      if s["variant"] != "raw":
        continue
      lines.append(
          f"| {r['model']} | {r['task']} | {r['metric']} | {r['train_examples'] or '–'} | "
          f"{r['n_examples'] or '–'} | {', '.join(map(str, r['seeds'])) or '–'} | "
          f"{_score(r['baseline'])} | {_score(s['all'])} | {_drop(s['all'], nb)} | "
          f"{_score(s['half'])} | {_drop(s['half'], nb)} | {_check(r)[2]} |")
  intro, _, *table = claims_table(report)
  lines += ["", f"![PAPA curves with error bands]({figure})", "",
            "**The paper's claims at this size.** " + intro, "", *table]
  lines += ["", "**What these numbers cannot show.**", ""] + [f"- {x}" for x in limits] + [
      f"- {c}" for c in report["caveats"]]
  return "\n".join(lines) + "\n"


def _p(v) -> str:
  return "–" if v is None else f"{v:.3g}"


def per_head_lines(sections: Sequence[dict]) -> list[str]:
  """The per-head section's lines for `heads.analyse`'s sections (none when no experiment
  has a map)."""
  sections = [s for s in sections if s["maps"]]
  if not sections:
    return []
  lines = ["", "## Per-head results", "",
           "Every per-head result in the experiments' workdirs: each stage's maps, PAPA's gates "
           "(sort) and the scored head orderings. *higher*: what a higher value says of a head "
           "(blank: a description, not an importance score). The agreement table gives "
           "Spearman's rho over heads of each map with each importance score, a permutation "
           "p-value shuffling heads within layers (depth alone drives most head scores) and "
           "Holm's adjustment over the experiment's table; rho is descriptive of these heads "
           "and examples, not of the model family."]
  for s in sections:
    lines += ["", f"### {s['model']} / {s['task']}", "",
              "| map | examples | higher | mean | min | max |", "|---|---|---|---|---|---|"]
    for r in s["maps"]:
      n = "–" if r["examples"] is None else f"{r['examples']} {r['split']}".strip()
      cols = f" (per {', '.join(r['columns'])})" if r["columns"] else ""
      unit = f" [{r['unit']}]" if r["unit"] else ""
      lines.append(f"| `{r['key']}`: {r['title']}{cols}{unit} | {n} | {r['higher'] or ''} | "
                   f"{number(r['mean'])} | {number(r['min'])} | {number(r['max'])} |")
    if s["agreement"]:
      lines += ["", "| map | importance score | Spearman rho | p (within layers) | p (Holm) "
                "| heads |", "|---|---|---|---|---|---|"]
      for r in s["agreement"]:
        higher = r["score_higher"] or "no direction"
        lines.append(f"| `{r['measure']}` | `{r['score']}` (higher = {higher}) | "
                     f"{number(r['rho'])} | {_p(r['p_within_layers'])} | {_p(r['p_holm'])} | "
                     f"{r['heads']} |")
  return lines
