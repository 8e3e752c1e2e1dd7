"""Experiment suites: a grid of (model x task) runs and the PAPA report over them.

The `suite` command runs every cell of `config.suite.models x
config.suite.tasks` in its own sub-workdir `<workdir>/<model>__<task>` (each an
ordinary `stage=all` run: finished runs are reused, killed ones resume), then
writes the report. The `report` command only aggregates: over the finished
cells of a suite workdir, or over one experiment's workdir.

`suite.shard="I/N"` runs every N-th cell from the I-th (1-based), so N
machines (a job-scheduler array: `shard=$((SLURM_ARRAY_TASK_ID))/N`) share
one suite workdir; each cell's own workdir lock keeps a cell to one run, a cell
locked by a live run elsewhere is skipped, and whichever shard finds every
cell finished writes the report (the `report` command does it at any time).
`report_from_workdirs` does the same from Python for any list of finished
workdirs (read by `reader.read_workdir`).
"""

from __future__ import annotations

import copy
import os
import time
from typing import Sequence

import ml_collections
from absl import logging

from papa_jax import reader, results, run, uncertainty
from papa_jax.report import build as report
from papa_jax.workdir import storage
from papa_jax.workdir import rules as workdir_lib
from papa_jax import data as data_lib
from papa_jax.convert import MODEL_KEYS, short_name
from papa_jax.errors import ConfigError, ResultFileError
from papa_jax.workdir.layout import Layout

CELL_SEPARATOR = "__"


def cell_config(config: ml_collections.ConfigDict, model: str, task: str
                ) -> ml_collections.ConfigDict:
  """The `stage=all` config of one cell: the suite's settings on one model and task."""
  c = copy.deepcopy(config)
  c.unlock()
  del c["suite"]
  c.lock()
  c.stage = "all"
  c.model.name = MODEL_KEYS.get(model, model)
  c.data.task = task
  c.data.max_length = config.suite.max_length[task]
  c.data.data_dir = config.suite.data_dirs[task]
  return c


def cells(config: ml_collections.ConfigDict) -> list[tuple[str, str]]:
  return [(m, t) for m in config.suite.models for t in config.suite.tasks]


def cell_dir(path: str, model: str, task: str) -> str:
  safe = model.replace("/", "_").replace(":", "_")
  return os.path.join(path, f"{safe}{CELL_SEPARATOR}{task}")


def parse_shard(shard: str) -> tuple[int, int]:
  """`"I/N"` (1 <= I <= N) -> (I - 1, N); `""` -> (0, 1), every cell."""
  if not shard:
    return 0, 1
  i, sep, n = str(shard).partition("/")
  try:
    index, count = int(i), int(n)
  except ValueError:
    index = count = 0
  if not sep or not 1 <= index <= count:
    raise ConfigError(f"suite.shard={shard!r}: use I/N with 1 <= I <= N (e.g. 2/4), or '' "
                      "for every cell.")
  return index - 1, count


def shard_cells(config: ml_collections.ConfigDict) -> list[tuple[str, str]]:
  """This shard's cells: every N-th cell of the grid from the I-th."""
  index, count = parse_shard(config.suite.get("shard", ""))
  return cells(config)[index::count]


def run_suite(config: ml_collections.ConfigDict, path: str) -> dict | None:
  """Runs this shard's cells, then writes the report if every cell has finished."""
  grid = cells(config)
  if not grid:
    raise ConfigError("suite.models and suite.tasks must both be non-empty.")
  mine = shard_cells(config)
  for model, task in grid:  # Every cell's static checks before any work.
    run.check_config(cell_config(config, model, task))
  t0 = time.perf_counter()
  for i, (model, task) in enumerate(mine):
    logging.info("suite: cell %d/%d (%s on %s); %.0fs so far.", i + 1, len(mine), model, task,
                 time.perf_counter() - t0)
    try:
      run.run(cell_config(config, model, task), cell_dir(path, model, task))
    except workdir_lib.WorkdirLocked as e:  # Another shard (or a rerun) is on it.
      logging.warning("suite: skipping %s on %s: %s", model, task, e)
  left = sorted({cell_dir(path, m, t) for m, t in grid} - set(finished_cells(path)))
  if left:
    logging.info("suite: this shard is done; %d cells are unfinished or run elsewhere (%s); "
                 "the shard that finishes last writes the report.", len(left),
                 ", ".join(os.path.basename(p) for p in left))
    return None
  return write(config, path)


