"""Runs one stage of a config in a workdir, with the stages it needs first.

  run(config, workdir)

What a stage reads, needs, writes and depends on is its record in
`papa_jax/registry.py`; this module only sequences them: static checks,
then the `Setup` (data files checked before the model loads), every data view
read and checked, then the workdir bound to the config and to the content of
what it reads (`workdir.bind`: an edited data file, tokenizer or weights file
is refused by name, or its results removed under `overwrite`), then every
reused output checked, then the stages in order. Nothing is written before
the inputs have been read and checked. Each stage skips work whose outputs
exist for this config and inputs, and a killed or preempted stage resumes from
its last checkpoint.
The workdir's layout is `papa_jax/workdir/layout.py`'s. Commands above the stages
(suite, report, explore) are `papa_jax/commands.py`'s.
"""

from __future__ import annotations

import contextlib
import time

import ml_collections
from absl import logging

from papa_jax import memory_plan, parallel, registry
from papa_jax.config import schema as config_schema
from papa_jax import data as data_lib
from papa_jax.workdir import rules as workdir_lib
from papa_jax.errors import ConfigError
from papa_jax.stage import Setup, Stage

__all__ = ["ConfigError", "check_config", "run"]


def check_config(config: ml_collections.ConfigDict) -> tuple[Stage, ...]:
  """Every check that needs neither data files nor the model; returns the plan."""
  config_schema.validate(config)
  data_lib.check_config(config.data)  # Raises TaskConfigError, a ConfigError.
  if config.stage not in registry.names():
    raise ConfigError(f"stage={config.stage!r}; choose a stage {registry.names()} or a "
                      "command (suite, report, explore; the launcher runs those).")
  return registry.plan(config.stage)


def run(config: ml_collections.ConfigDict, workdir: str):
  """Runs `config.stage` (and the stages it needs) in `workdir`; returns its result."""
  stages = check_config(config)
  workdir_lib.prepare(workdir)
  main = parallel.is_main_process()
  stale = config.run.lease_stale_seconds
  with workdir_lib.lock(workdir, stale) if main else contextlib.nullcontext():
    setup = Setup(config, workdir, tuple(dict.fromkeys(v for s in stages for v in s.inputs)))
    _check_memory(config, setup, stages)  # Refuses a plan over the device's memory.
    setup.check_inputs()  # Nothing is written before the data has been read and checked.
    # Refuses finished work of another config or other input content (or removes it under
    # `overwrite`) before the stages check the outputs they will reuse.
    workdir_lib.bind(config, workdir, finished=registry.finished_outputs(),
                     output_dirs=registry.output_dirs(), main_process=main,
                     inputs=setup.input_sources, finished_sources={
                         p: setup.sources(views) + ("model",)
                         for p, views in registry.finished_inputs().items()})
    parallel.sync("workdir bound")  # Every process checks outputs after the removal.
    for s in stages:
      if s.check is not None:
        s.check(setup)
    out = None
    for s in stages:
      t0 = time.perf_counter()
      out = s.run(setup)
      parallel.sync(f"stage {s.name} written")  # Later stages read what process 0 wrote.
      logging.info("Stage %s finished in %.1fs.", s.name, time.perf_counter() - t0)
  return out


def _check_memory(config: ml_collections.ConfigDict, setup: Setup,
                  stages: tuple[Stage, ...]) -> None:
  programs = memory_plan.check(config, setup.model.config, setup.model.params, setup.mesh.size,
                               stages)
  logging.info("Memory plan per device (papa_jax/memory_plan.py): %s.", ", ".join(
      f"{p.stage} {p.total / 2**30:.2f} GiB" for p in programs))
