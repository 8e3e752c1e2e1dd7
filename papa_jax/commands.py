"""What the launcher runs: a stage (`run.py`), or a command above the stages.

Commands read finished workdirs or run stages, and nothing calls back into
them: `suite` runs `run.run` once per (model, task) cell and writes the
report; `report` writes the report over finished workdirs; `explore` writes
the attention explorer page of a finished workdir. `main(config, workdir)`
picks by `config.stage`.
"""

from __future__ import annotations

import contextlib

import ml_collections

from papa_jax import config_schema, explorer, parallel, registry, run, suite
from papa_jax import workdir as workdir_lib

COMMANDS = ("suite", "report", "explore")


def names() -> tuple[str, ...]:
  """Every value `config.stage` takes."""
  return registry.names() + COMMANDS


def main(config: ml_collections.ConfigDict, workdir: str):
  """Runs `config.stage`: a command, or a stage with the stages it needs."""
  if config.stage not in COMMANDS:
    return run.run(config, workdir)
  config_schema.validate(config)
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
