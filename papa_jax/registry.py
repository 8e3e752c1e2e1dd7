"""Every stage, by name: the one list the config check, the workdir and the runner read.

A stage module exports one `stage.Stage` record; adding a stage is one module
and one entry here. `plan(name)` is a stage with everything it needs, in
order; `finished_outputs()` maps each stage's finished-output patterns to the
config groups they bind the workdir to, `finished_inputs()` to the data views
they read.
"""

from __future__ import annotations

from papa_jax.analysis import (ablation, effective_stats, finetune, knockout, linguistic,
                               mixing_stats, patching_stage)
from papa_jax.papa import means, optimal, ordering_stage, probe, sort
from papa_jax.stage import Stage

STAGES: tuple[Stage, ...] = (
    means.STAGE, optimal.STAGE, sort.STAGE, ordering_stage.STAGE, probe.STAGE,
    effective_stats.STAGE, finetune.STAGE, linguistic.STAGE, ablation.STAGE, knockout.STAGE,
    patching_stage.STAGE, mixing_stats.STAGE,
)
BY_NAME = {s.name: s for s in STAGES}
ALIASES = {"all": "probe"}  # The whole PAPA pipeline: means, optimal, sort, orderings, probe.


def names() -> tuple[str, ...]:
  return tuple(BY_NAME) + tuple(ALIASES)


def plan(name: str) -> tuple[Stage, ...]:
  """The stages `config.stage=name` runs: its needs first (depth first), then itself."""
  order: list[str] = []

  def visit(n: str, path: tuple[str, ...]) -> None:
    if n in path:
      # internal check
      raise ValueError(f"Stages need each other in a cycle: {' -> '.join(path + (n,))}.")
    if n in order:
      return
    for need in BY_NAME[n].needs:
      visit(need, path + (n,))
    order.append(n)

  visit(ALIASES.get(name, name), ())
  return tuple(BY_NAME[n] for n in order)


def finished_outputs() -> dict[str, tuple[str, ...]]:
  """Finished-output glob (relative to the workdir) -> the config groups it depends on."""
  return {pattern: s.groups for s in STAGES for pattern in s.writes}


def finished_inputs() -> dict[str, tuple[str, ...]]:
  """Finished-output glob -> the data views it was computed from (its needs' included)."""
  return {pattern: tuple(dict.fromkeys(v for n in plan(s.name) for v in n.inputs))
          for s in STAGES for pattern in s.writes}


def output_dirs() -> tuple[str, ...]:
  """The folders of every stage's outputs (removed by `overwrite`)."""
  return tuple(BY_NAME)
