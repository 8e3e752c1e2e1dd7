"""Task data: records from TFDS (local files or catalog) -> fixed-length arrays."""

from __future__ import annotations

import os

import numpy as np
from absl import logging

from papa_jax import shared
from papa_jax.data import readers, sources
from papa_jax.data.preprocess import IGNORE, Encoded, encode
from papa_jax.data.readers import DataError
from papa_jax.data.tasks import TASKS, Task, get_task

__all__ = ["IGNORE", "TASKS", "DataError", "Encoded", "Task", "get_task",
           "data_dir", "load_records", "load_split", "check_files", "subsample",
           "subsample_indices"]


def data_dir(data_cfg) -> str:
  """The local directory of the task's files (`data.data_dir` or shared)."""
  task = get_task(data_cfg.task)
  return data_cfg.data_dir or str(shared.data_dir(task.local_subdir))


def tfds_dir(data_cfg) -> str:
  """Where TFDS data is prepared: `$PAPA_CACHE/tfds` (default ~/.cache/papa_jax/tfds)."""
  return data_cfg.get("tfds_dir", "") or os.path.join(
      os.environ.get("PAPA_CACHE", os.path.expanduser("~/.cache/papa_jax")), "tfds")


def check_files(data_cfg, splits) -> None:
  """Fails fast (before any model work) if the local files are not there."""
  task = get_task(data_cfg.task)
  if data_cfg.source == "local":
    for split in splits:
      readers.split_path(task, data_dir(data_cfg), split)
  elif data_cfg.source != "tfds":
    raise ValueError(f"data.source must be 'local' or 'tfds', not {data_cfg.source!r}.")


def load_records(data_cfg, split: str) -> list[dict]:
  task = get_task(data_cfg.task)
  if data_cfg.source == "local":
    return sources.local_records(task, data_dir(data_cfg), split, tfds_dir(data_cfg),
                                 skip_malformed=data_cfg.skip_malformed)
  if data_cfg.source == "tfds":
    return sources.catalog_records(task, split, tfds_dir(data_cfg))
  raise ValueError(f"data.source must be 'local' or 'tfds', not {data_cfg.source!r}.")


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
  task = get_task(data_cfg.task)
  records = subsample(load_records(data_cfg, split), max_examples, data_cfg.subsample_seed)
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
  return enc
