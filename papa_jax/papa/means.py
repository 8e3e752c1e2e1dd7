"""Average attention per (layer, head, query, key) over a dataset split.

`avg[l,h,i,j] = sum_b A_b[l,h,i,j] m_b[i] m_b[j] / sum_b m_b[i] m_b[j]`, 0 where
the count is 0 (`shared/spec/papa.md` §4). Each device sums its rows of a
batch (shard_map), one psum adds the devices' sums, and the host adds batches
into float64 totals: memory is independent of the dataset size, and the
result equals the single-device one up to float32 summation order.

File format (`.npz`): `avgs` float32 `[layers, heads, L, L]`, `sums` float64
(same shape), `counts` float64 `[L, L]`, and `metadata`, a JSON string with
`format`, `model`, `model_fingerprint`, `architecture`, `task`, `split`,
`max_length`, `num_examples`, `attention`, `papa_layout`,
`faithful_segment_ids`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import zipfile
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax import parallel, preemption, workdir
from papa_jax.analysis import effective
from papa_jax.data import pipeline
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import DTYPES, Encoder

FORMAT = "papa-jax-means/1"
ATTENTION_KINDS = ("raw", "effective")


class MeansFileError(ValueError):
  """A means file that is unreadable or does not fit the run."""


def model_fingerprint(config: EncoderConfig, params) -> str:
  """Hash of the architecture and every parameter's bytes (16 hex digits)."""
  h = hashlib.sha256(json.dumps(config.architecture_dict(), sort_keys=True).encode())
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    h.update(jax.tree_util.keystr(path).encode())
    h.update(np.ascontiguousarray(np.asarray(leaf, np.float32)).tobytes())
  return h.hexdigest()[:16]


@functools.lru_cache(maxsize=8)
def compiled_batch_sums(config: EncoderConfig, attention: str, mesh,
                        feature_dtype: str | None = None) -> Callable:
  """`batch_sums` under `parallel.sharded_sum`, built once per (config, mesh)."""
  return parallel.sharded_sum(batch_sums_fn(config, attention, feature_dtype), mesh,
                              with_rows=feature_dtype is not None)


def batch_sums_fn(config: EncoderConfig, attention: str = "raw",
                  feature_dtype: str | None = None) -> Callable:
  """`(params, batch) -> (sums [layers, H, L, L], counts [L, L], examples)`, float32.

  With `feature_dtype`, also the batch's stacked hidden states `[B, K, L, D]`
  in that dtype: the baseline probe's features, from the same forward pass.
  """
  if attention not in ATTENTION_KINDS:
    raise ValueError(f"means attention must be one of {ATTENTION_KINDS}, not {attention!r}.")
  module = Encoder(config)

  def batch_sums(params, batch):
    m = (batch["attention_mask"] * batch["valid"][:, None]).astype(jnp.float32)
    out = module.apply({"params": params}, batch["input_ids"], m,
                       batch["token_type_ids"], capture_attention=True,
                       capture_values=attention == "effective")
    pair = m[:, :, None] * m[:, None, :]
    sums = []
    for layer, a in enumerate(out.attentions):
      if attention == "effective":
        key_mask = jnp.broadcast_to(m[:, None, :] > 0, a.shape[:-1])
        a = effective.effective_attention(a, out.values[layer], key_mask)[0]
      sums.append(jnp.einsum("bhqk,bqk->hqk", a, pair))
    totals = (jnp.stack(sums), jnp.sum(pair, axis=0),
              jnp.sum(batch["valid"].astype(jnp.float32)))
    if feature_dtype is None:
      return totals
    feats = jnp.stack(out.hidden_states, axis=1).astype(DTYPES[feature_dtype])
    return totals, feats

  return batch_sums


@dataclasses.dataclass
class MeansState:
  """Running totals; `next_batch` is the data position to resume from."""

  sums: np.ndarray
  counts: np.ndarray
  next_batch: int = 0
  num_examples: int = 0
  features: np.ndarray | None = None  # Hidden states of every example, when collected.

  @classmethod
  def zeros(cls, config: EncoderConfig, max_length: int) -> MeansState:
    L = max_length
    return cls(np.zeros((config.num_layers, config.num_heads, L, L), np.float64),
               np.zeros((L, L), np.float64))

  def averages(self) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
      avg = self.sums / self.counts
    return np.nan_to_num(avg, nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)