def finished_cells(path: str) -> list[str]:
  """Sub-workdirs of `path` holding a finished probe stage (or `path` itself)."""
  if storage.exists(Layout(path).results()):
    return [path]
  return sorted(os.path.join(path, d) for d in storage.listdir(path)
                if storage.exists(Layout(os.path.join(path, d)).results()))


def load_experiment(path: str, model: str | None = None) -> report.Experiment:
  """A finished workdir as a `report.Experiment` (predictions, scores, means, gates)."""
  wd = reader.read_workdir(path)
  cfg = ml_collections.ConfigDict(wd.config)
  try:
    task = data_lib.resolve_task(cfg.data)
  except (ValueError, OSError):  # Data moved since: the saved label names suffice.
    task = data_lib.get_task(cfg.data.task)
  rows = wd.rows
  if not rows:
    raise ResultFileError(f"{wd.layout.results()} has no probing runs to report on.")
  if any("seed" not in r for r in rows):
    raise ResultFileError(f"{wd.layout.results()}: rows without a 'seed' field come from papa-jax "
                     "before per-seed results and predictions; rerun the experiment with "
                     "this version to compare or report it.")
  predictions: dict = {}
  scores: dict = {}
  labels = None
  for r in rows:
    key = (results.condition(r), r["static_heads"])
    scores.setdefault(key, {})[r["seed"]] = r["score"]
    saved = wd.predictions(r)
    if saved is not None:
      predictions.setdefault(key, {})[r["seed"]] = saved["predictions"]
      labels = saved["labels"] if labels is None else labels
  raw = wd.means.get("raw")
  return report.Experiment(
      model=model or short_name(cfg.model.name), task=task, total_heads=rows[0]["total_heads"],
      labels=labels, predictions=predictions, scores=scores,
      means=raw.avgs if raw is not None else None, gates=wd.lambdas, ranking=wd.ranking,
      train_examples=rows[0]["examples"], eval_examples=rows[0]["eval_examples"],
      seeds=wd.seeds, orderings=wd.rankings, head_maps=wd.head_maps,
      ranking_check=wd.sort_check,
      optimal_objective=wd.config.get("optimal", {}).get("objective", "task"))


def report_from_workdirs(paths: Sequence[str], out_dir: str, *,
                         n_boot: int = uncertainty.N_BOOT, seed: int = 0,
                         level: float = 0.95, seed_pairing: str = "paired") -> dict[str, str]:
  """The PAPA report over finished workdirs (one experiment each)."""
  experiments = []
  for p in paths:
    name = os.path.basename(os.path.normpath(p))
    model = name.split(CELL_SEPARATOR)[0] if CELL_SEPARATOR in name else None
    experiments.append(load_experiment(p, model))
  if not experiments:
    raise ConfigError("No finished experiment (results.json) to report on.")
  return report.write_report(experiments, out_dir, n_boot=n_boot, seed=seed, level=level,
                             seed_pairing=seed_pairing, provenance=workdir_lib.provenance())


def write(config: ml_collections.ConfigDict, path: str) -> dict:
  """The `report` command: the report over the finished cells under `path`."""
  done = finished_cells(path)
  if "suite" in config:
    want = {cell_dir(path, m, t) for m, t in cells(config)}
    missing = sorted(want - set(done))
    if missing:
      logging.warning("report: %d cells are not finished and are left out: %s", len(missing),
                      ", ".join(os.path.basename(m) for m in missing))
  r = config.report
  paths = report_from_workdirs(done, Layout(path).report_dir, n_boot=r.n_boot,
                               seed=r.seed, level=r.level, seed_pairing=r.seed_pairing)
  logging.info("report over %d experiments -> %s", len(done), paths["md"])
  return paths
