"""Caching a frozen, deterministic encoder's features for probe training.

With the encoder frozen, its dropout off and its attention fixed, the stacked
hidden states of an example never change between epochs (or probe seeds):
compute them once (in `feature_dtype`, normally bfloat16), keep them in memory
or in a memmap, and train probes from them. Training on the uncached path
casts the encoder outputs to the same dtype, so both give the same result up
to float noise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Any

import jax
import numpy as np

from papa_jax import parallel
from papa_jax.workdir import rules as workdir
from papa_jax.errors import PapaError
from papa_jax.models.encoder import DTYPES
from papa_jax.probing.train import FrozenEncoder

NP_DTYPES = {name: np.dtype(dt) for name, dt in DTYPES.items()}


class CacheTooLarge(PapaError, ValueError):
  """The feature cache would exceed its configured budget."""


@dataclasses.dataclass
class Features:
  """A split's cached features: `features [N, K, L, D]` (host, memmap, or the device array of
  a one-device mesh), its mask and labels."""

  features: Any
  attention_mask: np.ndarray
  labels: np.ndarray

  def __len__(self) -> int:
    return len(self.labels)

  @property
  def max_length(self) -> int:
    return self.attention_mask.shape[1]

  def arrays(self) -> dict[str, np.ndarray]:
    return dict(features=self.features, attention_mask=self.attention_mask, labels=self.labels)


def cache_bytes(num_examples: int, num_hidden_states: int, max_length: int, hidden: int,
                dtype: str) -> int:
  return num_examples * num_hidden_states * max_length * hidden * NP_DTYPES[dtype].itemsize


def check_budget(nbytes: int, max_gb: float, what: str) -> None:
  if nbytes > max_gb * 2**30:
    raise CacheTooLarge(
        f"Caching features of {what} needs {nbytes / 2**30:.2f} GiB, over the budget "
        f"run.cache_max_gb={max_gb:g}. Raise the budget, lower data.max_length or "
        "data.max_train_examples, or set probe.cache_features=False.")


@functools.lru_cache(maxsize=4)
def _forward(mesh):
  """One jitted forward per mesh; each encoder structure compiles once."""
  repl, shard = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  return jax.jit(lambda enc, b: enc.features(b, train=False), in_shardings=(repl, shard),
                 out_shardings=repl)


def compute(encoder: FrozenEncoder, data, mesh, batch_size: int, path: str = "",
            desc: str = "features") -> Features:
  """Features of every example of `data` (an `Encoded` split).

  Args:
    encoder: the frozen encoder (deterministic: its dropout is not used).
    data: the encoded split.
    mesh: the data mesh (every process gets every example's features).
    batch_size: global batch size of the forward passes.
    path: a `.npy` file to memmap the features to ('' keeps them in memory).
    desc: name in progress lines.
  """
  c = encoder.config
  n, L = len(data), data.max_length
  shape = (n, c.num_hidden_states, L, c.hidden_size)
  dtype = NP_DTYPES[encoder.feature_dtype]
  if path:
    tmp = f"{path}.tmp-{os.getpid()}"
    raw = _open_memmap(tmp, shape, np.dtype(np.uint16) if dtype.itemsize == 2 else dtype)
    feats = raw.view(dtype) if dtype.itemsize == 2 else raw
  else:  # On the device of a one-device mesh (no host copy), else on the host.
    rows = parallel.Rows(n, shape[1:], dtype, mesh)
  fn, enc = _forward(mesh), parallel.put_replicated(encoder, mesh)
  start = 0
  for _, out, valid in parallel.map_batches(lambda b: fn(enc, b), data, batch_size=batch_size,
                                            mesh=mesh, desc=desc):
    k = int(valid.sum())
    if path:
      feats[start:start + k] = out[valid]
    else:
      rows.add(out[valid])
    start += k
  if path:
    raw.flush()
    del raw
    os.replace(tmp, path)
    raw = np.load(path, mmap_mode="r")
    feats = raw.view(dtype) if dtype.itemsize == 2 else raw
  else:
    feats = rows.data
  return Features(feats, data.attention_mask, data.labels)


def _open_memmap(tmp: str, shape: tuple, dtype: np.dtype) -> np.memmap:
  """A `.npy` memmap whose blocks are reserved up front.

  Writing into a sparse memmap on a full disk kills the process with SIGBUS;
  reserving the space first turns that into a clear error here.
  """
  try:
    os.makedirs(os.path.dirname(tmp) or ".", exist_ok=True)
    raw = np.lib.format.open_memmap(tmp, mode="w+", shape=shape, dtype=dtype)
    with open(tmp, "r+b") as f:
      os.posix_fallocate(f.fileno(), 0, os.path.getsize(tmp))
    return raw
  except OSError as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise workdir.write_failed(tmp, e) from e


def cache_path(cache_dir: str, name: str, split: str) -> str:
  """Where a run's features go ('' when kept in memory)."""
  return os.path.join(cache_dir, f"{name}_{split}.npy") if cache_dir else ""


def remove_cache(cache_dir: str, name: str) -> list[str]:
  """Removes a static-head set's cached feature files (once its probes are trained: a full
  train split's features are tens of GB, one set's at a time fit where all would not)."""
  gone = [p for p in (cache_path(cache_dir, name, s) for s in ("train", "eval"))
          if p and os.path.exists(p)]
  for p in gone:
    os.remove(p)
  return gone

