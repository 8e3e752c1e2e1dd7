"""The report's per-head section: each experiment's per-head results and agreement table
(`report.markdown.per_head_lines` writes it).

It iterates over `head_maps.HeadMap`s (every stage's maps, PAPA's gates, the scored
orderings), so a new per-head analysis appears here with no code of its own.
"""

from __future__ import annotations

from typing import Sequence

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
