"""The one format of a resumable pass's partial state: arrays, a position, a run key.

A pass (the means, an analysis's sums, the ablation's layers) saves its
running totals and the position to resume from every so often and on a
preemption request; a rerun of the *same* computation (`run_key`) continues
from there, and a partial file of another computation, or one that cannot be
read, is ignored (the pass starts over). Written atomically (`workdir.atomic_write`).
File: `.npz` with `format`, `run_key`, `position` and each array as `a/<name>`.
"""

from __future__ import annotations

import dataclasses
import zipfile

import numpy as np

from papa_jax.workdir import storage, rules as workdir

FORMAT = "papa-jax-partial/1"


@dataclasses.dataclass
class Partial:
  """What a pass saved: where to resume (`position`) and its running totals."""

  position: int
  arrays: dict[str, np.ndarray]


def load(path: str, run_key: str) -> Partial | None:
  """The partial state of the same computation at `path`, or None."""
  if not path or not storage.exists(path):
    return None
  try:
    with np.load(storage.readable(path), allow_pickle=False) as z:
      if str(z["format"]) != FORMAT or str(z["run_key"]) != run_key:
        return None
      arrays = {k[2:]: z[k] for k in z.files if k.startswith("a/")}
      return Partial(int(z["position"]), arrays)
  except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
    return None


def save(path: str, run_key: str, position: int, arrays: dict[str, np.ndarray]) -> None:
  with workdir.atomic_write(path, "wb") as f:
    np.savez(f, format=np.asarray(FORMAT), run_key=np.asarray(run_key),
             position=np.asarray(position), **{f"a/{k}": np.asarray(v) for k, v in arrays.items()})


def remove(path: str) -> None:
  storage.remove(path)
