"""The runner's weighted sums over the batch, both kernels, against numpy."""

import jax
import numpy as np
import pytest

from papa_jax import runner

pytestmark = pytest.mark.unit


def _case(shape, weight_axes, seed=0):
  rng = np.random.default_rng(seed)
  value = rng.normal(size=shape).astype(np.float32)
  weight = (rng.random(size=shape[:1] + shape[len(shape) - weight_axes:]) > 0.3)
  weight = weight.astype(np.float32) * rng.integers(1, 3, size=weight.shape)
  w = weight.reshape(weight.shape[:1] + (1,) * (len(shape) - weight.ndim) + weight.shape[1:])
  value = np.where(w > 0, value, np.nan)  # Dropped values may be NaN: they count for nothing.
  want = np.sum(np.where(w > 0, value.astype(np.float64), 0) * w, axis=0)
  return value, weight, want


@pytest.mark.parametrize("backend", ["cpu", "gpu"])  # The scan, and the einsum kept for GPU/TPU.
@pytest.mark.parametrize("shape,weight_axes", [((7, 3, 5, 5), 2), ((6, 4), 0), ((1, 2, 3), 1)])
def test_weighted_sum_equals_numpy(backend, shape, weight_axes):
  value, weight, want = _case(shape, weight_axes)
  got = jax.jit(lambda v, w: runner._weighted_sum(v, w, backend))(value, weight)
  assert got.shape == want.shape and got.dtype == np.float32
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
