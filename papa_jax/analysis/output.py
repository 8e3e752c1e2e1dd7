"""Writing per-head analysis results: JSON with provenance, a CSV row per head."""

from __future__ import annotations

import csv
import io

import numpy as np

from papa_jax import workdir
from papa_jax.layout import Layout


def write_per_head(layout: Layout, stage: str, maps: dict[str, np.ndarray], summary: dict,
                   columns: tuple[str, ...] = ()) -> dict[str, str]:
  """A stage's `stats.json` (every map as nested lists) and `stats.csv` (layer, head, values).

  Maps are `[layers, heads]` or `[layers, heads, C]`; a 3-D map becomes one CSV
  column per `columns` entry (`name_column`).
  """
  paths = dict(json=layout.stats(stage), csv=layout.stats_csv(stage))
  workdir.write_json(paths["json"], dict(summary=summary, columns=list(columns),
                                         **workdir.provenance(),
                                         **{k: np.asarray(v).tolist() for k, v in maps.items()}))
  names, header = list(maps), ["layer", "head"]
  for k in names:
    header += [f"{k}_{c}" for c in columns] if np.ndim(maps[k]) == 3 else [k]
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(header)
  layers, heads = np.shape(maps[names[0]])[:2]
  for l in range(layers):
    for h in range(heads):
      row = [l, h]
      for k in names:
        row += [f"{x:.6g}" for x in np.atleast_1d(np.asarray(maps[k])[l, h])]
      w.writerow(row)
  with workdir.atomic_write(paths["csv"], newline="") as f:
    f.write(buf.getvalue())
  return paths
