"""Caching a frozen, deterministic encoder's features for probe training.

With the encoder frozen, its dropout off and its attention fixed, the stacked
hidden states of an example never change between epochs (or probe seeds):
compute them once (in `feature_dtype`, normally bfloat16), keep them in memory
or in a memmap, and train probes from them. Training on the uncached path
casts the encoder outputs to the same dtype, so both give the same result up
to float noise.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import shutil
import tempfile
from typing import Any

import jax
import numpy as np

from papa_jax import parallel
from papa_jax.workdir import rules as workdir
from papa_jax.errors import PapaError, WorkdirError
from papa_jax.models.encoder import DTYPES
from papa_jax.probing.train import FrozenEncoder

NP_DTYPES = {name: np.dtype(dt) for name, dt in DTYPES.items()}


class CacheTooLarge(PapaError, ValueError):
  """The feature cache would exceed its configured budget."""


@dataclasses.dataclass
class Features:
  """A split's cached features: `features [N, K, L, D]` (host, memmap, or the device array of
  a one-device mesh), its mask and labels; `path`: the `.npy` file the memmap reads, if any,
  its data from byte `offset`."""

  features: Any
  attention_mask: np.ndarray
  labels: np.ndarray
  path: str = ""
  offset: int = 0

  def __len__(self) -> int:
    return len(self.labels)

  @property
  def max_length(self) -> int:
    return self.attention_mask.shape[1]

  def arrays(self) -> dict[str, np.ndarray]:
    return dict(features=self.features, attention_mask=self.attention_mask, labels=self.labels)

  def rows(self, idx: np.ndarray) -> dict[str, np.ndarray]:
    """Rows `idx` of every array, the features read from `path` with positioned reads rather
    than through the memory map, whose touched pages would count as this process's memory
    (the kernel's page cache holds them instead, and gives them up under pressure)."""
    shape, dtype = self.features.shape[1:], self.features.dtype
    out = _aligned((len(idx), *shape), dtype)
    buf = out.view(np.uint8).reshape(len(idx), -1)
    size = buf.shape[1]
    fd = os.open(self.path, os.O_RDONLY)
    try:
      for j, i in enumerate(idx):
        if os.preadv(fd, [buf[j]], self.offset + int(i) * size) != size:
          raise WorkdirError(f"{self.path}: row {int(i)} is cut short (the cached "
                             "features file changed under the run).")
    finally:
      os.close(fd)
    return dict(features=out, attention_mask=self.attention_mask[idx], labels=self.labels[idx])


def _aligned(shape: tuple, dtype: np.dtype, align: int = 64) -> np.ndarray:
  """An empty array whose data starts on an `align`-byte boundary: XLA-CPU then takes it as
  a device array without copying it (`jax.device_put`)."""
  nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
  raw = np.empty(nbytes + align, np.uint8)
  start = -raw.ctypes.data % align
  return raw[start:start + nbytes].view(dtype).reshape(shape)


def _data_offset(path: str) -> int:
  """Where a `.npy` file's data starts (after its header)."""
  with open(path, "rb") as f:
    major, _ = np.lib.format.read_magic(f)
    np.lib.format.read_array_header_1_0(f) if major == 1 else (
        np.lib.format.read_array_header_2_0(f))
    return f.tell()


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
  if path:  # Written with plain writes: a written memory map's pages count as ours.
    tmp = f"{path}.tmp-{os.getpid()}"
    _reserve(tmp, shape, np.dtype(np.uint16) if dtype.itemsize == 2 else dtype)
    offset = _data_offset(tmp)
    out_file = open(tmp, "r+b")  # pylint: disable=consider-using-with
    out_file.seek(offset)
  else:  # On the device of a one-device mesh (no host copy), else on the host.
    rows = parallel.Rows(n, shape[1:], dtype, mesh)
  fn, enc = _forward(mesh), parallel.put_replicated(encoder, mesh)
  try:
    for _, out, valid in parallel.map_batches(lambda b: fn(enc, b), data,
                                              batch_size=batch_size, mesh=mesh, desc=desc):
      if path:
        out_file.write(np.ascontiguousarray(np.asarray(out)[valid], dtype).view(np.uint8))
      else:
        rows.add(out[valid])
  except OSError as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise workdir.write_failed(tmp, e) from e
  finally:
    if path:
      out_file.close()
  if not path:
    return Features(rows.data, data.attention_mask, data.labels)
  os.replace(tmp, path)
  raw = np.load(path, mmap_mode="r")
  feats = raw.view(dtype) if dtype.itemsize == 2 else raw
  return Features(feats, data.attention_mask, data.labels, path, offset)


def _reserve(tmp: str, shape: tuple, dtype: np.dtype) -> None:
  """A `.npy` file of `shape` whose blocks are reserved up front.

  Writing past the space a full disk has kills a memory-mapped writer with
  SIGBUS and leaves a plain one a partial file; reserving it first turns either
  into a clear error here.
  """
  try:
    os.makedirs(os.path.dirname(tmp) or ".", exist_ok=True)
    np.lib.format.open_memmap(tmp, mode="w+", shape=shape, dtype=dtype).flush()
    with open(tmp, "r+b") as f:
      os.posix_fallocate(f.fileno(), 0, os.path.getsize(tmp))
  except OSError as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise workdir.write_failed(tmp, e) from e


_SPILL: list[str] = []  # This process's temporary feature folder, once made.


def cache_folder(cache_dir: str, nbytes: int, memory_gb: float) -> str:
  """Where one static-head set's cached features (`nbytes`, train and eval) go: `cache_dir`
  if set; else in memory ('') up to `memory_gb`, and over it a temporary local folder of this
  process (removed at exit), so host memory stays bounded whatever the split's size."""
  if cache_dir or nbytes <= memory_gb * 2**30:
    return cache_dir
  if not _SPILL:
    _SPILL.append(tempfile.mkdtemp(prefix="papa-features-"))
    atexit.register(shutil.rmtree, _SPILL[0], True)
  return _SPILL[0]


def run_cache_folder(setup: Any) -> str:
  """`cache_folder` of one static-head set's train and eval features in a stage's `setup`
  (the means pass keeps its forward's features for the baseline only where this is '')."""
  cfg, mc = setup.config, setup.model.config
  nbytes = cache_bytes(len(setup.train_data) + len(setup.eval_data), mc.num_hidden_states,
                       setup.max_length, mc.hidden_size, cfg.probe.feature_dtype)
  return cache_folder(cfg.run.cache_dir, nbytes, cfg.run.cache_memory_gb)


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

