"""Where everything lives in a workdir: one object knows every path.

  config.json                          the resolved config (`workdir.bind`)
  inputs.json                          what the results read, by content (`input_files`)
  means/means_{raw,effective}.npz      constant matrices (`papa/means.py`)
  sort/lambdas.npy, sorted_heads.json, history.json
  orderings/{name}.json                head orderings beside PAPA's (random draws, scores)
  probe/{variant}[_{ordering}]_k{K}_s{seed}/   result.json, predictions.npz, checkpoints/
  results.{json,csv,md}, papa_curve.png
  <analysis>/stats.json, stats.csv, *.png   one folder per analysis stage
  report/, explorer.html               written by the report and explore commands
Paths only: nothing here reads or writes a file. `RELATIVE` gives the same paths
relative to any workdir (for the patterns a stage declares it writes).
"""

from __future__ import annotations

import dataclasses
import os

RESULT_FILES = ("results.json", "results.csv", "results.md", "papa_curve.png")


@dataclasses.dataclass(frozen=True)
class Layout:
  """The paths of one workdir (`root`)."""

  root: str

  def path(self, *parts: str) -> str:
    return os.path.join(self.root, *parts)

  @property
  def config(self) -> str:
    return self.path("config.json")

  @property
  def inputs(self) -> str:
    return self.path("inputs.json")

  @property
  def lock(self) -> str:
    return self.path(".lock")

  def stage_dir(self, stage: str) -> str:
    """The folder of a stage's outputs (`means`, `sort`, `probe`, each analysis)."""
    return self.path(stage)

  # PAPA: means, sort, probe.

  def means(self, variant: str) -> str:
    return self.path("means", f"means_{variant}.npz")

  def partial(self, stage: str, name: str = "partial") -> str:
    """Partial sums of a resumable pass (`resume.py`), under the stage's folder."""
    return self.path(stage, f"{name}.partial.npz")

  def means_partial(self, variant: str) -> str:
    return self.partial("means", f"means_{variant}")

  @property
  def lambdas(self) -> str:
    return self.path("sort", "lambdas.npy")

  @property
  def ranking(self) -> str:
    return self.path("sort", "sorted_heads.json")

  @property
  def sort_history(self) -> str:
    return self.path("sort", "history.json")

  def ordering(self, name: str) -> str:
    """A head ordering other than PAPA's (`papa/orderings.py`)."""
    return self.path("orderings", f"{name}.json")

  def probe_run(self, variant: str, k: int, seed: int, ordering: str = "lambda") -> str:
    """A probing run's folder; PAPA's own ordering keeps the name it always had."""
    tag = variant if ordering == "lambda" else f"{variant}_{ordering}"
    return self.path("probe", f"{tag}_k{k}_s{seed}")

  def probe_result(self, variant: str, k: int, seed: int, ordering: str = "lambda") -> str:
    return os.path.join(self.probe_run(variant, k, seed, ordering), "result.json")

  def probe_predictions(self, variant: str, k: int, seed: int, ordering: str = "lambda") -> str:
    return os.path.join(self.probe_run(variant, k, seed, ordering), "predictions.npz")

  def row_predictions(self, row: dict) -> str:
    """The dev predictions of a results row: in its `run` folder (a run reused by content may
    live under another run's name), else where its variant, k and seed put them."""
    return (self.path(row["run"], "predictions.npz") if row.get("run") else
            self.probe_predictions(row["variant"], row["static_heads"], row["seed"],
                                   row.get("ordering", "lambda")))

  def checkpoints(self, run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")

  def results(self, ext: str = "json") -> str:
    return self.path(f"results.{ext}")

  @property
  def papa_curve(self) -> str:
    return self.path("papa_curve.png")

  # Analyses, commands.

  def stats(self, stage: str) -> str:
    return self.path(stage, "stats.json")

  def stats_csv(self, stage: str) -> str:
    return self.path(stage, "stats.csv")

  def figure(self, stage: str, name: str) -> str:
    return self.path(stage, name)

  @property
  def report_dir(self) -> str:
    return self.path("report")

  def explorer(self, name: str = "explorer.html") -> str:
    return self.path(name)


RELATIVE = Layout("")  # Paths relative to the workdir: RELATIVE.means("*") == "means/means_*.npz".
