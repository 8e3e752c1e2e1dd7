"""What a stage is (one record, `Stage`), and what every stage shares (`Setup`).

Each stage module exports one `Stage`; `papa_jax/registry.py` lists them, and
the config check, the workdir binding, the data checks and the plan of a run
all derive from those records (`run.py`). A stage's `run(setup)` gets the
`Setup`: config, workdir layout, task, model, tokenizer, mesh and the data
views it declared. Every fingerprint of a unit of work (`Setup.fingerprint`)
and every means file's data fingerprint covers the content of the files its
views read (`Setup.data_fingerprint`), so an edited file is never reused.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from papa_jax import convert, parallel, tokenization
from papa_jax.config import schema as config_schema
from papa_jax.workdir import input_files, storage
from papa_jax.workdir import rules as workdir
from papa_jax import data as data_lib
from papa_jax.errors import ConfigError
from papa_jax.workdir.layout import Layout

# The data a stage can read: the train split (`data.max_train_examples`), the
# task's evaluation split (`data.max_eval_examples`), or the analysis split
# (`effective.split`, `effective.max_examples`, `effective.min_valid_tokens`).
VIEWS = ("train", "eval", "analysis")


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage, declared once (in the spirit of big_vision's evaluators: chosen by name).

  Attributes:
    name: its `config.stage` value and the folder of its outputs.
    run: `run(setup) -> result` (a summary dict, or the results' rows).
    inputs: the data views it reads (`VIEWS`); read and checked before the
      workdir is bound.
    needs: stages whose outputs it reads; running it runs them first, and
      each skips the work it finished before.
    writes: glob patterns, relative to the workdir, of the files that mark its
      work finished; while they exist the workdir is bound to `groups`.
    groups: the config groups its results depend on.
    check: `check(setup)`, run once the workdir is bound (results of another
      config or of edited inputs refused, or removed under `overwrite`) and
      before any stage runs: that outputs it will reuse fit this run (None:
      nothing to check).
    memory: the kind of its largest program (`memory_plan.KINDS`: "forward",
      "capture", "through", "probe"), planned and checked against a device's
      memory before a run; "" when it runs none; None: not declared (not planned).
    batch_size: the config field holding that program's global batch size.
    skipped: `skipped(config, model_config)`, True where this config makes the stage
      run none of its programs (then not planned; None: it always runs them).
  """

  name: str
  run: Callable[[Setup], Any]
  inputs: tuple[str, ...] = ()
  needs: tuple[str, ...] = ()
  writes: tuple[str, ...] = ()
  groups: tuple[str, ...] = ()
  check: Callable[[Setup], None] | None = None
  memory: str | None = None
  batch_size: str = "run.batch_size"
  skipped: Callable[[Any, Any], bool] | None = None

  def __post_init__(self):
    bad = [v for v in self.inputs if v not in VIEWS]
    if bad:
      # internal check
      raise ValueError(f"Stage {self.name!r}: inputs {bad} are not among {VIEWS}.")
    unknown = set(self.groups) - set(config_schema.RESULT_GROUPS)
    if unknown:
      raise ValueError(f"Stage {self.name!r}: groups {sorted(unknown)} are not result groups "
                       f"of the config ({config_schema.RESULT_GROUPS}).")  # internal check


