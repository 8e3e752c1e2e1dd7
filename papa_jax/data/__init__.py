"""Task data: a declared task's files (or the TFDS catalog) -> fixed-length arrays.

A task is data (`tasks.Task`): a built-in entry of `TASKS`, or one declared in
`config.data.custom` (`data.task="custom"`). `resolve_task(config.data)` gives
the complete task (with labels collected from the train split when not listed);
`check_files` fails fast when a split's file is missing; `load_split` gives a
split's `Encoded` arrays; `source_record` what a split is by content (its
file's hash, or its TFDS dataset, version and files).
"""

from __future__ import annotations

import os

import numpy as np
from absl import logging

from papa_jax.workdir import input_files
from papa_jax.data import readers, sources
from papa_jax.data.declare import check_config, data_dir, resolve_task
from papa_jax.data.errors import DataError, TaskConfigError
from papa_jax.data.preprocess import IGNORE, Encoded, encode
from papa_jax.data.tasks import TASKS, Task, get_task

__all__ = ["IGNORE", "TASKS", "DataError", "Encoded", "Task", "TaskConfigError",
           "check_config", "check_files", "collects_labels", "data_dir", "get_task", "load_records",
           "load_split", "resolve_task", "source_record", "subsample", "subsample_indices"]


def tfds_dir(data_cfg) -> str:
  """Where TFDS data is prepared: `data.tfds_dir`, else `$PAPA_CACHE/tfds` (~/.cache/papa_jax)."""
  return data_cfg.get("tfds_dir", "") or os.path.join(
      os.environ.get("PAPA_CACHE", os.path.expanduser("~/.cache/papa_jax")), "tfds")


def check_files(data_cfg, splits) -> None:
  """Fails fast (before any model work) if the config or a split's file is wrong."""
  task = check_config(data_cfg)
  if data_cfg.source == "local":
    directory = data_dir(data_cfg, task)
    for split in splits:
      readers.split_path(task, directory, split)


def collects_labels(data_cfg) -> bool:
  """Whether the labels are collected from the train split (then every split's label ids
  depend on the train file)."""
  task = check_config(data_cfg)
  return task.kind != "regression" and not task.label_names


def source_record(data_cfg, split: str, known: dict | None = None) -> dict:
  """Split `split` by content (`input_files.source_record`): its file, or its TFDS
  dataset; `known` is its previous record (the hash cache)."""
  task = check_config(data_cfg)
  if data_cfg.source == "tfds":
    return sources.catalog_source(task, split, tfds_dir(data_cfg), known)
  path = readers.split_path(task, data_dir(data_cfg, task), split)
  return input_files.source_record([path], known)


def _records(task: Task, data_cfg, split: str) -> list[dict]:
  if data_cfg.source == "tfds":
    recs = sources.catalog_records(task, split, tfds_dir(data_cfg))
  else:
    stats = readers.ReadStats()
    recs = list(readers.read_split(task, data_dir(data_cfg, task), split,
                                   skip_malformed=data_cfg.skip_malformed, stats=stats))
    if stats.skipped:
      logging.warning("%s/%s: skipped %d malformed examples (data.skip_malformed).",
                      task.name, split, stats.skipped)
  if split == "train" and task.kind == "classification":
    classes = {r["label"] for r in recs}
    if len(classes) == 1:
      where = (readers.split_path(task, data_dir(data_cfg, task), split)
               if data_cfg.source == "local" else f"TFDS {task.tfds_name}")
      raise readers.one_class_error(where, task.label_names[classes.pop()])
  return recs


def load_records(data_cfg, split: str) -> list[dict]:
  """The records of one split, in file order (see `readers`)."""
  return _records(resolve_task(data_cfg), data_cfg, split)


def subsample_indices(total: int, n: int, seed: int) -> np.ndarray:
  """Indices of a seeded random subset of size n, ascending (n <= 0: all)."""
  if n <= 0 or n >= total:
    return np.arange(total)
  return np.sort(np.random.default_rng(seed).permutation(total)[:n])


def subsample(records: list[dict], n: int, seed: int) -> list[dict]:
  """A seeded random subset of size n, kept in file order (n <= 0: all)."""
  return [records[i] for i in subsample_indices(len(records), n, seed)]


def load_split(data_cfg, split: str, tokenizer, type_vocab_size: int,
               max_examples: int = -1, shard: tuple[int, int] = (0, 1)) -> Encoded:
  """Encoded arrays of one split (subsampled, and sharded across processes).

  Args:
    data_cfg: `config.data`.
    split: "train", "validation" or "test".
    tokenizer: the checkpoint's fast tokenizer.
    type_vocab_size: the encoder's number of segment embeddings.
    max_examples: keep a seeded random subset of this size (-1: all).
    shard: (index, count): keep only this contiguous shard of the examples.
  """
  task = resolve_task(data_cfg)
  records = subsample(_records(task, data_cfg, split), max_examples, data_cfg.subsample_seed)
  index, count = shard
  if count > 1:
    bounds = np.linspace(0, len(records), count + 1).astype(int)
    records = records[bounds[index]:bounds[index + 1]]
  enc = encode(task, records, tokenizer, data_cfg.max_length,
               papa_layout=data_cfg.papa_layout,
               faithful_segment_ids=data_cfg.faithful_segment_ids,
               type_vocab_size=type_vocab_size)
  if enc.truncated:
    logging.info("%s/%s: %d of %d examples lost word pieces to max_length=%d%s.",
                 task.name, split, enc.truncated, len(enc), data_cfg.max_length,
                 " and the PAPA layout" if data_cfg.papa_layout else "")
  if enc.unpieced:
    what, why = (("words", "their tags are not scored") if task.kind == "tagging" else
                 ("texts", "those inputs are special tokens only"))
    logging.warning("%s/%s: %d %s have no word piece under this tokenizer (e.g. %s); %s.",
                    task.name, split, enc.unpieced, what,
                    ", ".join(ascii(w) for w in enc.unpieced_words), why)
  return enc
