"""Attention knockout sweeps (Geva et al., EMNLP 2023), batched over (layer window, edge class).

`pj.Knockout` blocks attention edges in a window of layers, per example. A sweep scores every
(window, class) target with a metric: the rows of one call are (target, example) pairs; targets
are grouped by their window's first layer and run from that layer on, from the unmodified
run's cached input to it (the layers before are computed once). The window's last layer and
the blocked edges are traced data: one program per first layer and chunk size.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax import parallel
from papa_jax.attention import AttentionOverride
from papa_jax.causal.metrics import Metric, as_metric
from papa_jax.causal.patching import (_arrays, _hidden, earlier_rows, layer_groups,
                                      run_chunks, run_metric)
from papa_jax.interventions import KNOCKOUT_RULES, Knockout
from papa_jax.models.encoder import run_from

Array = jax.Array


@functools.partial(jax.jit, static_argnames=("module", "rule", "first", "mesh"))
def _knocked(module, params, hidden: Array, metric: Metric, batch: dict, example: Array,
             blocked: Array, last: Array, *, rule: str, first: int, mesh=None) -> Array:
  """`metric` of the rows of `batch` (examples tiled per target; row r is example
  `example[r]`) with row r's `blocked[r]` edges cut in layers `first..last[r]`, the encoder
  run from `first` on from `hidden`. Rows split over `mesh` (`parallel.over_rows`)."""
  def rows(params, hidden, metric, batch, example, blocked, last):
    ko = Knockout(blocked, jnp.full(last.shape, first, jnp.int32), last, rule=rule)
    out = run_from(module, params, batch, earlier_rows(hidden, example, first),
                   AttentionOverride.intervene(ko), first)
    return metric(out, batch)
  return parallel.over_rows(rows, mesh, shared=3)(params, hidden, metric, batch, example,
                                                  blocked, last)


def check_windows(windows, num_layers: int) -> np.ndarray:
  """`[W, 2]` int (first, last) inclusive, each within the model's layers; raises naming the
  first bad window."""
  w = np.asarray(windows, np.int64).reshape(-1, 2) if len(windows) else np.zeros((0, 2), int)
  for i, (first, last) in enumerate(w):
    if not 0 <= first <= last < num_layers:
      # caller's argument
      raise ValueError(f"windows[{i}] = ({first}, {last}): use 0 <= first <= last < "
                       f"{num_layers} (the model's layers, inclusive).")
  return w


def sweep(model, batch: dict, blocked: np.ndarray, windows, metric: Metric, *,
          rule: str = "renormalize", chunk: int = 8, mesh: Mesh | None = None,
          desc: str = "") -> np.ndarray:
  """`metric` with each (window, class) knocked out, `[W, C, B]`.

  Args:
    model: a `Pretrained`.
    batch: input_ids, attention_mask `[B, L]` (and optional token_type_ids).
    blocked: `[C, B, L, L]` bool: class c's edges (query i may not attend to key j) per
      example (`interventions.edges`, `shifted_edges`, `position_classes`).
    windows: `[(first, last), ...]` inclusive layer windows.
    metric: `metric(output, batch) -> [B]`: a `metrics.Metric` or a pure jax function.
    rule: `Knockout.rule` ("renormalize" or "zero").
    chunk: at most this many targets' rows per call (evened over the largest group; a group's
      last chunk is padded with targets that block nothing, and the padding dropped).
    mesh: the devices to split each call's rows over (this process's of them; data-parallel,
      `chunk` rounded up so that they split evenly); None: one device. Over several
      processes, each runs every P-th chunk and the results are gathered on every process.
    desc: progress lines (this process's targets done, rate, ETA) under this label; "" for none.
  """
  if rule not in KNOCKOUT_RULES:
    # caller's argument
    raise ValueError(f"knockout rule {rule!r}; choose one of {KNOCKOUT_RULES}.")
  arrays, metric = _arrays(batch), as_metric(metric)
  n, length = np.shape(arrays["input_ids"])
  blocked = np.asarray(blocked, bool)
  if blocked.ndim != 4 or blocked.shape[1:] != (n, length, length):
    # caller's argument
    raise ValueError(f"blocked has shape {blocked.shape}; expected [classes, B, L, L] = "
                     f"[C, {n}, {length}, {length}].")
  w = check_windows(windows, model.config.num_layers)
  classes = blocked.shape[0]
  firsts = np.repeat(w[:, 0], classes)  # Targets window-major: t = window * C + class.
  lasts = np.repeat(w[:, 1], classes)
  cls = np.tile(np.arange(classes), len(w))
  if not len(firsts):
    return np.empty((0, classes, n), np.float32)
  hidden = _hidden(model.module, model.params, arrays, layer=int(firsts.max()))
  mesh = parallel.local_part(mesh)
  groups, chunk, tiled = layer_groups(firsts, arrays, chunk, 1 if mesh is None else mesh.size)
  example = tiled.pop("example")

  def call(part):
    last = np.full(chunk, -1, np.int32)  # Padding targets: an empty window.
    last[:len(part)] = lasts[part]
    which = np.zeros(chunk, np.int64)
    which[:len(part)] = cls[part]
    rows = blocked[which].reshape((chunk * n, length, length))
    return _knocked(model.module, model.params, hidden, metric, tiled, example,
                    jnp.asarray(rows), jnp.asarray(np.repeat(last, n)), rule=rule,
                    first=int(firsts[part[0]]), mesh=mesh)
  out = run_chunks(groups, chunk, len(firsts), n, call, desc)
  return out.reshape(len(w), classes, n)


def knockout(model, batch: dict, blocked: np.ndarray, windows, metric: Metric, *,
             rule: str = "renormalize", chunk: int = 8, mesh: Mesh | None = None
             ) -> dict[str, np.ndarray]:
  """Attention knockout of every (window, class): `knocked [W, C, B]` and the unmodified
  run's metric `base [B]` (a target's effect is `knocked - base`); `mesh`: `sweep`'s."""
  return dict(knocked=sweep(model, batch, blocked, windows, metric, rule=rule, chunk=chunk,
                            mesh=mesh),
              base=run_metric(model, batch, metric))
