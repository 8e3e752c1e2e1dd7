"""SIGTERM stops every forward-only loop, not only the ones that checkpoint."""

import os
import signal

import jax
import numpy as np
import pytest

from papa_jax import parallel, preemption


@pytest.fixture
def handler():
  old = signal.getsignal(signal.SIGTERM)
  preemption.install()
  yield
  preemption.reset()
  signal.signal(signal.SIGTERM, old)


def test_map_batches_stops_on_sigterm_before_the_next_batch(handler):
  mesh = parallel.make_mesh(1)
  data = dict(x=np.arange(40, dtype=np.float32).reshape(20, 2), valid=np.ones(20, bool))
  fn = jax.jit(lambda b: b["x"].sum())
  seen = []
  with pytest.raises(preemption.Preempted, match="stopped before batch 2"):
    for step, out, _ in parallel.map_batches(fn, data, batch_size=4, mesh=mesh):
      seen.append((step, float(out)))
      if step == 0:
        os.kill(os.getpid(), signal.SIGTERM)  # Arrives while batch 1 is in flight.
  # Batch 1 was in flight when the signal came; nothing after it is dispatched,
  # and its result is not handed out (the rerun redoes it).
  assert seen == [(0, float(np.arange(8).sum()))]


def test_map_batches_runs_to_the_end_without_a_request(handler):
  mesh = parallel.make_mesh(1)
  data = dict(x=np.ones((10, 2), np.float32), valid=np.ones(10, bool))
  steps = [s for s, _, _ in parallel.map_batches(jax.jit(lambda b: b["x"].sum()), data,
                                                  batch_size=4, mesh=mesh)]
  assert steps == [0, 1, 2]
