"""Fixed-shape batches: seeded order, padded last batch, per-host slices.

Every batch has exactly `batch_size` rows; rows past the end of the data are
padding with `valid = False` (and an all-zero attention mask), so shapes never
change and padding never counts in sums, losses or metrics.
"""

from __future__ import annotations

from typing import Iterator

import jax
import numpy as np

from papa_jax.data.preprocess import IGNORE
from papa_jax.errors import ConfigError


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
  """Example order for one epoch: a permutation seeded by (seed, epoch)."""
  if not shuffle:
    return np.arange(n)
  return np.random.default_rng([seed, epoch]).permutation(n)


def num_batches(n: int, batch_size: int) -> int:
  return -(-n // batch_size)


def batch_indices(order: np.ndarray, batch_size: int) -> list[np.ndarray]:
  """Splits an order into batches; the last is padded with -1."""
  out = []
  for start in range(0, len(order), batch_size):
    idx = order[start:start + batch_size]
    if len(idx) < batch_size:
      idx = np.concatenate([idx, np.full(batch_size - len(idx), -1, idx.dtype)])
    out.append(idx)
  return out


def columns(data) -> dict[str, np.ndarray]:
  """The named `[N, ...]` arrays of a split (`Encoded`, cached features, or a dict)."""
  return data if isinstance(data, dict) else data.arrays()


def num_rows(data) -> int:
  return len(next(iter(columns(data).values())))


def gather(data, idx: np.ndarray) -> dict[str, np.ndarray]:
  """Rows `idx` of every array; -1 gives a padding row with valid=False. Cached features in a
  file are read row by row (`Features.rows`), not through their memory map."""
  valid = idx >= 0
  safe = np.where(valid, idx, 0)
  if getattr(data, "path", ""):  # Read already in order: the loop takes them whole.
    arrays, safe = data.rows(safe), slice(None)
  else:
    arrays = columns(data)
  batch = {}
  for k, v in arrays.items():
    if str(v.dtype) == "bfloat16":
      x = v.view(np.uint16)[safe].view(v.dtype)  # numpy indexes bfloat16 slowly.
    else:
      x = v[safe]
    if not valid.all():
      x = x.copy()
      fill = IGNORE if k == "labels" and x.ndim > 1 else 0
      x[~valid] = fill
    batch[k] = x
  batch["valid"] = valid
  return batch


def host_slice(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """This process's contiguous rows of a global batch (multi-host input)."""
  n, p = jax.process_count(), jax.process_index()
  if n == 1:
    return batch
  size = len(batch["valid"])
  if size % n:
    raise ConfigError(f"Global batch {size} is not divisible by {n} processes.")
  per = size // n
  return {k: v[p * per:(p + 1) * per] for k, v in batch.items()}


def batches(data, batch_size: int, *, shuffle: bool = False, seed: int = 0, epoch: int = 0,
            start: int = 0) -> Iterator[dict[str, np.ndarray]]:
  """Global batches of one epoch, from batch number `start` (for resuming)."""
  n = num_rows(data)
  for idx in batch_indices(epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch),
                           batch_size)[start:]:
    yield gather(data, idx)
