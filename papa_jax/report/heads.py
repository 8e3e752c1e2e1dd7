"""The report's per-head section: each experiment's per-head results and agreement table.

It iterates over `head_maps.HeadMap`s (every stage's maps, PAPA's gates, the scored
orderings), so a new per-head analysis appears here with no code of its own.
"""

from __future__ import annotations

from typing import Sequence

import math

import numpy as np

from papa_jax import head_maps


def analyse(model: str, task: str, maps: Sequence[head_maps.HeadMap]) -> dict:
  """One experiment's maps (what each is and its spread over heads) and agreement rows."""
  rows = []
  for m in maps:
    v = m.values[np.isfinite(m.values)]
    rows.append(dict(key=m.key, title=m.title, columns=list(m.columns), higher=m.higher,
                     unit=m.unit, examples=m.examples, split=m.split,
                     mean=float(v.mean()) if v.size else None,
                     min=float(v.min()) if v.size else None,
                     max=float(v.max()) if v.size else None))
  return dict(model=model, task=task, maps=rows, agreement=head_maps.workdir_agreement(maps))


def _p(v) -> str:
  return "–" if v is None else f"{v:.3g}"


def number(v) -> str:
  return "–" if v is None or not math.isfinite(v) else f"{v:.4f}"


def markdown(sections: Sequence[dict]) -> list[str]:
  """The report's lines for `analyse`'s sections (none when no experiment has a map)."""
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
