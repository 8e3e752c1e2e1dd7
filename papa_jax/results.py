"""Results a person reads: JSON, CSV, a markdown table like the paper's, a plot."""

from __future__ import annotations

import csv
import json
import os
from typing import Sequence

CSV_FIELDS = ("model", "task", "variant", "static_heads", "total_heads", "fraction",
              "metric", "score", "best_score", "examples", "eval_examples", "epochs", "seconds")


def write_json(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=False, default=float)
  os.replace(tmp, path)


def relative_drop(baseline: float, score: float) -> float:
  return (baseline - score) / baseline if baseline else float("nan")


def summary_rows(rows: Sequence[dict]) -> list[dict]:
  """Per (model, task, variant): baseline, PAPA (all heads), drop, half heads."""
  out = []
  groups: dict = {}
  for r in rows:
    groups.setdefault((r["model"], r["task"], r["variant"]), []).append(r)
  baselines = {(r["model"], r["task"]): r["score"] for r in rows if r["static_heads"] == 0}
  for (model, task, variant), rs in groups.items():
    by_k = {r["static_heads"]: r for r in rs}
    total = rs[0]["total_heads"]
    base = baselines.get((model, task))
    papa = by_k.get(total, {}).get("score")
    half = by_k.get(total // 2, {}).get("score")
    out.append(dict(model=model, task=task, variant=variant, metric=rs[0]["metric"],
                    baseline=base, papa=papa,
                    relative_drop=relative_drop(base, papa) if None not in (base, papa) else None,
                    half_heads=half, seconds=sum(r["seconds"] for r in rs)))
  return out


def _fmt(v, pct=False) -> str:
  if v is None:
    return "–"
  if isinstance(v, float):
    return f"{100 * v:.1f}%" if pct else f"{v:.4f}"
  return str(v)


def markdown(rows: Sequence[dict]) -> str:
  lines = ["| model | task | constant attention | metric | baseline (0 heads) | PAPA (all heads) "
           "| relative drop | half heads | seconds |", "|---|---|---|---|---|---|---|---|---|"]
  for s in summary_rows(rows):
    lines.append("| " + " | ".join([
        s["model"], s["task"], s["variant"], s["metric"], _fmt(s["baseline"]), _fmt(s["papa"]),
        _fmt(s["relative_drop"], pct=True), _fmt(s["half_heads"]), f"{s['seconds']:.0f}"]) + " |")
  lines += ["", "| variant | static heads | fraction | score | best epoch score | seconds |",
            "|---|---|---|---|---|---|"]
  for r in sorted(rows, key=lambda r: (r["variant"] != "raw", r["variant"], r["static_heads"])):
    lines.append(f"| {r['variant']} | {r['static_heads']}/{r['total_heads']} | "
                 f"{r['fraction']:.4f} | {r['score']:.4f} | {r['best_score']:.4f} | "
                 f"{r['seconds']:.0f} |")
  return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict], path: str, title: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
  for variant in sorted({r["variant"] for r in rows}):
    rs = sorted((r for r in rows if r["variant"] == variant or r["static_heads"] == 0),
                key=lambda r: r["fraction"])
    ax.plot([r["fraction"] for r in rs], [r["score"] for r in rs], "o-",
            label=f"constant = mean {variant} attention")
  base = [r["score"] for r in rows if r["static_heads"] == 0]
  if base:
    ax.axhline(base[0], color="gray", ls=":", lw=1, label="baseline (input-dependent)")
  ax.set_xlabel("fraction of heads with constant attention")
  ax.set_ylabel(rows[0]["metric"])
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def write_all(workdir: str, rows: list[dict], meta: dict) -> dict[str, str]:
  """Writes results.json/.csv/.md and papa_curve.png; returns their paths."""
  paths = {k: os.path.join(workdir, f) for k, f in (
      ("json", "results.json"), ("csv", "results.csv"), ("md", "results.md"),
      ("png", "papa_curve.png"))}
  write_json(paths["json"], dict(meta, rows=rows, summary=summary_rows(rows)))
  with open(paths["csv"], "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
  with open(paths["md"], "w") as f:
    f.write(f"# PAPA: {rows[0]['model']} on {rows[0]['task']}\n\n{markdown(rows)}")
  plot(rows, paths["png"], f"{rows[0]['model']} / {rows[0]['task']}")
  return paths
