"""Attention flow (Abnar & Zuidema 2020): a CPU path, one example at a time.

The layers' attention matrices with the residual (`A~_l = 0.5 A_l + 0.5 I`, rows
renormalised over real keys; `mixing.rollout`'s layer matrix) form a graph with
nodes (l, i) for l = 0..L and every real token i, and an edge (l, i) -> (l-1, j)
of capacity `A~_l[i, j]`. Flow `F[i, j]` is the maximum flow from (L, i) to
(0, j); rows are normalised over j. Capacities are quantised to integers
`round(2^24 A~)` for scipy's exact integer max-flow (`scale` in the result).
Cost: n^2 max-flow solves on (L+1) n nodes and L n^2 edges per example (n real
tokens): seconds for n = 32, minutes for n = 128 (`shared/spec/context_mixing.md`
§4.3); `LIMIT` warns above 64 tokens.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse
from scipy.sparse.csgraph import maximum_flow

SCALE = 2 ** 24
LIMIT = 64


def layer_matrices(attention: np.ndarray, residual: float = 0.5) -> np.ndarray:
  """`[L, n, n]` head-mean attention (real block) -> `A~_l` with the residual, rows to 1."""
  a = (1 - residual) * np.asarray(attention, np.float64) + residual * np.eye(attention.shape[-1])
  return a / a.sum(-1, keepdims=True)


def flow(mats: np.ndarray, *, scale: int = SCALE) -> np.ndarray:
  """Attention flow `[n, n]` of the last layer from `A~` matrices `[L, n, n]` (real block).

  Row i is the flow from output token i to each input token, normalised to sum to 1.
  """
  mats = np.asarray(mats, np.float64)
  layers, n = mats.shape[0], mats.shape[-1]
  if mats.shape != (layers, n, n):
    # caller's argument
    raise ValueError(f"attention flow needs [layers, n, n] matrices; got {mats.shape}")
  if n > LIMIT:
    warnings.warn(f"attention flow on {n} tokens: {n * n} max-flow solves on "
                  f"{(layers + 1) * n} nodes and {layers * n * n} edges; expect minutes per "
                  f"example (rollout is the cheap alternative).", stacklevel=2)
  caps = np.rint(mats * scale).astype(np.int32)
  rows, cols, vals = [], [], []
  for l in range(layers):  # Node (l, i) is l * n + i; edges from layer l + 1 down to l.
    src = (l + 1) * n + np.repeat(np.arange(n), n)
    dst = l * n + np.tile(np.arange(n), n)
    keep = caps[l].ravel() > 0
    rows.append(src[keep])
    cols.append(dst[keep])
    vals.append(caps[l].ravel()[keep])
  size = (layers + 1) * n
  graph = scipy.sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows),
                                                          np.concatenate(cols))),
                                  shape=(size, size), dtype=np.int32)
  out = np.zeros((n, n))
  for i in range(n):
    for j in range(n):
      out[i, j] = maximum_flow(graph, layers * n + i, j, method="dinic").flow_value
  total = out.sum(-1, keepdims=True)
  return np.where(total > 0, out / np.where(total > 0, total, 1), 0.0)


def example_flow(attention: np.ndarray, mask: np.ndarray, residual: float = 0.5) -> np.ndarray:
  """Flow `[N, N]` of one padded example from its head-mean attention `[L, N, N]` (rows over
  real keys) and mask `[N]`; pad rows and columns are 0."""
  real = np.flatnonzero(np.asarray(mask) > 0)
  out = np.zeros(attention.shape[-2:])
  if len(real):
    block = np.asarray(attention)[:, real][:, :, real]
    out[np.ix_(real, real)] = flow(layer_matrices(block, residual))
  return out
