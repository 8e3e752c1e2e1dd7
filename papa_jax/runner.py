"""The one pass that averages per-example statistics of the encoder over a split.

An analysis supplies only its math: `stats(outs, batch, mask, params) -> {name: Weighted}`,
each statistic a per-example value and its weight; the runner owns the rest,
in the spirit of big_vision's `evaluators/mean.py`:
  * the encoder forward (one per parameter set, with the analysis's `Capture`);
  * the mask `attention_mask * valid` (padding rows and pad tokens count for
    nothing: a statistic's weight is multiplied by `valid`, and a value whose
    weight is 0 is dropped, NaN included);
  * per-device weighted sums over the batch, one psum for all of them
    (`parallel.sharded_sum`), float64 totals on the host;
  * resuming: every `checkpoint_every` batches and on a preemption request the
    totals and the data position go to a partial file (`resume.py`); a rerun
    of the same computation continues there and ends with the same totals;
  * progress lines, and per-example rows (e.g. hidden states) when asked.
`Totals.means()` divides once. `papa/means.py` (PAPA's constant matrices) and
every per-head analysis stage (`analysis/per_head.py`) run on it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from papa_jax import backend as backend_lib
from papa_jax import parallel, preemption
from papa_jax.workdir import resume
from papa_jax.data import pipeline
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Capture, Encoder, EncoderOutput

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Weighted:
  """A statistic to average over examples: `sum_b w_b x_b / sum_b w_b`.

  Attributes:
    value: `[B, ...]`, or one `[B, ...]` array per layer (stacked after the
      reduction, into `[layers, ...]`).
    weight: `[B]`, or `[B, *t]` with `t` the trailing axes of each value (e.g.
      PAPA's pair mask `[B, L, L]` for attention `[B, H, L, L]`).
  """

  value: Array | tuple[Array, ...]
  weight: Array


StatsFn = Callable[[tuple[EncoderOutput, ...], dict, Array, tuple], Mapping[str, Weighted]]
RowsFn = Callable[[tuple[EncoderOutput, ...], dict], Array]


def _weighted_sum(value: Array, weight: Array, backend: str | None = None) -> Array:
  """`sum_b weight[b] * value[b]` with weight's axes aligned to value's last ones (`backend`
  forces one platform's path; by default each platform's program takes its own).

  On CPU a scan over the batch adding one example at a time (the `[...]`-shaped total
  stays in cache): as an einsum, which XLA lowers to a dot over b batched over every
  other axis, the same sums took 2.2x as long on a 2-core Zen 4 EPYC
  (benchmarks/RESULTS.md). Elsewhere the einsum: one kernel, where a scan would be one
  launch per example.
  """
  nd, nw = value.ndim, weight.ndim
  w = weight.reshape(weight.shape[:1] + (1,) * (nd - nw) + weight.shape[1:])

  def kept(v, wb):
    return jnp.where(wb > 0, v, jnp.zeros((), v.dtype))  # 0 * NaN would be NaN.

  def einsum():
    return jnp.einsum(kept(value, w), list(range(nd)), weight, [0, *range(nd - nw + 1, nd)],
                      list(range(1, nd)), precision=jax.lax.Precision.HIGHEST)

  dtype = jnp.result_type(value.dtype, weight.dtype)

  def term(v, wb):
    return (kept(v, wb) * wb).astype(dtype)

  def add(total, x):
    return total + term(*x), None

  def scan():
    # The first example starts the total (a zeros start would not carry shard_map's
    # per-device axis type).
    return jax.lax.scan(add, term(value[0], w[0]), (value[1:], w[1:]))[0]

  if backend is not None:  # One path forced (the tests compare them on CPU).
    return (scan if backend == "cpu" else einsum)()
  return backend_lib.by_platform(scan, einsum)


def _reduce(stats: Mapping[str, Weighted], valid: Array) -> dict[str, Array]:
  out = {}
  for name, st in stats.items():
    weight = st.weight * valid.reshape((-1,) + (1,) * (st.weight.ndim - 1)).astype(
        st.weight.dtype)
    if isinstance(st.value, (tuple, list)):
      out[f"sum/{name}"] = jnp.stack([_weighted_sum(v, weight) for v in st.value])
    else:
      out[f"sum/{name}"] = _weighted_sum(st.value, weight)
    out[f"weight/{name}"] = jnp.sum(weight, axis=0)
  out["examples"] = jnp.sum(valid.astype(jnp.float32))
  return out


def device_sums(config: EncoderConfig, capture: Capture, stats_fn: StatsFn,
                rows_fn: RowsFn | None = None) -> Callable:
  """`(params tuple, batch) -> {"sum/<name>", "weight/<name>", "examples"}` for one
  device's rows (and the rows of `rows_fn`): the runner's step, before sharding."""
  module = Encoder(config)

  def fn(params, batch):
    valid = batch["valid"]
    mask = batch["attention_mask"] * valid[:, None].astype(batch["attention_mask"].dtype)
    outs = tuple(module.apply({"params": p}, batch["input_ids"], mask, batch["token_type_ids"],
                              capture=capture) for p in params)
    sums = _reduce(stats_fn(outs, batch, mask, params), valid)
    return sums if rows_fn is None else (sums, rows_fn(outs, batch))

  return fn


@functools.lru_cache(maxsize=16)
def compiled(config: EncoderConfig, capture: Capture, stats_fn: StatsFn, mesh,
             rows_fn: RowsFn | None = None) -> Callable:
  """`device_sums` jitted over the mesh, its sums reduced with one psum; cached."""
  return parallel.sharded_sum(device_sums(config, capture, stats_fn, rows_fn), mesh,
                              with_rows=rows_fn is not None)


@dataclasses.dataclass
class Totals:
  """float64 sums of `w x` and of `w` per statistic, the example count, the position."""

  sums: dict[str, np.ndarray]
  weights: dict[str, np.ndarray]
  examples: int = 0
  next_batch: int = 0
  rows: Any = None  # Host or (one-device meshes) device array: `parallel.Rows`.

  def means(self, empty: float = np.nan) -> dict[str, np.ndarray]:
    """`sum w x / sum w` per statistic; `empty` where the weight sum is 0."""
    out = {}
    for name, s in self.sums.items():
      w = self.weights[name]
      wb = w.reshape((1,) * (s.ndim - w.ndim) + w.shape)
      with np.errstate(invalid="ignore", divide="ignore"):
        out[name] = np.where(wb > 0, s / np.where(wb > 0, wb, 1.0), empty)
    return out

  def arrays(self) -> dict[str, np.ndarray]:
    return dict({f"sum/{k}": v for k, v in self.sums.items()},
                **{f"weight/{k}": v for k, v in self.weights.items()},
                examples=np.asarray(self.examples))

  @classmethod
  def from_arrays(cls, arrays: Mapping[str, np.ndarray], next_batch: int) -> Totals:
    pick = lambda prefix: {k[len(prefix):]: np.asarray(v, np.float64)
                           for k, v in arrays.items() if k.startswith(prefix)}
    return cls(pick("sum/"), pick("weight/"), int(arrays["examples"]), next_batch)


def sum_pass(stats_fn: StatsFn, capture: Capture, config: EncoderConfig, params: tuple, data,
             mesh, *, batch_size: int, partial: str = "", run_key: str = "",
             checkpoint_every: int = 0, desc: str = "", rows_fn: RowsFn | None = None
             ) -> Totals:
  """Totals of `stats_fn`'s weighted statistics over every example of `data`.

  Args:
    stats_fn: `(outs, batch, mask, params) -> {name: Weighted}`, traced; `outs`
      holds one `EncoderOutput` per parameter set (`params`), `batch` every array
      of `data` for the device's rows, and `mask` is `attention_mask * valid`.
    capture: what the forward passes capture.
    config: the encoder's architecture (every parameter set shares it).
    params: a tuple of parameter sets (one forward each).
    data: the split (`Encoded` or a dict of `[N, ...]` arrays), held by every
      process.
    mesh: the data mesh.
    batch_size: the global batch size.
    partial: a partial-file path for resuming ('' for none).
    run_key: identifies the computation; a partial file of another key is
      ignored.
    checkpoint_every: save the partial file every this many batches (0: only
      on a preemption request).
    desc: progress label.
    rows_fn: `(outs, batch) -> [B, ...]`, per-example rows to keep (only in
      single-process runs from batch 0; `Totals.rows`, padding removed, on the device
      of a one-device mesh: `parallel.Rows`).
  """
  saved = resume.load(partial, run_key)
  totals = Totals({}, {}) if saved is None else Totals.from_arrays(saved.arrays, saved.position)
  if saved is not None:
    logging.info("%s: resuming at batch %d (%d examples done).", desc or "pass",
                 totals.next_batch, totals.examples)
  if rows_fn is not None and (totals.next_batch or jax.process_count() > 1):
    rows_fn = None
  fn = compiled(config, capture, stats_fn, mesh, rows_fn)
  params = parallel.put_replicated(tuple(params), mesh)
  rows = None
  for step, out, valid in parallel.map_batches(
      lambda b: fn(params, b), data, batch_size=batch_size, mesh=mesh,
      start=totals.next_batch, desc=desc):
    sums, batch_rows = out if rows_fn is not None else (out, None)
    if batch_rows is not None:
      if rows is None:
        rows = parallel.Rows(pipeline.num_rows(data), batch_rows.shape[1:], batch_rows.dtype,
                             mesh)
      rows.add(batch_rows[valid])
    _add(totals, sums)
    totals.next_batch = step + 1
    stop = preemption.should_stop()
    if partial and parallel.is_main_process() and (stop or (
        checkpoint_every > 0 and totals.next_batch % checkpoint_every == 0)):
      resume.save(partial, run_key, totals.next_batch, totals.arrays())
    if stop:
      raise preemption.Preempted(f"{desc or 'pass'}: stopped after batch {totals.next_batch}.")
  if rows is not None:
    totals.rows = rows.data
  return totals


def _add(totals: Totals, sums: Mapping[str, Any]) -> None:
  for key, v in sums.items():
    if key == "examples":
      totals.examples += int(round(float(v)))
      continue
    kind, _, name = key.partition("/")
    target = totals.sums if kind == "sum" else totals.weights
    target[name] = target.get(name, 0.0) + np.asarray(v, np.float64)

