"""What the launcher runs: a stage (`run.py`), or a command above the stages.

Commands read finished workdirs or run stages, and nothing calls back into
them: `suite` runs `run.run` once per (model, task) cell and writes the
report; `report` writes the report over finished workdirs; `explore` writes
the attention explorer page of a finished workdir. `main(config, workdir)`
picks by `config.stage`.

A finished workdir on a read-only mount is read without its lock (no run can
write there): `explore` writes its page to an absolute `explore.output` outside
it; `report`, which writes under the workdir, says how to write it elsewhere.
"""

from __future__ import annotations

import contextlib
import os

import ml_collections

from papa_jax import explorer, parallel, registry, run, suite
from papa_jax.config import schema as config_schema
from papa_jax.workdir import storage
from papa_jax.workdir import rules as workdir_lib
from papa_jax.errors import WorkdirError
from papa_jax.explorer import page
from papa_jax.workdir.layout import Layout

COMMANDS = ("suite", "report", "explore")


def names() -> tuple[str, ...]:
  """Every value `config.stage` takes."""
  return registry.names() + COMMANDS


def main(config: ml_collections.ConfigDict, workdir: str):
  """Runs `config.stage`: a command, or a stage with the stages it needs."""
  if config.stage not in COMMANDS:
    return run.run(config, workdir)
  config_schema.validate(config)
  why = workdir_lib.read_only(workdir) if config.stage != "suite" else None
  if why:
    return _read_only(config, workdir, why)
  workdir_lib.prepare(workdir)
  if config.stage == "suite":
    return suite.run_suite(config, workdir)  # Each cell takes its own lock.
  main_process = parallel.is_main_process()
  stale = config.run.lease_stale_seconds
  with workdir_lib.lock(workdir, stale) if main_process else contextlib.nullcontext():
    if not main_process:
      return None
    if config.stage == "report":
      return suite.write(config, workdir)
    return explorer.run(config, workdir)


def _inside(path: str, folder: str) -> bool:
  path, folder = os.path.realpath(path), os.path.realpath(folder)
  return os.path.commonpath([path, folder]) == folder


def _read_only(config: ml_collections.ConfigDict, workdir: str, why: str):
  """`report` or `explore` over the workdir that cannot be written (`why`): read without its
  lock, or one line saying where to write instead."""
  if config.stage == "explore":
    out = page.output_path(workdir, config.explore.output)
    if not storage.is_local(out) or not _inside(out, workdir):
      return explorer.run(config, workdir) if parallel.is_main_process() else None
    raise WorkdirError(
        f"--workdir={workdir} is {why}, and explore writes its page to {out}. Give "
        "--config.explore.output=/a/writable/folder/explorer.html (an absolute path outside "
        "the workdir): the finished workdir is then read without its lock.")
  raise WorkdirError(
      f"--workdir={workdir} is {why}, and report writes {Layout(workdir).report_dir}. Write "
      "the report elsewhere from Python: papa_jax.suite.report_from_workdirs("
      f"papa_jax.suite.finished_cells('{workdir}'), '/a/writable/report') (or copy the "
      "workdir to a writable place and run report there); papa_jax.api.load_results reads "
      "its results as they are.")
