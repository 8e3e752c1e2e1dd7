"""One workdir's results a person reads: JSON, CSV, a markdown table, a plot.

Rows are probing runs (one per variant, head ordering, static-head count and
probe seed); the tables average seeds (mean, and the sample standard
deviation when there are several); results.json's `check` and `ranking_check` say whether the
baseline probe and the sorting run learned anything (`papa_jax.chance`), and results.md opens
with a warning when one did not. A condition is a variant under PAPA's
ordering, or `variant/ordering` under another one (`condition`). The suite
report (`papa_jax/report/build.py`) adds bootstrap intervals across workdirs.
"""

from __future__ import annotations

import csv
from typing import Sequence

import numpy as np

from papa_jax import chance, uncertainty
from papa_jax.workdir import rules as workdir
from papa_jax.workdir.layout import Layout
from papa_jax.plotting import pyplot, save_figure

CSV_FIELDS = ("model", "task", "variant", "ordering", "static_heads", "total_heads", "fraction",
              "seed", "metric", "score", "best_score", "examples", "eval_examples", "epochs",
              "seconds", "run")


def save_predictions(path: str, predictions: np.ndarray, labels: np.ndarray,
                     logits: np.ndarray | None = None) -> None:
  """Per-example dev outputs of one run (`predictions`, `labels`, optional `logits`).

  Layouts: class ids `[N]`, regression values `[N]`, or tag ids `[N, L]` with
  the labels' -100 where a position is not scored.
  """
  arrays = dict(predictions=predictions, labels=labels)
  if logits is not None:
    arrays["logits"] = logits.astype(np.float32)
  with workdir.atomic_write(path, "wb") as f:
    np.savez(f, **arrays)


def condition(row: dict) -> str:
  """A run's condition: its variant, or `variant/ordering` beside PAPA's ordering."""
  ordering = row.get("ordering", "lambda")
  return row["variant"] if ordering == "lambda" else f"{row['variant']}/{ordering}"


def by_run(rows: Sequence[dict]) -> dict[tuple, dict]:
  """(model, task, condition, static_heads) -> mean, std, n and seeds of the scores."""
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault((r["model"], r["task"], condition(r), r["static_heads"]), []).append(r)
  out = {}
  for key, rs in groups.items():
    scores = np.asarray([r["score"] for r in rs], np.float64)
    trained = {r.get("run", id(r)): r["seconds"] for r in rs}  # A shared run counts once.
    out[key] = dict(mean=float(scores.mean()),
                    std=float(scores.std(ddof=1)) if len(scores) > 1 else None,
                    n=len(scores), seeds=[r.get("seed") for r in rs],
                    best=float(np.mean([r["best_score"] for r in rs])),
                    seconds=float(sum(trained.values())),
                    total_heads=rs[0]["total_heads"], fraction=rs[0]["fraction"],
                    metric=rs[0]["metric"])
  return out