def accumulate(config: EncoderConfig, params, data, mesh, *, batch_size: int,
               attention: str = "raw", state: MeansState | None = None,
               checkpoint: Callable[[MeansState], None] | None = None,
               checkpoint_every: int = 0, desc: str = "",
               feature_dtype: str | None = None) -> MeansState:
  """The means pass: every batch's masked sums added into float64 host totals.

  Args:
    config, params: the encoder.
    data: the split (`Encoded` or a dict of arrays), held by every process.
    mesh: the data mesh.
    batch_size: the global batch size (the result does not depend on it
      beyond float32 summation order).
    attention: "raw" or "effective".
    state: totals to resume from (`state.next_batch` is the first batch).
    checkpoint: called with the state every `checkpoint_every` batches, and
      before stopping on a preemption request (then `Preempted` is raised).
    checkpoint_every: 0 for never.
    desc: progress label.
    feature_dtype: also collect every example's stacked hidden states in this
      dtype into `state.features` (single-process runs that start at batch 0;
      a resumed pass collects none).
  """
  if state is None:
    state = MeansState.zeros(config, pipeline.columns(data)["input_ids"].shape[1])
  if feature_dtype is not None and (state.next_batch or jax.process_count() > 1):
    feature_dtype = None
  fn = compiled_batch_sums(config, attention, mesh, feature_dtype)
  params = parallel.put_replicated(params, mesh)
  rows = []
  for step, out, valid in parallel.map_batches(
      lambda b: fn(params, b), data, batch_size=batch_size, mesh=mesh,
      start=state.next_batch, desc=desc):
    (sums, counts, n), feats = out if feature_dtype is not None else (out, None)
    if feats is not None:
      rows.append(feats[valid])
    state.sums += np.asarray(sums, np.float64)
    state.counts += np.asarray(counts, np.float64)
    state.num_examples += int(round(float(n)))
    state.next_batch = step + 1
    stop = preemption.requested()
    if checkpoint is not None and (stop or (
        checkpoint_every > 0 and state.next_batch % checkpoint_every == 0)):
      checkpoint(state)
    if stop:
      raise preemption.Preempted(f"{desc or 'means'}: stopped after batch {state.next_batch}.")
  if rows:
    state.features = np.concatenate(rows)
  return state


def save_partial(path: str, state: MeansState, run_key: str) -> None:
  with workdir.atomic_write(path, "wb") as f:
    np.savez(f, sums=state.sums, counts=state.counts, next_batch=state.next_batch,
             num_examples=state.num_examples, run_key=np.asarray(run_key))


def load_partial(path: str, run_key: str) -> MeansState | None:
  """The partial sums of the same run, or None (absent, foreign or corrupt)."""
  if not os.path.exists(path):
    return None
  try:
    with np.load(path) as z:
      if str(z["run_key"]) != run_key:
        return None
      return MeansState(z["sums"].astype(np.float64), z["counts"].astype(np.float64),
                        int(z["next_batch"]), int(z["num_examples"]))
  except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
    return None


def save_means(path: str, state: MeansState, metadata: dict) -> None:
  meta = dict(metadata, format=FORMAT, num_examples=state.num_examples)
  with workdir.atomic_write(path, "wb") as f:
    np.savez(f, avgs=state.averages(), sums=state.sums, counts=state.counts,
             metadata=np.asarray(json.dumps(meta, sort_keys=True)))


@dataclasses.dataclass
class Means:
  avgs: np.ndarray
  sums: np.ndarray
  counts: np.ndarray
  metadata: dict


def load_means(path: str, *, fingerprint: str | None = None,
               max_length: int | None = None, shape: tuple | None = None) -> Means:
  """Loads a means file, checking it fits the model and length of this run."""
  if not os.path.exists(path):
    raise MeansFileError(f"Means file {path} does not exist; run the 'means' stage first.")
  try:
    with np.load(path, allow_pickle=False) as z:
      m = Means(z["avgs"], z["sums"], z["counts"], json.loads(str(z["metadata"])))
  except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
    raise MeansFileError(f"Means file {path} is corrupt or truncated ({type(e).__name__}: "
                         f"{e}); delete it and rerun the 'means' stage.") from e
  meta = m.metadata
  if meta.get("format") != FORMAT:
    raise MeansFileError(f"{path} has format {meta.get('format')!r}, expected {FORMAT!r}.")
  if max_length is not None and meta.get("max_length") != max_length:
    raise MeansFileError(f"{path} holds means for max_length={meta.get('max_length')}, but "
                         f"this run uses max_length={max_length}; they must be equal.")
  if fingerprint is not None and meta.get("model_fingerprint") != fingerprint:
    raise MeansFileError(f"{path} was computed with another model ({meta.get('model')}, "
                         f"fingerprint {meta.get('model_fingerprint')}); this run's model "
                         f"has fingerprint {fingerprint}.")
  if shape is not None and tuple(m.avgs.shape) != tuple(shape):
    raise MeansFileError(f"{path} has avgs of shape {m.avgs.shape}; expected {shape}.")
  if not np.all(np.isfinite(m.avgs)):
    raise MeansFileError(f"{path} contains non-finite averages.")
  return m
