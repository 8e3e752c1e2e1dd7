"""The PAPA report over models and tasks, with honest uncertainty.

`write_report(experiments, out_dir)` writes `report.md`, `report.json`,
`report.csv` (rendered by `papa_jax/report/markdown.py`) and PNG figures
(`papa_jax/report/figures.py`). Every score is
recomputed from the saved dev predictions with the task's own metric
(`papa_jax.uncertainty`); conditions that have only logged scores get a mean
± std and no interval. Intervals: paired bootstrap over dev examples and
probe seeds, percentile, per task on the RNG seed `uncertainty.task_seed(seed, task)`,
so all models on a task are resampled on the same examples (model
comparisons within a task are paired) and tasks are independent. Seed
streams: 0 for the baseline, `condition_stream(variant, k)` otherwise;
`uncertainty.paired_bootstrap(..., seed=uncertainty.task_seed(...), streams=(0,
condition_stream(...)))` reproduces any interval of the report. Which cells
enter the claims (informative ones), the Holm-adjusted reading and the rank
correlation: `papa_jax/report/claims.py`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
import zlib
from typing import Sequence

import numpy as np

from papa_jax import chance, significance, uncertainty
from papa_jax.measures import rank_agreement
from papa_jax.report import (claims as report_claims, controls as report_controls,
                             figures as report_figures, heads as report_heads)
from papa_jax.workdir import storage, rules as workdir
from papa_jax.data.tasks import Task
from papa_jax.report.markdown import csv_rows, fraction_label, jsonable, markdown, number
from papa_jax.errors import ConfigError

PAPER_CLAIMS = (
    "All heads constant: about 8% average relative drop (Hassid et al. 2022).",
    "Half the heads constant (the first half of the learned order): almost no drop.",
    "Better-performing models lose more from constant attention.",
)
CSV_FIELDS = ("model", "task", "metric", "variant", "static_heads", "total_heads", "fraction",
              "mean", "std", "n_seeds", "score_ci_lo", "score_ci_hi", "relative_drop",
              "relative_drop_ci_lo", "relative_drop_ci_hi", "within_noise", "p_value", "holm_p",
              "within_noise_adjusted", "in_claims", "source")


@dataclasses.dataclass
class Experiment:
  """One model on one task: everything the report needs, as plain arrays.

  Attributes:
    model: display name, e.g. "all-MiniLM-L6-v2".
    task: the task (its `headline_metric` is scored).
    total_heads: layers x heads of the encoder.
    labels: dev labels, `[N]` (classification, regression) or `[N, L]` with
      -100 at unscored positions (tagging); None if only scores exist.
    predictions: (variant, static_heads) -> {seed: dev predictions in the
      layout of `labels`}; variant "raw" (PAPA) or "effective"; the
      baseline is ("raw", 0) and serves every variant.
    scores: (variant, static_heads) -> {seed: headline score as logged}.
    means: `[layers, heads, L, L]` constant matrices (raw), or None.
    gates: `[layers, heads]` learned gate logits (low = constant first), or None.
    ranking: [[layer, head], ...] in the order heads become constant, or None
      (then derived from `gates`).
    orderings: every head ordering's ranking by name ("lambda" is PAPA's),
      for the controls; predictions of other orderings are keyed
      ("raw/<ordering>", k) (`results.condition`).
    head_maps: every per-head result of the workdir (`head_maps.HeadMap`), for
      the per-head section (`report_heads`).
    ranking_check: whether the sorting run behind `ranking` learned anything
      (`chance.sort_check`), or None.
    train_examples: train-subset size the probes and means used.
    eval_examples: dev-set size as the pipeline reported it.
    seeds: probe seeds run (derived from the dicts when empty).
  """
  model: str
  task: Task
  total_heads: int
  labels: np.ndarray | None = None
  predictions: dict = dataclasses.field(default_factory=dict)
  scores: dict = dataclasses.field(default_factory=dict)
  means: np.ndarray | None = None
  gates: np.ndarray | None = None
  ranking: list | None = None
  train_examples: int | None = None
  eval_examples: int | None = None
  seeds: tuple = ()
  orderings: dict = dataclasses.field(default_factory=dict)
  head_maps: list = dataclasses.field(default_factory=list)
  ranking_check: dict | None = None


def condition_stream(variant: str, k: int) -> int:
  """The seed-resampling stream of a condition (the baseline's is 0)."""
  return 0 if k == 0 else zlib.crc32(f"{variant}/{k}".encode())


def _seeds_of(exp: Experiment) -> tuple:
  if exp.seeds:
    return tuple(exp.seeds)
  return tuple(sorted({s for d in (exp.predictions, exp.scores) for v in d.values() for s in v}))


def _analyse(exp: Experiment, n_boot: int, seed: int, level: float,
             paired_seeds: bool = True) -> tuple[dict, dict]:
  """Per-condition scores and drops of one experiment, and its baseline and drop
  replicates: dict(baseline=[B] or None, drops={condition: [B]}). With `paired_seeds`, a
  condition run with the baseline's seeds draws the same seeds in each replicate (stream 0):
  seed s fixes the probe's initialisation, data order and dropout in every condition."""
  task, metric = exp.task, exp.task.headline_metric
  keys = sorted((c for c in set(exp.predictions) | set(exp.scores) if "/" not in c[0]),
                key=lambda c: (c[1], c[0] != "raw", c[0]))  # Other orderings: report_controls.
  base_key = ("raw", 0) if ("raw", 0) in keys else next((c for c in keys if c[1] == 0), None)
  warnings = [f"{exp.model}/{task.name}: {c[0]} k=0 ignored; the baseline is {base_key[0]} k=0."
              for c in keys if c[1] == 0 and c != base_key]
  keys = [c for c in keys if c[1] > 0 or c == base_key]
  rng_seed = uncertainty.task_seed(seed, task.name)
  boot_keys = [c for c in keys if exp.labels is not None and exp.predictions.get(c)]
  constant = (chance.constant_prediction(task, exp.labels)
              if base_key in boot_keys else None)
  extra = [[constant[2]]] if constant is not None else []  # Paired with the baseline.
  scored = dict(zip(boot_keys + ["constant"] * len(extra), uncertainty.seed_scores_many(
      task, exp.labels, [exp.predictions[c] for c in boot_keys] + extra, n_boot=n_boot,
      seed=rng_seed, metric=metric))) if boot_keys else {}
  constant_reps = scored.pop("constant")[1][:, 0] if extra else None
  conds, reps = {}, {}
  base_seeds = sorted(exp.predictions.get(base_key) or ())
  for c in keys:
    if c in scored:
      full, b = scored[c]
      seeds = sorted(exp.predictions[c])
      paired = paired_seeds and seeds == base_seeds
      reps[c] = uncertainty.seed_means(b, seed=rng_seed,
                                       stream=0 if paired else condition_stream(*c))
      logged = exp.scores.get(c, {})
      off = [s for s, v in zip(seeds, full) if s in logged and abs(logged[s] - v) > 1e-6]
      if off:
        warnings.append(f"{exp.model}/{task.name} {c[0]} k={c[1]}: logged scores of seeds {off} "
                        "differ from the scores recomputed from predictions (> 1e-6); "
                        "the report uses the recomputed ones.")
      src, ci = "predictions", uncertainty.percentile_interval(reps[c], level)
    else:
      seeds, paired = sorted(exp.scores[c]), None
      full, src, ci = np.array([exp.scores[c][s] for s in seeds], np.float64), "logged", None
    conds[c] = dict(variant=c[0], static_heads=c[1], fraction=c[1] / exp.total_heads,
                    fraction_label=fraction_label(c[1], exp.total_heads),
                    **uncertainty.seed_summary(full), seeds=dict(zip(seeds, full.tolist())),
                    score_ci=ci, source=src, seeds_paired=paired)
  drops = {}
  for c, row in conds.items():
    if c == base_key or base_key is None:
      continue
    base = conds[base_key]["mean"]
    if base_key in reps and c in reps:
      row.update(uncertainty.compare(reps[base_key], reps[c], base, row["mean"], level))
      drops[c] = uncertainty.relative_drop(reps[base_key], reps[c])
    else:
      row.update(relative_drop=uncertainty.relative_drop(base, row["mean"]),
                 relative_drop_ci=None, abs_diff=base - row["mean"], abs_diff_ci=None,
                 p_value=None, within_noise=None)
    row.update(holm_p=None, within_noise_adjusted=None)  # Set by report_claims.adjust.
  n = len(exp.labels) if exp.labels is not None else exp.eval_examples
  if exp.labels is not None and exp.eval_examples not in (None, len(exp.labels)):
    warnings.append(f"{exp.model}/{task.name}: eval_examples={exp.eval_examples} but "
                    f"{len(exp.labels)} labels; the labels are used.")
  check = None if base_key is None else chance.check(
      conds[base_key]["mean"], reps.get(base_key), constant, constant_reps, level)
  if line := chance.warning(f"{exp.model}/{task.name}: the sorting run", exp.ranking_check):
    warnings.append(line + " Its ranking chose the constant heads of the partial runs.")
  out = dict(model=exp.model, task=task.name, metric=metric, kind=task.kind, n_examples=n,
             train_examples=exp.train_examples, eval_examples=exp.eval_examples,
             seeds=list(_seeds_of(exp)), total_heads=exp.total_heads, rng_seed=rng_seed,
             baseline=None if base_key is None else dict(conds[base_key], variant="raw"),
             conditions=list(conds.values()), check=check, ranking_check=exp.ranking_check,
             warnings=warnings)
  out["summary"] = _summary(out, exp.total_heads)
  return out, dict(baseline=reps.get(base_key), drops=drops)


def _summary(exp: dict, total: int) -> list[dict]:
  """Table rows per variant: baseline, all heads, half heads."""
  by = {(c["variant"], c["static_heads"]): c for c in exp["conditions"]}
  variants = _variants(v for v, k in by if k > 0) or ["raw"]
  return [dict(variant=v, all=by.get((v, total)), half=by.get((v, total // 2)))
          for v in variants]


def _variants(names) -> list[str]:
  return sorted(set(names), key=lambda v: (v != "raw", v))


def _caveats(results: list[dict], averages: list[dict], corr: dict, multi: dict,
             level: float, tested: list[dict]) -> list[str]:
  """What the tables do not show, derived from the numbers."""
  out, lv = [], f"{100 * level:.0f}%"
  left = [f"{r['model']}/{r['task']} ({r['check']['reason']})" for r in results
          if r["check"] and not report_claims.informative(r)]
  if left:
    out.append("Left out of every claim (per-model averages, the comparison with the "
               "paper's 8%, the correlation, the counts below) as uninformative (the baseline "
               "probe is not clearly above the best constant prediction) or not checked: "
               + "; ".join(left) + ".")
  c = corr.get("raw")
  w = next((t for t in tested if t["kind"] == report_claims.CORRELATION), None)
  if w is not None and w["verdict"] == "not tested":
    out.append(f"Better models lose more? Not tested: n = {w['n']} informative (model, task) "
               f"pairs in tasks with {report_claims.MIN_PAIRS_PER_TASK} or more models < "
               f"{significance.N_MIN_PAIRS}.")
  if c is not None and c["verdict"] != "not tested" and len({p["task"] for p in c["pairs"]}) > 1:
    out.append("The correlation across tasks (secondary, beside the claim) pools tasks ("
               + ", ".join(sorted({p["metric"] for p in c["pairs"]})) + "): differences in "
               "scale and difficulty between tasks can produce it on their own, so the claim's "
               "verdict uses the correlation within each task, pooled.")
  split = [f"'{t['claim']}' is {t['verdict']} given these cells but {t['general']['verdict']} "
           f"with the {t['general']['resampled']} resampled" for t in tested
           if t["general"]["verdict"] not in ("not tested", t["verdict"])]
  out.append("Each claim has two intervals: given these cells (dev examples and probe seeds "
             "resampled within each (model, task) cell), and over cells (the cells, or for "
             "the correlation the tasks, resampled too: would the verdict hold for other "
             "models and tasks like these?). " + ("; ".join(split) + ": that verdict rests on "
             "which models and tasks were run." if split else "Both verdicts agree for "
             "every claim tested."))
  sizes: dict[str, set] = {}
  for r in results:
    if report_claims.informative(r) and r["train_examples"]:
      sizes.setdefault(r["model"], set()).add(r["train_examples"])
  if len({n for v in sizes.values() for n in v}) > 1:
    out.append("The informative cells' probes and means used different train subsets ("
               + "; ".join(f"{m}: {', '.join(map(str, sorted(v)))} examples"
                           for m, v in sizes.items())
               + "): averages over cells and the correlation compare models under different "
               "recipes, and a drop can differ with the subset size alone.")
  out += _leave_one_model_out(tested)
  rows = report_claims.family(results)
  noisy = [f"{r['model']}/{r['task']} {x['variant']} {x['fraction_label']}" for r, x in rows
           if x["within_noise"]]
  out.append(f"{len(noisy)} of {len(rows)} relative drops in the main table (informative "
             f"cells) have a {lv} interval containing 0 (within noise)"
             + (": " + "; ".join(noisy) if noisy else "") + f"; after Holm's adjustment over "
             f"the {multi['n_tests']} tests (these drops and the per-model averages over "
             "several tasks), "
             f"{multi['within_noise_adjusted']} of {multi['n_tests']} are within noise.")
  flat = [a for a in averages if a["within_noise"]]
  if flat:
    out.append("Per-model average drops within noise: " + "; ".join(
        f"{a['model']} {a['variant']} {a['heads']} heads" for a in flat) + ".")
  seeds = [x["n"] for r in results for x in r["conditions"]]
  if 1 in seeds:
    out.append("Some conditions have one seed: no seed spread (std \"–\"); their intervals "
               "reflect dev-set sampling only.")
  few = [n for n in seeds if 1 < n < 5]
  if few:
    out.append(f"As few as {min(few)} seeds per condition: the seed part of each interval "
               "rests on that many values and is narrower than the seed noise it stands for.")
  task_sets = {(a["variant"], a["heads"]): set() for a in averages}
  for a in averages:
    task_sets[a["variant"], a["heads"]].add(tuple(sorted(a["tasks"])))
  if any(len(t) > 1 for t in task_sets.values()):
    out.append("Per-model averages cover different task sets (see the tasks column), so they "
               "are not directly comparable between models.")
  logged = [f"{r['model']}/{r['task']} {x['variant']} {x['fraction_label']}" for r in results
            for x in r["conditions"] if x["source"] == "logged"]
  if logged:
    out.append("No predictions, so no interval, for: " + "; ".join(logged) + ".")
  undefined = sorted({f"{r['model']}/{r['task']}" for r in results for x in r["conditions"]
                      if "relative_drop" in x and x["within_noise"] is None
                      and x.get("relative_drop_ci") is not None})
  undefined += [f"{r['model']}/{r['task']}" for r in results
                if r["baseline"] and not r["baseline"]["mean"] > 0 and
                f"{r['model']}/{r['task']}" not in undefined]
  if undefined:
    out.append("Relative drop undefined (baseline <= 0, on the dev set or in some resamples; "
               "never counted as within noise) for: " + "; ".join(undefined) + ".")
  missing = [f"{r['model']}/{r['task']} {s['variant']} {w} heads" for r in results
             for s in r["summary"] for w in ("all", "half") if s[w] is None]
  missing += [f"{r['model']}/{r['task']} baseline" for r in results if r["baseline"] is None]
  if missing:
    out.append("Not run (shown as \"–\"): " + "; ".join(missing) + ".")
  out.append("Intervals cover dev-set sampling and probe seeds only. The constant matrices "
             "(one pass over a train subset), the head order (one sorting run), the train "
             "subset and the encoder are held fixed; their variability is not included.")
  return out


def _leave_one_model_out(tested: list[dict]) -> list[str]:
  """Whether a claim's verdict rests on one model: the verdicts that change when one
  model's cells are left out."""
  if not any(c.get("without") for c in tested):
    return []
  changed = []
  for c in tested:
    parts = []
    for m, w in c.get("without", {}).items():
      if w["verdict"] != c["verdict"]:
        pct = c["percent"]
        est = "" if w["estimate"] is None else f": {number(w['estimate'], pct)}" + (
            "" if w["ci"] is None else f" [{number(w['ci'][0], pct)}, {number(w['ci'][1], pct)}]")
        parts.append(f"without {m}, {w['verdict']} ({w['n']} cells{est})")
    if parts:
      changed.append(f"'{c['claim']}' is {c['verdict']} with all models; " + "; ".join(parts))
  if not changed:
    return ["Leaving one model out, no claim's verdict changes."]
  return ["Leaving one model out: " + ". ".join(changed) + ". A verdict that one model "
          "decides rests on that model's cells and recipe."]


def _count_intervals(results: list[dict], averages: list[dict], corr: dict,
                     controls: list[dict], tested: list[dict]) -> dict:
  """How many intervals report.md prints, by table (undefined ones are not intervals)."""
  shown = lambda ci: ci is not None and all(map(math.isfinite, ci))
  return dict(
      relative_drops=sum(s[w] is not None and shown(s[w].get("relative_drop_ci"))
                         for r in results for s in r["summary"] for w in ("all", "half")),
      baseline_vs_constant=sum(bool(r["check"]) and shown(r["check"]["diff_ci"])
                               for r in results),
      averages=sum(shown(a["ci"]) for a in averages),
      claims=sum(shown(c["ci"]) + shown(c["general"]["ci"]) for c in tested),
      within_task=sum(shown(t["ci"]) for c in tested for t in c.get("per_task", [])),
      correlation=sum(shown(c["ci"]) for c in corr.values()),
      controls=sum(shown(x["ci"]) for c in controls for x in c["vs_random"] + c["vs_uniform"]))


def analyse(experiments: Sequence[Experiment], *, n_boot: int = uncertainty.N_BOOT,
            seed: int = 0, level: float = 0.95, seed_pairing: str = "paired") -> dict:
  """Everything in the report, JSON-ready (NaN where undefined)."""
  names = [(e.model, e.task.name) for e in experiments]
  if len(set(names)) != len(names):
    raise ConfigError(f"Duplicate (model, task) experiments: {names}.")
  done = [_analyse(e, n_boot, seed, level, seed_pairing == "paired") for e in experiments]
  controls = [c for e in experiments for c in [report_controls.analyse(
      e, rng_seed=uncertainty.task_seed(seed, e.task.name), n_boot=n_boot, level=level)]
              if c is not None]
  results, reps = [r for r, _ in done], [d for _, d in done]
  averages = report_claims.model_averages(results, reps, level)
  multi = report_claims.adjust(results, averages, level)
  rows = [x for c in controls for x in c["vs_random"] + c["vs_uniform"]]
  held = rank_agreement.holm([x["p_value"] if math.isfinite(x["p_value"]) else None
                              for x in rows])
  for x, p in zip(rows, held):  # A second Holm family: the control comparisons.
    x.update(holm_p=p, verdict_adjusted="undefined" if p is None else
             x["verdict"] if p < 1 - level else "within noise")
  corr = report_claims.correlations(results, reps, level)
  tested = report_claims.claims(results, reps, corr, level, seed)
  report_claims.mark_cells(results, tested)
  multi.update(intervals=_count_intervals(results, averages, corr, controls, tested),
               n_control_tests=len(rows))
  return dict(
      settings=dict(n_boot=n_boot, level=level, method="percentile", seed=seed,
                    seed_pairing=seed_pairing,
                    resampling="paired bootstrap: dev examples (sentences for tagging) with "
                    "replacement, the same for every condition of a task; probe seeds with "
                    "replacement, " + (
                        "the same draws for every condition run with the baseline's seeds "
                        "(a seed fixes the probe's initialisation, data order and dropout in "
                        "each: seed pairing)" if seed_pairing == "paired" else
                        "independently per condition") + "; metric recomputed per "
                    "resample, averaged over the drawn seeds"),
      paper_claims=list(PAPER_CLAIMS), claims=tested, experiments=results,
      model_averages=averages,
      correlation=corr, controls=controls, multiplicity=multi,
      caveats=_caveats(results, averages, corr, multi, level, tested),
      per_head=[report_heads.analyse(e.model, e.task.name, e.head_maps) for e in experiments],
      warnings=[w for r in results for w in r["warnings"]])


def _slug(*parts: str) -> str:
  return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", p).strip("-") for p in parts)


def write_report(experiments: Sequence[Experiment], out_dir: str, *,
                 n_boot: int = uncertainty.N_BOOT, seed: int = 0,
                 level: float = 0.95, seed_pairing: str = "paired") -> dict[str, str]:
  """Writes report.md/.json/.csv and the figures under `out_dir`; returns their paths.

  Keys: "md", "json", "csv", "curves", "scatter", and "means/<model>/<task>",
  "gates/<model>/<task>", "agreement/<model>/<task>" for experiments that have constant
  matrices / gates / per-head maps to compare with an importance score.
  """
  storage.makedirs(out_dir)
  report = analyse(experiments, n_boot=n_boot, seed=seed, level=level,
                   seed_pairing=seed_pairing)
  paths = {k: os.path.join(out_dir, f) for k, f in (
      ("md", "report.md"), ("json", "report.json"), ("csv", "report.csv"))}
  figures = {"curves": os.path.join(out_dir, "curves.png"),
             "scatter": os.path.join(out_dir, "baseline_vs_drop.png")}
  report_figures.curves(report, figures["curves"])
  report_figures.scatter(report, figures["scatter"])
  for c in report["controls"]:
    figures[f"controls/{c['model']}/{c['task']}"] = p = os.path.join(
        out_dir, f"controls_{_slug(c['model'], c['task'])}.png")
    report_figures.control_curves(c, p)
  for e, r in zip(experiments, report["experiments"]):
    slug = _slug(e.model, e.task.name)
    if e.means is not None:
      figures[f"means/{e.model}/{e.task.name}"] = p = os.path.join(out_dir, f"means_{slug}.png")
      report_figures.means_grid(np.asarray(e.means), p, f"{e.model} / {e.task.name}")
    if e.gates is not None or e.ranking is not None:
      ks = sorted({c["static_heads"] for c in r["conditions"] if c["static_heads"] > 0})
      figures[f"gates/{e.model}/{e.task.name}"] = p = os.path.join(out_dir, f"gates_{slug}.png")
      report_figures.gate_map(e.gates, e.ranking, ks, e.total_heads, p,
                              f"{e.model} / {e.task.name}")
  for e, section in zip(experiments, report["per_head"]):
    if section["agreement"]:
      figures[f"agreement/{e.model}/{e.task.name}"] = p = os.path.join(
          out_dir, f"agreement_{_slug(e.model, e.task.name)}.png")
      report_figures.agreement_grid(section["agreement"], p,
                                    f"{e.model} / {e.task.name}: per-head maps vs importance "
                                    "scores")
  with workdir.atomic_write(paths["json"]) as f:
    json.dump(jsonable(report), f, indent=1)
  with workdir.atomic_write(paths["csv"], newline="") as f:
    w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
    w.writeheader()
    w.writerows(csv_rows(report))
  with workdir.atomic_write(paths["md"]) as f:
    f.write(markdown(report, figures))
  return dict(paths, **figures)