def summary_rows(rows: Sequence[dict]) -> list[dict]:
  """Per (model, task, variant): baseline, PAPA (all heads), drop, half heads."""
  runs = by_run(rows)
  out = []
  for model, task, variant in dict.fromkeys((k[0], k[1], k[2]) for k in runs):
    ks = {k[3]: v for k, v in runs.items() if k[:3] == (model, task, variant)}
    any_run = next(iter(ks.values()))
    total = any_run["total_heads"]
    base = runs.get((model, task, "raw", 0))
    papa, half = ks.get(total), ks.get(total // 2)
    pick = lambda r, f: None if r is None else r[f]
    out.append(dict(
        model=model, task=task, variant=variant, metric=any_run["metric"],
        baseline=pick(base, "mean"), baseline_std=pick(base, "std"),
        papa=pick(papa, "mean"), papa_std=pick(papa, "std"),
        relative_drop=None if base is None or papa is None else uncertainty.relative_drop(
            base["mean"], papa["mean"]),
        half_heads=pick(half, "mean"), half_heads_std=pick(half, "std"),
        seeds=len(any_run["seeds"]), seconds=sum(v["seconds"] for v in ks.values())))
  return out


def _fmt(v, std=None, pct=False) -> str:
  if v is None or not np.isfinite(v):
    return "–"
  if pct:
    return f"{100 * v + 0.0:.1f}%".replace("-0.0%", "0.0%")  # Never "-0.0%".
  return f"{v:.4f}" + (f" ± {std:.4f}" if std is not None else "")


def _drop(v) -> str:
  """`uncertainty.relative_drop` as the report shows it: "undefined" for a baseline <= 0."""
  if v is not None and np.isnan(v):
    return "undefined (baseline <= 0)"
  return _fmt(v, pct=True)


_WARNINGS = {  # results.json key: (what learned nothing, what that means here)
    "check": ("The baseline probe", "Every drop here compares chance with chance: it measures "
              "nothing about attention."),
    "ranking_check": ("The sorting run", "Its ranking chose the constant heads of the partial "
                      "runs (1/2, 7/8, ...): that choice is mostly arbitrary."),
}


def warnings(meta: dict) -> list[str]:
  """What results.json's `check` and `ranking_check` say against the numbers: one line each
  when the baseline probe or the sorting run learned nothing (`papa_jax.chance`)."""
  return [f"{line} {then}" for key, (what, then) in _WARNINGS.items()
          if (line := chance.warning(what, meta.get(key)))]


def not_optimal(all_heads: dict[str, float | None]) -> bool:
  """Whether the `optimal` constant scores below PAPA's mean with all heads constant
  (`all_heads`: variant -> score): its fit found no better constant, so its drop bounds
  nothing. The one rule for results.md and the report's claims."""
  opt, raw = all_heads.get("optimal"), all_heads.get("raw")
  return opt is not None and raw is not None and opt < raw


def optimal_warning(rows: Sequence[dict]) -> str:
  """A line when the `optimal` constant scores below PAPA's mean with all heads constant
  (`not_optimal`; "" otherwise)."""
  by = {s["variant"]: s["papa"] for s in summary_rows(rows)}
  if not not_optimal(by):
    return ""
  return (f"The fitted optimal constant scores {by['optimal']:.4f} with all heads constant, "
          f"below PAPA's mean ({by['raw']:.4f}): its fit found no better constant, so its drop "
          "is no lower bound (papa/optimal.py, docs/controls.md).")


def markdown(rows: Sequence[dict]) -> str:
  seeds = max(len(by_run(rows)[k]["seeds"]) for k in by_run(rows))
  note = "" if seeds == 1 else f" (mean ± std over {seeds} probe seeds)"
  lines = [f"| model | task | constant attention | metric | baseline (0 heads){note} "
           "| PAPA (all heads) | relative drop | half heads | seconds |",
           "|---|---|---|---|---|---|---|---|---|"]
  for s in summary_rows(rows):
    lines.append("| " + " | ".join([
        s["model"], s["task"], s["variant"], s["metric"], _fmt(s["baseline"], s["baseline_std"]),
        _fmt(s["papa"], s["papa_std"]), _drop(s["relative_drop"]),
        _fmt(s["half_heads"], s["half_heads_std"]), f"{s['seconds']:.0f}"]) + " |")
  lines += ["", "| variant | static heads | fraction | score | best epoch score | seeds "
            "| seconds |", "|---|---|---|---|---|---|---|"]
  runs = by_run(rows)
  for key in sorted(runs, key=lambda k: (k[2] != "raw", k[2], k[3])):
    r = runs[key]
    lines.append(f"| {key[2]} | {key[3]}/{r['total_heads']} | {r['fraction']:.4f} | "
                 f"{_fmt(r['mean'], r['std'])} | {r['best']:.4f} | "
                 f"{','.join(map(str, r['seeds']))} | {r['seconds']:.0f} |")
  return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict], path: str, title: str) -> None:
  plt = pyplot()
  runs = by_run(rows)
  fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
  for variant in sorted({k[2] for k in runs}):
    keys = sorted((k for k in runs if k[2] == variant or k[3] == 0),
                  key=lambda k: runs[k]["fraction"])
    std = [runs[k]["std"] or 0.0 for k in keys]
    ax.errorbar([runs[k]["fraction"] for k in keys], [runs[k]["mean"] for k in keys],
                yerr=std if any(std) else None, fmt="o-", capsize=3,
                label=f"constant = mean {variant} attention")
  base = [runs[k]["mean"] for k in runs if k[3] == 0]
  if base:
    ax.axhline(base[0], color="gray", ls=":", lw=1, label="baseline (input-dependent)")
  seeds = max(runs[k]["n"] for k in runs)
  ax.set_xlabel("fraction of heads with constant attention")
  ax.set_ylabel(rows[0]["metric"] + (f" (mean ± std, {seeds} seeds)" if seeds > 1 else ""))
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  save_figure(fig, path)


def write_all(layout: Layout, rows: list[dict], meta: dict) -> dict[str, str]:
  """Writes results.json/.csv/.md and papa_curve.png; returns their paths."""
  paths = dict(json=layout.results("json"), csv=layout.results("csv"),
               md=layout.results("md"), png=layout.papa_curve)
  workdir.write_json(paths["json"], dict(meta, rows=rows, summary=summary_rows(rows)))
  with workdir.atomic_write(paths["csv"], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
  notes = "".join(f"**Uninformative.** {line}\n\n" for line in warnings(meta))
  if line := optimal_warning(rows):
    notes += f"**Not optimal.** {line}\n\n"
  with workdir.atomic_write(paths["md"]) as f:
    f.write(f"# PAPA: {rows[0]['model']} on {rows[0]['task']}\n\n{notes}{markdown(rows)}")
  plot(rows, paths["png"], f"{rows[0]['model']} / {rows[0]['task']}")
  return paths
