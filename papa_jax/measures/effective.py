"""Effective attention (Brunner et al. 2020): the part of A that reaches the output.

For a head with attention `A` (`nq x nk`) multiplying `T` (`nk x d`, the value
vectors with bias), `A_eff = A P_T` with `P_T` the orthogonal projector onto
`col(T)` restricted to real keys, and `A_null = A - A_eff` satisfies
`A_null T = 0`. Implemented mask-aware (pad rows of T zeroed before
factorising, so the range lives on real keys), with a relative per-example,
per-head rank tolerance, via a QR of T followed by an SVD of the small R.
See `shared/spec/effective_attention.md` §4.3 and §5. On a local (windowed)
layer this is still Brunner's projection over all real keys: the minimum-norm
rows with the same output, which may put mass outside the window.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from papa_jax import backend

Array = jax.Array
HIGHEST = jax.lax.Precision.HIGHEST


class EffectiveInfo(NamedTuple):
  """Diagnostics per matrix: numerical rank, null-space dimension, singular values."""

  rank: Array  # [...] int
  null_dim: Array  # [...] int: n_valid - rank
  sigma: Array  # [..., min(nk, d)] descending


def _factor(T: Array, method: str) -> tuple[Array, Array]:
  """Left singular vectors and singular values of T (thin)."""
  if method == "qr_svd":
    q, r = jnp.linalg.qr(T, mode="reduced")
    ur, s, _ = jnp.linalg.svd(r, full_matrices=False)
    return jnp.matmul(q, ur, precision=HIGHEST), s
  u, s, _ = jnp.linalg.svd(T, full_matrices=False)
  return u, s


def range_basis(T: Array, key_mask: Array | None = None, *, rtol: float | None = None,
                method: str = "qr_svd") -> tuple[Array, EffectiveInfo]:
  """Orthonormal basis of `col(T)` on real keys, columns beyond the rank zeroed.

  Args:
    T: `[..., nk, d]`.
    key_mask: `[..., nk]` bool (True = real token), or None.
    rtol: singular values `<= rtol * sigma_max` count as zero; default
      `max(n_valid, d) * eps` (NumPy's matrix_rank convention).
    method: "qr_svd" (QR of T, then SVD of R) or "svd" (thin SVD of T).

  Returns:
    `(U [..., nk, k], info)` with k = min(nk, d).
  """
  if T.dtype in (jnp.bfloat16, jnp.float16):
    raise ValueError("Factorise in float32 or float64, not in half precision.")  # caller's argument
  nk, d = T.shape[-2:]
  if key_mask is None:
    n_valid = jnp.full(T.shape[:-2], nk)
  else:
    if key_mask.shape != T.shape[:-1]:
      # caller's argument
      raise ValueError(f"key_mask shape {key_mask.shape} does not match T's {T.shape[:-1]}.")
    T = jnp.where(key_mask[..., None], T, 0)
    n_valid = jnp.sum(key_mask, axis=-1)
  if method not in ("qr_svd", "svd"):
    raise ValueError(f"Unknown method {method!r}; use 'qr_svd' or 'svd'.")  # caller's argument
  if T.ndim > 2:
    # One matrix per LAPACK call on CPU: jaxlib fans a batched call out over the intra-op
    # thread pool, which deadlocks when several (virtual) CPU devices run it at once. ~15%
    # slower on one device; GPUs/TPUs keep batched calls.
    def one_by_one(T):
      flat = T.reshape((-1,) + T.shape[-2:])
      u, s = jax.lax.map(lambda t: _factor(t, method), flat)
      return u.reshape(T.shape[:-1] + u.shape[-1:]), s.reshape(T.shape[:-2] + s.shape[-1:])

    u, s = backend.by_platform(one_by_one, lambda T: _factor(T, method), T)
  else:
    u, s = _factor(T, method)
  eps = jnp.finfo(T.dtype).eps
  tol = (rtol if rtol is not None else jnp.maximum(n_valid, d)[..., None] * eps) * s[..., :1]
  keep = (s > tol) & (s > 0)
  rank = jnp.sum(keep, axis=-1)
  return u * keep[..., None, :].astype(u.dtype), EffectiveInfo(rank, n_valid - rank, s)


def effective_attention(A: Array, T: Array, key_mask: Array | None = None,
                        query_mask: Array | None = None, *, rtol: float | None = None,
                        method: str = "qr_svd") -> tuple[Array, EffectiveInfo]:
  """`A_eff = A P_T` (batched over leading axes), and its diagnostics.

  Args:
    A: attention `[..., nq, nk]`.
    T: the matrix A multiplies, `[..., nk, d]` (value vectors with bias).
    key_mask: `[..., nk]` bool; pad keys get exactly zero.
    query_mask: `[..., nq]` bool; pad query rows are zeroed (default: the
      key mask when nq == nk, i.e. self-attention).
    rtol: rank tolerance relative to the largest singular value.
    method: see `range_basis`.

  Returns:
    `(A_eff [..., nq, nk], EffectiveInfo)`.
  """
  if A.shape[:-2] != T.shape[:-2] or A.shape[-1] != T.shape[-2]:
    raise ValueError(f"A {A.shape} and T {T.shape} do not match: need A [..., nq, nk] "
                     "and T [..., nk, d] with the same leading axes.")  # caller's argument
  dtype = jnp.promote_types(A.dtype, jnp.float32)
  A, T = A.astype(dtype), T.astype(dtype)
  u, info = range_basis(T, key_mask, rtol=rtol, method=method)
  if key_mask is not None:
    A = jnp.where(key_mask[..., None, :], A, 0)
    if query_mask is None and A.shape[-2] == A.shape[-1]:
      query_mask = key_mask
  if query_mask is not None:
    A = jnp.where(query_mask[..., :, None], A, 0)
  b = jnp.matmul(A, u, precision=HIGHEST)
  return jnp.matmul(b, jnp.swapaxes(u, -1, -2), precision=HIGHEST), info


def null_attention(A: Array, T: Array, key_mask: Array | None = None, **kwargs) -> Array:
  """`A - A_eff` (on real rows and keys): the part that does not reach the output."""
  a_eff, _ = effective_attention(A, T, key_mask, **kwargs)
  if key_mask is not None:
    keep = key_mask[..., None, :] & key_mask[..., :, None]
    A = jnp.where(keep, A, 0)
  return A.astype(a_eff.dtype) - a_eff

