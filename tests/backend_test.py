"""Steps that differ by platform are chosen when a program is lowered (`papa_jax/backend.py`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from papa_jax import attention, backend, runner

pytestmark = pytest.mark.unit


def _exported(fn, *args, platforms):
  specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
  return jax.export.export(jax.jit(fn), platforms=platforms)(*specs).mlir_module()


def test_by_platform_runs_the_cpu_path_here_and_lowers_the_other_for_accelerators():
  x = jnp.arange(4.0)
  fn = lambda v: backend.by_platform(lambda u: u + 1, lambda u: u * 10, v)
  np.testing.assert_array_equal(jax.jit(fn)(x), x + 1)
  on_cpu = jax.jit(fn).lower(x).compile().as_text()
  assert "multiply" not in on_cpu and "add" in on_cpu  # Only the CPU branch is compiled.
  assert "stablehlo.multiply" in _exported(fn, x, platforms=("tpu",))
  assert "stablehlo.add" not in _exported(fn, x, platforms=("tpu",))


def test_the_fusion_barrier_and_the_scan_are_cpu_only():
  """The CPU's quirks stay out of the TPU/CUDA programs: no reduce_precision barrier, and the
  weighted sum is one einsum there, not a loop over the batch."""
  x = jnp.ones((2, 2, 8, 8))
  assert "reduce_precision" in jax.jit(attention.fusion_barrier).lower(x).compile().as_text()
  assert "reduce_precision" not in _exported(attention.fusion_barrier, x,
                                             platforms=("tpu", "cuda"))
  v, w = jnp.ones((4, 3, 5)), jnp.ones((4,))
  summed = lambda v, w: runner._weighted_sum(v, w)  # pylint: disable=protected-access
  assert "while" in jax.jit(summed).lower(v, w).compile().as_text()
  assert "stablehlo.while" not in _exported(summed, v, w, platforms=("tpu", "cuda"))
  np.testing.assert_allclose(jax.jit(summed)(v, w), np.full((3, 5), 4.0))
