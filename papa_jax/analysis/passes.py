"""A resumable pass that sums per-head statistics over a split (the analyses' loop).

`fn(params, batch) -> {name: float32 sums}` is reduced over the mesh
(`parallel.sharded_sum`) and added into float64 host totals; every
`checkpoint_every` batches, and on a preemption request, the totals and the
data position go to `partial` (atomically), so a killed or preempted analysis
resumes where it stopped and ends with the same totals.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any, Callable

import numpy as np

from papa_jax import parallel, preemption, workdir


def _load(path: str, run_key: str) -> tuple[dict[str, np.ndarray], int] | None:
  if not path or not os.path.exists(path):
    return None
  try:
    with np.load(path) as z:
      if str(z["run_key"]) != run_key:
        return None
      sums = {k[len("sum/"):]: z[k].astype(np.float64) for k in z.files if k.startswith("sum/")}
      return sums, int(z["next_batch"])
  except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
    return None


def _save(path: str, sums: dict[str, np.ndarray], next_batch: int, run_key: str) -> None:
  with workdir.atomic_write(path, "wb") as f:
    np.savez(f, next_batch=next_batch, run_key=np.asarray(run_key),
             **{f"sum/{k}": v for k, v in sums.items()})


def sum_pass(fn: Callable, params: Any, data, mesh, *, batch_size: int, partial: str = "",
             run_key: str = "", checkpoint_every: int = 0, desc: str = "") -> dict[str, np.ndarray]:
  """float64 totals of `fn`'s sums over every batch of `data` (resumable via `partial`).

  Args:
    fn: `(params, batch) -> dict of per-device float32 sums`, not yet sharded.
    params: replicated inputs of `fn` (a pytree).
    data: the split (`Encoded` or a dict of arrays), held by every process.
    mesh: the data mesh.
    batch_size: the global batch size.
    partial: a `.npz` path for partial totals ('' for none).
    run_key: identifies the computation; partial totals of another key are ignored.
    checkpoint_every: save partial totals every this many batches (0: only on preemption).
    desc: progress label.
  """
  sharded = parallel.sharded_sum(fn, mesh)
  params = parallel.put_replicated(params, mesh)
  sums, start = _load(partial, run_key) or ({}, 0)
  step = start - 1
  for step, out, _ in parallel.map_batches(lambda b: sharded(params, b), data,
                                           batch_size=batch_size, mesh=mesh, start=start,
                                           desc=desc, every=10):
    for k, v in out.items():
      sums[k] = sums.get(k, 0.0) + np.asarray(v, np.float64)
    stop = preemption.requested()
    if partial and parallel.is_main_process() and (stop or (
        checkpoint_every > 0 and (step + 1) % checkpoint_every == 0)):
      _save(partial, sums, step + 1, run_key)
    if stop:
      raise preemption.Preempted(f"{desc or 'analysis'}: stopped after batch {step + 1}.")
  if partial and parallel.is_main_process() and os.path.exists(partial):
    os.remove(partial)
  return sums
