"""Per-head analysis stages: an analysis supplies its math, the runner does the rest.

Subclass `PerHeadAnalysis` (big_vision's `evaluators/mean.py`: inherit, and the
framework masks and sums) with the per-example statistics of one batch and,
if the defaults do not fit, a summary, the maps to write and figures; then
`stage(MyAnalysis)` is the record for `papa_jax/registry.py`. The stage runs
the analysis over `effective.split` (`Setup.analysis_data`) on the runner
(`papa_jax/runner.py`: data-parallel, float64 sums, resumable from
`<name>/partial.partial.npz`) and writes its maps as `head_maps.HeadMap`s
(`<name>/stats.json`: every map as nested lists, their descriptions, a summary,
provenance; `<name>/stats.csv`: a row per head) and its figures; the explorer,
the report and the agreement table then show them. See `docs/analyses.md`
for a worked recipe.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Mapping

import jax
import numpy as np
from absl import logging

from papa_jax import convert, head_maps, parallel
from papa_jax.workdir import resume
from papa_jax import runner
from papa_jax.workdir.layout import RELATIVE
from papa_jax.models.encoder import Capture, EncoderOutput
from papa_jax.stage import Setup, Stage

Array = jax.Array
ANALYSIS_GROUPS = ("model", "data", "effective")


class PerHeadAnalysis:
  """The math of one per-head analysis; subclasses are frozen dataclasses.

  Class attributes: `name` (stage and folder name), `capture` (what the
  encoder returns), `groups` (config groups the results depend on),
  `columns` (names of a last axis of the maps) and `infos` (each map's label,
  unit and what a higher value says of the head; `head_maps.HeadInfo`), which
  the explorer, the report and the agreement table show it by; `memory` (its
  pass's program kind in `memory_plan`: "capture" when it captures attention).
  """

  name: ClassVar[str]
  capture: ClassVar[Capture] = Capture(probs=True, values=True)
  groups: ClassVar[tuple[str, ...]] = ANALYSIS_GROUPS
  memory: ClassVar[str] = "capture"
  columns: ClassVar[tuple[str, ...]] = ()
  infos: ClassVar[Mapping[str, head_maps.HeadInfo]] = {}
  # The matmul precision the pass traces under ("highest": exact float32 on GPU/TPU too).
  matmul_precision: ClassVar[str | None] = None

  @classmethod
  def from_setup(cls, setup: Setup) -> PerHeadAnalysis:
    """The analysis for this run (its fields from the config or the model)."""
    del setup
    return cls()

  def arrays(self, setup: Setup, data) -> dict[str, np.ndarray]:
    """Per-example inputs beyond the encoded split (`[N, ...]`, e.g. token classes)."""
    del setup, data
    return {}

  def params(self, setup: Setup) -> tuple:
    """The parameter sets to run (one `EncoderOutput` each in `stats`)."""
    return (setup.model.params,)

  def key(self, setup: Setup) -> dict:
    """What else the results depend on (beyond `groups` and the model), for resuming."""
    del setup
    return {}

  def stats(self, outs: tuple[EncoderOutput, ...], batch: dict, mask: Array,
            params: tuple) -> Mapping[str, runner.Weighted]:
    """Per-example statistics of one batch (traced); `mask` is `[B, L]`, padding rows 0;
    `params` are the parameter sets the outputs came from (e.g. for a layer's weights)."""
    raise NotImplementedError

  def finalize(self, totals: runner.Totals) -> dict[str, Any]:
    """Means of every statistic, and the number of examples as `count`."""
    return dict(totals.means(), count=float(totals.examples))

  def summary(self, st: dict[str, Any], setup: Setup, data) -> dict:
    del st, setup, data
    return {}

  def maps(self, st: dict[str, Any]) -> dict[str, np.ndarray]:
    """The `[layers, heads(, C)]` maps to write (default: every array but counts)."""
    return {k: v for k, v in st.items() if np.ndim(v) >= 2}

  def head_maps(self, st: dict[str, Any], summary: dict) -> list[head_maps.HeadMap]:
    """`maps` as records, labelled by `infos`, over the summary's examples of its split
    (else `count`, when that is one number)."""
    n = summary.get("examples", st.get("count"))
    return head_maps.maps_of(self.name, self.infos, self.maps(st),
                             examples=n if np.ndim(n) == 0 else None,
                             split=summary.get("split", ""), columns=self.columns)

  def figures(self, st: dict[str, Any], summary: dict, setup: Setup, data) -> None:
    """Draws the figures (e.g. `figures.head_maps` to `setup.layout.figure(name, file)`)."""
    del st, summary, setup, data

  def write(self, st: dict[str, Any], summary: dict, setup: Setup, data) -> None:
    """Writes stats.json, stats.csv and the figures (main process only)."""
    head_maps.write(setup.layout, self.name, self.head_maps(st, summary), summary,
                    columns=list(self.columns))
    self.figures(st, summary, setup, data)


def label(setup: Setup, what: str, n: int) -> str:
  """A figure title: model, task, split, examples, and what the figure shows."""
  c = setup.config
  return (f"{convert.short_name(c.model.name)} / {setup.task.name} {c.effective.split} "
          f"({n} examples): {what}")


def run(kind: type[PerHeadAnalysis], setup: Setup) -> dict:
  """Runs the analysis `kind` over the analysis split; returns its summary."""
  c = setup.config
  analysis = kind.from_setup(setup)
  data = setup.analysis_data
  arrays = dict(data.arrays(), **analysis.arrays(setup, data))
  params = analysis.params(setup)
  partial = setup.layout.partial(analysis.name)
  precision = analysis.matmul_precision or jax.config.jax_default_matmul_precision
  with jax.default_matmul_precision(precision):
    totals = runner.sum_pass(
        analysis.stats, analysis.capture, setup.model.config, params, arrays, setup.mesh,
        batch_size=c.run.batch_size, partial=partial,
        run_key=setup.fingerprint(analysis.groups, ("analysis",), stage=analysis.name,
                                **analysis.key(setup)),
        checkpoint_every=c.run.checkpoint_every_batches, desc=analysis.name)
  st = analysis.finalize(totals)
  summary = dict(model=c.model.name, task=setup.task.name, split=c.effective.split,
                 **analysis.summary(st, setup, data))
  if parallel.is_main_process():
    analysis.write(st, summary, setup, data)
    resume.remove(partial)
  logging.info("%s: %s", analysis.name, summary)
  return summary


def stage(kind: type[PerHeadAnalysis]) -> Stage:
  """The registry record of a per-head analysis."""
  return Stage(name=kind.name, run=functools.partial(run, kind), inputs=("analysis",),
               writes=(RELATIVE.stats(kind.name),), groups=kind.groups, memory=kind.memory)
