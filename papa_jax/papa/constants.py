"""Which constant replaces a head's attention: PAPA's mean and its controls.

Every variant is a `[layers, heads, L, L]` matrix that `AttentionOverride.constant`
masks with an example's `m_i m_j` and L1-renormalises over its real keys:
  * "raw": PAPA's mean, `sum_b m_i m_j A / sum_b m_i m_j` per cell;
  * "effective": the same mean of effective attention;
  * "uniform": all ones, i.e. uniform attention over each example's real tokens
    (the control for "does the mean's shape matter at all");
  * "row_mean": each query row averaged over the examples where that query is
    real, `sum_b m_i A_ij / sum_b m_i` (rows are distributions; PAPA's per-cell
    counts weight a cell by how often both tokens are real instead);
  * "compressed": the mean compressed to `P(i, j) ∝ exp(a(j) + r(i - j))`, an
    absolute-position and a relative-offset term per head, fitted to the raw
    mean's rows by weighted cross-entropy (the control for how much of the mean's
    structure beyond position matters);
  * "optimal": the loss-optimal constant, free logits per static head started at
    the log of the raw mean and trained with a probe on the task's train split
    (`papa/optimal.py`): the lower bound beside PAPA's upper one.

Local (windowed) layers (`EncoderConfig.local_window`, ModernBERT): the layer
multiplies any constant by its window `|i - j| <= local_window` before the
per-example masking and renormalisation, so no variant puts mass outside the
window, and a row is renormalised over the real keys inside it ("uniform" is
uniform over them). PAPA's means of such a head are already 0 outside the window
(its attention is, for real queries); "effective" and "compressed" may not be, and
are cut to the window when applied. Cells are indexed by absolute positions 0..L-1
(the layout), for rotary families too: position enters their scores only through
the rotation, which a constant replaces.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

VARIANTS = ("raw", "effective", "uniform", "row_mean", "compressed", "optimal")
FROM_A_PASS = ("raw", "effective")  # Computed by their own means pass.


def row_mean(row_sums: np.ndarray, row_counts: np.ndarray) -> np.ndarray:
  """`sum_b m_i A_ij / sum_b m_i` (0 where query i is never real)."""
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(row_counts > 0, row_sums / np.where(row_counts > 0, row_counts, 1), 0.0)


def uniform(num_layers: int, num_heads: int, length: int) -> np.ndarray:
  return np.ones((num_layers, num_heads, length, length), np.float32)


def offsets(length: int) -> np.ndarray:
  """`[L, L]` index of `i - j` into the `2L - 1` relative-offset terms."""
  q = np.arange(length)
  return q[:, None] - q[None, :] + length - 1


def compressed_logits(a: jax.Array, r: jax.Array) -> jax.Array:
  """`a(j) + r(i - j)`: `a [..., L]`, `r [..., 2L - 1]` -> `[..., L, L]`."""
  L = a.shape[-1]
  return a[..., None, :] + jnp.take(r, jnp.asarray(offsets(L)), axis=-1)


def _targets(avgs: np.ndarray, query_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Rows of the mean as distributions, and each row's weight (its query count, 0 if empty)."""
  mass = avgs.sum(-1, keepdims=True)
  rows = np.where(mass > 0, avgs / np.where(mass > 0, mass, 1.0), 0.0)
  weights = np.where(mass[..., 0] > 0, query_counts, 0.0)
  return rows, weights / max(float(query_counts.max()), 1.0)


def compressed_loss(params, rows: jax.Array, weights: jax.Array) -> jax.Array:
  """Weighted cross-entropy of the mean's rows under the compressed model, summed over heads."""
  logp = jax.nn.log_softmax(compressed_logits(*params), axis=-1)
  return -jnp.sum(weights[..., None] * jnp.where(rows > 0, rows * logp, 0.0))


def _fit_one(rows: jax.Array, weights: jax.Array, steps: int):
  """L-BFGS on one head (`rows [L, L]`, `weights [L]`): its own line search and memory."""
  L = rows.shape[-1]
  params = (jnp.zeros((L,), jnp.float32), jnp.zeros((2 * L - 1,), jnp.float32))
  loss = functools.partial(compressed_loss, rows=rows, weights=weights)
  opt = optax.lbfgs()
  value_and_grad = optax.value_and_grad_from_state(loss)

  def step(carry, _):
    p, state = carry
    value, grad = value_and_grad(p, state=state)
    updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=loss)
    return (optax.apply_updates(p, updates), state), value

  (params, _), values = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)
  return params, values


@functools.partial(jax.jit, static_argnames=("steps",))
def _fit(rows: jax.Array, weights: jax.Array, steps: int):
  """`_fit_one` for every head: `rows [layers, heads, L, L]`, `weights [layers, heads, L]`."""
  lead = rows.shape[:-2]
  flat = jax.vmap(functools.partial(_fit_one, steps=steps))(
      rows.reshape((-1,) + rows.shape[-2:]), weights.reshape((-1, rows.shape[-1])))
  return jax.tree.map(lambda x: x.reshape(lead + x.shape[1:]), flat)


def fit_compressed(avgs: np.ndarray, counts: np.ndarray, steps: int = 300
                   ) -> tuple[np.ndarray, dict]:
  """The compressed constants `[layers, heads, L, L]` fitted to PAPA's mean, and diagnostics.

  Args:
    avgs: the raw mean `[layers, heads, L, L]`.
    counts: its pair counts `[L, L]` (the diagonal weights each query row).
    steps: L-BFGS iterations (the problem is convex in `a` and `r`).

  Returns:
    `(P, info)`: P's rows are distributions over all L keys (masked and
    renormalised per example like every constant); `info` has the final loss,
    its change over the last 10 steps, and the mean KL from the mean's rows.
  """
  rows, weights = _targets(np.asarray(avgs, np.float64), np.diag(counts).astype(np.float64))
  weights = np.broadcast_to(weights, rows.shape[:-1])
  params, values = _fit(jnp.asarray(rows, jnp.float32), jnp.asarray(weights, jnp.float32), steps)
  p = np.asarray(jax.nn.softmax(compressed_logits(*params), axis=-1), np.float64)
  kl = np.where(rows > 0, rows * (np.log(np.where(rows > 0, rows, 1)) -
                                  np.log(np.maximum(p, 1e-300))), 0.0).sum(-1)
  values = np.asarray(values, np.float64).reshape(-1, steps).sum(0)  # Summed over heads.
  info = dict(loss=float(values[-1]), loss_change_last_10=float(values[-11] - values[-1]),
              mean_kl_from_mean=float((kl * weights).sum() / max(weights.sum(), 1e-12)),
              steps=steps)
  return p.astype(np.float32), info
