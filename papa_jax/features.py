"""Caching a frozen, deterministic encoder's features for probe training.

With the encoder frozen, its dropout off and its attention fixed, the stacked
hidden states of an example never change between epochs: compute them once
(in `feature_dtype`, normally bfloat16), keep them in memory or in a memmap
under the workdir, and train the probe from them. Training on the uncached
path casts the encoder outputs to the same dtype, so both give the same
result up to float noise.
"""

from __future__ import annotations

import os

import jax
import ml_dtypes
import numpy as np

from papa_jax import parallel
from papa_jax.data import pipeline
from papa_jax.data.preprocess import Encoded
from papa_jax.progress import Progress

NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


class CacheTooLarge(ValueError):
  """The feature cache would exceed its configured budget."""


def cache_bytes(num_examples: int, num_hidden_states: int, max_length: int, hidden: int,
                dtype: str) -> int:
  return num_examples * num_hidden_states * max_length * hidden * NP_DTYPES[dtype].itemsize


def check_budget(nbytes: int, max_gb: float, what: str) -> None:
  if nbytes > max_gb * 2**30:
    raise CacheTooLarge(
        f"Caching features of {what} needs {nbytes / 2**30:.2f} GiB, over the budget "
        f"probe.cache_max_gb={max_gb:g}. Raise the budget, lower data.max_length or "
        "data.max_train_examples, or set probe.cache_features=False.")


def compute(spec, enc_params, constants, data: Encoded, mesh, batch_size: int,
            path: str = "", desc: str = "features") -> dict[str, np.ndarray]:
  """Features of every example, as a batchable dict (`features` `[N, K, L, D]`).

  Args:
    spec: the `train.EncoderSpec` (its encoder must be deterministic).
    enc_params, constants: encoder parameters and constant matrices.
    data: the encoded split.
    mesh: the data mesh.
    batch_size: global batch size for the forward passes.
    path: a `.npy` file to memmap the features to ('' keeps them in memory).
    desc: name in progress lines.
  """
  if jax.process_count() > 1:
    raise NotImplementedError("Feature caching runs single-process; set "
                              "probe.cache_features=False for multi-process runs.")
  c = spec.config
  n, L = len(data), data.max_length
  shape = (n, c.num_hidden_states, L, c.hidden_size)
  dtype = NP_DTYPES[spec.feature_dtype]
  if path:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    raw = np.lib.format.open_memmap(path + ".tmp", mode="w+", dtype=np.uint16 if
                                    dtype.itemsize == 2 else dtype, shape=shape)
    feats = raw.view(dtype) if dtype.itemsize == 2 else raw
  else:
    feats = np.empty(shape, dtype)
  repl, shard = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  fn = jax.jit(lambda p, b, k: spec.features(p, k, None, b, train=False),
               in_shardings=(repl, shard, repl), out_shardings=repl)
  enc_params = parallel.put_replicated(enc_params, mesh)
  constants = None if constants is None else parallel.put_replicated(constants, mesh)
  prog = Progress(desc, n, every=20)
  start = 0
  for batch in pipeline.batches(data, batch_size):
    valid = batch["valid"]
    out = np.asarray(jax.device_get(fn(enc_params, parallel.put_batch(batch, mesh), constants)))
    k = int(valid.sum())
    feats[start:start + k] = out[valid]
    start += k
    prog.update(k)
  if path:
    raw.flush()
    del raw
    os.replace(path + ".tmp", path)
    raw = np.load(path, mmap_mode="r")
    feats = raw.view(dtype) if dtype.itemsize == 2 else raw
  return dict(features=feats, attention_mask=data.attention_mask, labels=data.labels)
