"""Reading a finished workdir: one reader for the API, the suite report and the explorer.

`read_workdir(path)` gives a `FinishedWorkdir`: the config, the results rows,
the constant matrices of every variant present, the gates and head ranking,
each analysis stage's `stats.json`, every per-head result as a `head_maps.HeadMap`,
and the per-run dev predictions on demand.
Paths are `layout.Layout`'s; what is missing is None (or empty), and what is
there is checked (a ranking must be a permutation of the model's heads, every
means file must have the same shape).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from papa_jax import chance, head_maps
from papa_jax.config import schema as config_schema
from papa_jax.workdir import storage, rules as workdir
from papa_jax.workdir.layout import Layout
from papa_jax.papa import means as means_lib
from papa_jax.papa import schedule
from papa_jax.errors import IncompleteWorkdir, ResultFileError

@dataclasses.dataclass
class FinishedWorkdir:
  """What a workdir holds (see the module docstring)."""

  layout: Layout
  config: dict
  results: dict | None = None
  means: dict[str, means_lib.Means] = dataclasses.field(default_factory=dict)
  lambdas: np.ndarray | None = None
  ranking: list | None = None
  stats: dict[str, dict] = dataclasses.field(default_factory=dict)
  orderings: dict[str, dict] = dataclasses.field(default_factory=dict)  # name -> its file
  sort_check: dict | None = None  # Whether the sorting run learned anything (`chance`).

  @property
  def rankings(self) -> dict[str, list]:
    """Every head ordering's ranking, PAPA's ("lambda") first."""
    out = {"lambda": self.ranking} if self.ranking is not None else {}
    return dict(out, **{k: v["ranking"] for k, v in self.orderings.items()})

  @property
  def head_maps(self) -> list[head_maps.HeadMap]:
    """Every per-head result here: each stage's maps, PAPA's gates, the scored orderings."""
    out = [m for stage, st in self.stats.items() for m in head_maps.read(stage, st)]
    if self.lambdas is not None:
      out.append(head_maps.HeadMap(
          "sort", "lambda", np.asarray(self.lambdas, np.float64),
          "PAPA gate logit λ (high: kept input-dependent longest)", higher=head_maps.MORE,
          split="train", note=chance.warning("the sorting run", self.sort_check)))
    for name, saved in self.orderings.items():
      if saved.get("scores") is not None:
        higher = head_maps.MORE if saved.get("direction") == "ascending" else head_maps.LESS
        out.append(head_maps.HeadMap("orderings", name, np.asarray(saved["scores"], np.float64),
                                     f"{name} score (head ordering)", higher=higher))
    return out

  @property
  def token_maps(self) -> list[head_maps.TokenMap]:
    """Every per-position result here (`head_maps.TokenMap`), stage by stage."""
    return [m for stage, st in self.stats.items() for m in head_maps.read_token_maps(stage, st)]

  @property
  def path(self) -> str:
    return self.layout.root

  @property
  def rows(self) -> list[dict]:
    return list((self.results or {}).get("rows", []))

  @property
  def seeds(self) -> tuple:
    return tuple((self.results or {}).get("seeds", ()))

  def predictions(self, row: dict) -> dict[str, np.ndarray] | None:
    """A results row's saved dev outputs (`predictions`, `labels`, maybe `logits`)."""
    path = self.layout.row_predictions(row)
    if not storage.exists(path):
      return None
    with np.load(storage.readable(path)) as z:
      return {k: z[k] for k in z.files}


def read_config(path: str) -> dict:
  """A finished workdir's config (`config.json`, older field names migrated)."""
  layout = Layout(path)
  if not storage.exists(layout.config):
    raise IncompleteWorkdir(f"{layout.config} does not exist: {path} is not a finished "
                            "workdir.")
  return config_schema.migrate(workdir.read_json(layout.config))


def read_workdir(path: str, *, with_means: bool = True) -> FinishedWorkdir:
  """Reads a finished workdir (`config.json` at least); see `FinishedWorkdir`."""
  layout = Layout(path)
  out = FinishedWorkdir(layout, read_config(path))
  if storage.exists(layout.results()):
    out.results = workdir.read_json(layout.results())
  if with_means:
    out.means = {v: means_lib.load_means(layout.means(v)) for v in means_lib.FILE_VARIANTS
                 if storage.exists(layout.means(v))}
    shapes = {v: m.avgs.shape for v, m in out.means.items()}
    if len(set(shapes.values())) > 1:
      raise ResultFileError(f"Means files of different shapes in {path}: {shapes}.")
  if storage.exists(layout.ranking):
    out.lambdas = (np.load(storage.readable(layout.lambdas))
                   if storage.exists(layout.lambdas) else None)
    shape = _heads_shape(out)
    out.ranking = schedule.load_ranking(layout.ranking, *shape)
    if out.lambdas is not None and out.lambdas.shape != shape:
      raise ResultFileError(f"{layout.lambdas} has shape {out.lambdas.shape}; expected {shape}.")
    if storage.exists(layout.sort_history):
      out.sort_check = workdir.read_json(layout.sort_history).get("check")
  for path in sorted(storage.glob(layout.ordering("*"))):
    saved = workdir.read_json(path)
    if out.ranking is not None or out.means:
      schedule.check_ranking(saved["ranking"], *_heads_shape(out), path)
    out.orderings[os.path.basename(path)[:-len(".json")]] = saved
  for path in sorted(storage.glob(layout.stats("*"))):  # Each analysis stage's statistics.
    out.stats[os.path.basename(os.path.dirname(path))] = workdir.read_json(path)
  return out


def _heads_shape(wd: FinishedWorkdir) -> tuple[int, int]:
  """(layers, heads) from the means, else the gates, else the ranking itself."""
  if wd.means:
    return tuple(next(iter(wd.means.values())).avgs.shape[:2])
  if wd.lambdas is not None:
    return tuple(wd.lambdas.shape)
  ranking: Any = workdir.read_json(wd.layout.ranking)
  return max(l for l, _ in ranking) + 1, max(h for _, h in ranking) + 1
