"""Task records through TensorFlow Datasets, from local files or the catalog.

`source="local"`: the project's own TFDS builder (`PapaLocal`) reads the
official files in a local directory and prepares them once as array_record
(no TensorFlow needed); its config name carries a fingerprint of the files, so
edited files are re-prepared, never served stale.
`source="tfds"`: the TFDS catalog (`glue/<task>`, `conll2003`), downloaded
when a network is there. Both yield the same records, in file order.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from papa_jax.data import readers
from papa_jax.data.tasks import Task

_READER_VERSION = "1"  # Bump when readers change what they yield.


class LocalTaskConfig(tfds.core.BuilderConfig):
  """Which task and files a `PapaLocal` build reads."""

  def __init__(self, *, task: Task, source_dir: str, skip_malformed: bool, fingerprint: str):
    super().__init__(name=f"{task.name}_{fingerprint[:16]}",
                     description=f"{task.name} from {source_dir}")
    self.task, self.source_dir, self.skip_malformed = task, source_dir, skip_malformed


class PapaLocal(tfds.core.GeneratorBasedBuilder):
  """TFDS builder over a local directory of a task's official files."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self) -> tfds.core.DatasetInfo:
    task = self.builder_config.task
    if task.kind == "tagging":
      features = {"idx": np.int64, "tokens": tfds.features.Sequence(tfds.features.Text()),
                  "tags": tfds.features.Sequence(np.int64)}
    else:
      features = {"idx": np.int64, "text_a": tfds.features.Text(),
                  "text_b": tfds.features.Text(),
                  "label": np.float32 if task.kind == "regression" else np.int64}
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(features))

  def _split_generators(self, dl_manager):
    cfg = self.builder_config
    splits = [s for s, f in cfg.task.files.items()
              if os.path.isfile(os.path.join(cfg.source_dir, f))]
    return {s: self._generate_examples(s) for s in splits}

  def _generate_examples(self, split):
    cfg = self.builder_config
    for rec in readers.read_split(cfg.task, cfg.source_dir, split,
                                  skip_malformed=cfg.skip_malformed):
      yield rec["idx"], rec


def fingerprint(task: Task, source_dir: str, skip_malformed: bool) -> str:
  h = hashlib.sha256(f"{_READER_VERSION}|{task.name}|{skip_malformed}".encode())
  for split in sorted(task.files):
    path = os.path.join(source_dir, task.files[split])
    if os.path.isfile(path):
      h.update(split.encode())
      with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
          h.update(chunk)
  return h.hexdigest()


@contextlib.contextmanager
def _lock(directory: str):
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


def local_records(task: Task, source_dir: str, split: str, tfds_dir: str,
                  skip_malformed: bool = False) -> list[dict]:
  readers.split_path(task, source_dir, split)  # Clear error if missing/empty.
  fp = fingerprint(task, source_dir, skip_malformed)
  config = LocalTaskConfig(task=task, source_dir=source_dir,
                           skip_malformed=skip_malformed, fingerprint=fp)
  with _lock(tfds_dir):
    builder = PapaLocal(config=config, data_dir=tfds_dir, file_format="array_record")
    builder.download_and_prepare()
  recs = _all(builder.as_data_source(split=split))
  return sorted(recs, key=lambda r: r["idx"])


def catalog_records(task: Task, split: str, tfds_dir: str) -> list[dict]:
  """Records from the TFDS catalog (needs network on first use)."""
  import tensorflow_datasets.text.conll2003  # noqa: F401  Registers builders.
  import tensorflow_datasets.text.glue  # noqa: F401
  tfds_split = task.tfds_splits[split]
  with _lock(tfds_dir):
    source = tfds.data_source(task.tfds_name, split=tfds_split, data_dir=tfds_dir,
                              download=True,
                              builder_kwargs=dict(file_format="array_record"))
  recs = _all(source)
  if task.kind == "tagging":
    feature = {"ner": "ner", "pos": "pos", "chunk": "chunks"}[task.name]
    names = tfds.builder(task.tfds_name, data_dir=tfds_dir).info.features[feature].feature.names
    unknown = sorted(set(names) - set(task.label_names))
    if unknown:
      raise readers.DataError(f"TFDS {task.tfds_name} has {task.name} tags {unknown} "
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
    raise readers.DataError(f"TFDS {task.tfds_name} {split} example {bad['idx']} has label "
                            f"{bad['label']} outside 0..{task.num_labels - 1}.")
  return sorted(out, key=lambda r: r["idx"])