class Setup:
  """What every stage of one run shares: config, layout, task, model, tokenizer, mesh, data.

  Construction fails fast: the data files of `inputs` are checked before the
  model is loaded, and the model- and mesh-dependent config checks run next.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir_path: str,
               inputs: tuple[str, ...] = VIEWS):
    self.config = config
    self.layout = Layout(workdir_path)
    self.task = data_lib.resolve_task(config.data)
    self.inputs = tuple(inputs)
    data_lib.check_files(config.data, tuple(dict.fromkeys(self.split_name(v) for v in inputs)))
    self.model = convert.load_pretrained(
        config.model.name, compute_dtype=config_schema.compute_dtype(config, jax.default_backend()))
    config_schema.validate_for_model(config, self.model.config)
    self.tokenizer = self.model.tokenizer()
    self.mesh = parallel.make_mesh(config.run.num_devices)
    config_schema.validate_for_mesh(config, self.mesh.size)
    self.variants = config_schema.variants(config)
    self.seeds = config_schema.seeds(config)
    self.max_length = config.data.max_length
    self.baseline_train_features = None  # Set by the means stage when it can (see there).

  @property
  def workdir(self) -> str:
    return self.layout.root

  @property
  def model_fingerprint(self) -> str:
    return self.model.fingerprint

  def path(self, *parts: str) -> str:
    return self.layout.path(*parts)

  def split_name(self, view: str) -> str:
    """The split file a data view reads."""
    return {"train": "train", "eval": self.task.eval_split,
            "analysis": self.config.effective.split}[view]

  def split(self, name: str, max_examples: int = -1) -> data_lib.Encoded:
    return data_lib.load_split(self.config.data, name, self.tokenizer,
                               self.model.config.type_vocab_size, max_examples)

  @functools.cached_property
  def train_data(self) -> data_lib.Encoded:
    return self.split("train", self.config.data.max_train_examples)

  @functools.cached_property
  def eval_data(self) -> data_lib.Encoded:
    return self.split(self.task.eval_split, self.config.data.max_eval_examples)

  @functools.cached_property
  def analysis_data(self) -> data_lib.Encoded:
    e = self.config.effective
    data = self.split(e.split, e.max_examples)
    if e.min_valid_tokens > 0:
      data = data.take(np.flatnonzero(data.attention_mask.sum(1) > e.min_valid_tokens))
      if not len(data):
        raise ConfigError(f"effective.min_valid_tokens={e.min_valid_tokens}: no {e.split} "
                          "example has more real tokens than that.")
    return data

  def data(self, view: str) -> data_lib.Encoded:
    return {"train": lambda: self.train_data, "eval": lambda: self.eval_data,
            "analysis": lambda: self.analysis_data}[view]()

  def check_inputs(self) -> None:
    """Reads every data view of the run and checks its tokens (before any writing)."""
    for view in self.inputs:
      d = self.data(view)
      tokenization.check_unknown_rate(self.tokenizer, d.input_ids, d.attention_mask,
                                      f"{self.task.name}/{self.split_name(view)}")

  def sources(self, views: tuple[str, ...]) -> tuple[str, ...]:
    """The data sources (split names) `views` read: their splits, and the train split
    when the labels are collected from it."""
    first = ("train",) if data_lib.collects_labels(self.config.data) else ()
    return tuple(dict.fromkeys(first + tuple(self.split_name(v) for v in views)))

  @functools.cached_property
  def input_sources(self) -> dict[str, dict]:
    """Every source this run reads by content: its data splits and `"model"`
    (`input_files`); the workdir's `inputs.json` is the hash cache."""
    known = {}
    if storage.exists(self.layout.inputs):
      known = workdir.read_json(self.layout.inputs).get("sources", {})
    out = {s: data_lib.source_record(self.config.data, s, known.get(s))
           for s in self.sources(self.inputs)}
    out["model"] = input_files.source_record(
        model_files(self.config.model.name, self.model.tokenizer_dir), known.get("model"),
        fingerprint=self.model_fingerprint)
    return out

  def file_hashes(self, sources: tuple[str, ...] | None = None) -> dict[str, dict[str, str]]:
    """Source -> {path: SHA-256} of what `sources` (default: all this run reads) read."""
    return {s: {p: f["sha256"] for p, f in self.input_sources[s]["files"].items()}
            for s in (self.input_sources if sources is None else sources)}

  def data_fingerprint(self, views: tuple[str, ...]) -> str:
    """What the data of `views` is: the data config and the content of every source read."""
    return workdir.fingerprint(dict(config=self.config.data.to_dict(), content={
        s: input_files.content(self.input_sources[s]) for s in self.sources(views)}))

  def fingerprint(self, groups: tuple[str, ...], views: tuple[str, ...], **unit) -> str:
    """The fingerprint of one unit of work reading `views`, under this model, the
    content of its data and the config's `groups`."""
    return workdir.fingerprint(dict(unit, model=self.model_fingerprint, config=(
        config_schema.result_config(self.config, groups)), data=self.data_fingerprint(views)))

  def result_fingerprint(self, **unit) -> str:
    """The fingerprint of a sort, orderings or probe unit (the PAPA groups; train and eval)."""
    return self.fingerprint(config_schema.PAPA_GROUPS, ("train", "eval"), **unit)


def model_files(name_or_path: str, tokenizer_dir: str = "") -> list[str]:
  """The files a model is read from: config.json and its weights (or its ONNX file), and
  its tokenizer files (from `tokenizer_dir`, else beside the model)."""
  files = convert.source_files(name_or_path)  # config.json or the .onnx file comes first.
  folder = tokenizer_dir or os.path.dirname(files[0])
  tokenizer = [os.path.join(folder, n) for n in tokenization.TOKENIZER_FILES]
  return files + [p for p in tokenizer if os.path.isfile(p)]
