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

from papa_jax import chance, uncertainty
from papa_jax.measures import rank_agreement
from papa_jax.report import (caveats as report_caveats, claims as report_claims,
                             controls as report_controls, figures as report_figures,
                             heads as report_heads)
from papa_jax.workdir import storage, rules as workdir
from papa_jax.data.tasks import Task
from papa_jax.report.markdown import csv_rows, fraction_label, jsonable, markdown
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
    optimal_objective: what the `optimal` variant's constants were fitted to
      (`optimal.objective`): "task" (the loss-optimal constant for this task and probe, a lower
      bound on the drop) or "hidden" (task-free: the unmodified encoder's states; no bound).
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
  optimal_objective: str = "task"


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
             optimal_objective=exp.optimal_objective, warnings=warnings)
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
      controls=sum(shown(x["ci"]) for c in controls for x in report_controls.comparisons(c)))


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
  rows = [x for c in controls for x in report_controls.comparisons(c)]
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
      caveats=report_caveats.caveats(results, averages, corr, multi, level, tested),
      per_head=[report_heads.analyse(e.model, e.task.name, e.head_maps) for e in experiments],
      warnings=[w for r in results for w in r["warnings"]])


def _slug(*parts: str) -> str:
  return "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", p).strip("-") for p in parts)


def write_report(experiments: Sequence[Experiment], out_dir: str, *,
                 n_boot: int = uncertainty.N_BOOT, seed: int = 0,
                 level: float = 0.95, seed_pairing: str = "paired",
                 provenance: dict | None = None) -> dict[str, str]:
  """Writes report.md/.json/.csv and the figures under `out_dir`; returns their paths.
  `provenance` (`workdir.provenance()`: code revision, versions, CPU) goes into report.json.

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
    json.dump(jsonable(dict(report, **(provenance or {}))), f, indent=1)
  with workdir.atomic_write(paths["csv"], newline="") as f:
    w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
    w.writeheader()
    w.writerows(csv_rows(report))
  with workdir.atomic_write(paths["md"]) as f:
    f.write(markdown(report, figures))
  return dict(paths, **figures)
