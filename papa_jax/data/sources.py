"""Built-in task records from the TFDS catalog (`data.source="tfds"`).

The catalog (`glue/<task>`, `conll2003`) is downloaded on first use when a
network is there; its records have the same shape and label ids as those read
from local files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Any

import numpy as np

from papa_jax.workdir import input_files
from papa_jax.data.errors import DataError
from papa_jax.data.tasks import Task


@contextlib.contextmanager
def _lock(directory: str):
  """One process prepares a TFDS directory at a time (multi-host runs share it)."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, ".papa_prepare.lock"), "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _decode(v: Any):
  if isinstance(v, bytes):
    return v.decode("utf-8")
  if isinstance(v, np.ndarray) and v.dtype.kind in "OS":
    return [x.decode("utf-8") if isinstance(x, bytes) else x for x in v.tolist()]
  if isinstance(v, np.ndarray):
    return v.tolist()
  if isinstance(v, np.generic):
    return v.item()
  if isinstance(v, (list, tuple)):
    return [_decode(x) for x in v]
  return v


def _all(source) -> list[dict]:
  n = len(source)
  if not n:
    return []
  try:
    examples = source.__getitems__(list(range(n)))
  except TypeError:  # Some sources (e.g. TFDS mocks) lack batched reads.
    examples = [source[i] for i in range(n)]
  return [{k: _decode(v) for k, v in ex.items()} for ex in examples]


def _tfds():
  """TensorFlow Datasets with this project's builders registered (slow to import: only the
  catalog path needs it)."""
  import tensorflow_datasets as tfds
  import tensorflow_datasets.text.conll2003  # noqa: F401  Registers builders.
  import tensorflow_datasets.text.glue  # noqa: F401
  return tfds


def catalog_source(task: Task, split: str, tfds_dir: str,
                   known: dict | None = None) -> dict:
  """A catalog split by content (`input_files`): the dataset's name and version, the
  split, and its prepared files (none when TFDS did not write them under `tfds_dir`)."""
  tfds = _tfds()
  builder = tfds.builder(task.tfds_name, data_dir=tfds_dir, file_format="array_record")
  name = task.tfds_splits.get(split, split)
  try:
    paths = [str(p) for p in builder.info.splits[name].filepaths]
  except (KeyError, ValueError):  # Not prepared here (a mocked or foreign catalog).
    paths = []
  return input_files.source_record([p for p in paths if os.path.isfile(p)], known,
                                   tfds=builder.info.full_name, tfds_split=name)


def catalog_records(task: Task, split: str, tfds_dir: str) -> list[dict]:
  """Records from the TFDS catalog (needs network on first use)."""
  tfds = _tfds()
  if not task.tfds_name:
    raise DataError(f"Task {task.name} has no TFDS catalog entry: use data.source='local'.")
  if split not in task.tfds_splits:
    raise DataError(f"Task {task.name} has no split {split!r} in TFDS {task.tfds_name}.")
  with _lock(tfds_dir):
    source = tfds.data_source(task.tfds_name, split=task.tfds_splits[split], data_dir=tfds_dir,
                              download=True,
                              builder_kwargs=dict(file_format="array_record"))
  recs = _all(source)
  if task.kind == "tagging":
    feature = task.tfds_tags
    names = tfds.builder(task.tfds_name, data_dir=tfds_dir).info.features[feature].feature.names
    unknown = sorted(set(names) - set(task.label_names))
    if unknown:
      raise DataError(f"TFDS {task.tfds_name} has {task.name} tags {unknown} "
                      "outside this project's label set.")
    to_ours = np.array([task.label_names.index(n) for n in names])
    out = [dict(idx=i, tokens=r["tokens"], tags=to_ours[np.asarray(r[feature], int)].tolist())
           for i, r in enumerate(recs)]
  else:
    out = [dict(idx=r.get("idx", i), text_a=r[task.tfds_text[0]],
                text_b=r[task.tfds_text[1]] if task.is_pair else "", label=r["label"])
           for i, r in enumerate(recs)]
  if task.kind == "classification" and any(not 0 <= r["label"] < task.num_labels for r in out):
    bad = next(r for r in out if not 0 <= r["label"] < task.num_labels)
    raise DataError(f"TFDS {task.tfds_name} {split} example {bad['idx']} has label "
                    f"{bad['label']} outside 0..{task.num_labels - 1}.")
  return sorted(out, key=lambda r: r["idx"])
