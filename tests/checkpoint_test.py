"""Checkpoints: atomic, topology-independent restore, foreign and damaged ones refused."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from papa_jax import parallel
from papa_jax.workdir import checkpoint


def _state():
  return {"params": {"w": jnp.arange(12.0).reshape(3, 4), "b": jnp.ones(4)},
          "step": jnp.asarray(7, jnp.int32)}


@pytest.mark.integration
def test_checkpoint_saved_on_8_devices_restores_on_1(tmp_path):
  mesh8 = parallel.make_mesh(8)
  state8 = jax.device_put(_state(), parallel.replicated(mesh8))
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"))
  ck.save(1, state8, dict(fingerprint="run-a", epoch=1))
  ck.close()
  mesh1 = parallel.make_mesh(1)
  target = jax.device_put(jax.tree.map(jnp.zeros_like, _state()), parallel.replicated(mesh1))
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"))
  got, meta = ck.restore(ck.latest_step(), target, "run-a")
  assert meta["epoch"] == 1
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(_state())):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert all(len(x.sharding.device_set) == 1 for x in jax.tree.leaves(got))


@pytest.mark.unit
def test_invalid_checkpoint_of_another_run_is_refused(tmp_path):
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"))
  ck.save(1, _state(), dict(fingerprint="model-a"))
  with pytest.raises(checkpoint.CheckpointError, match="written by another run"):
    ck.restore(1, _state(), "model-b")


@pytest.mark.unit
def test_invalid_damaged_checkpoint_is_a_clear_error(tmp_path):
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"))
  ck.save(1, _state(), dict(fingerprint="f"))
  ck.close()
  for root, _, files in os.walk(tmp_path / "ck" / "1" / "state"):
    for f in files:
      p = os.path.join(root, f)
      with open(p, "r+b") as fh:
        fh.truncate(max(0, os.path.getsize(p) // 3))
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"))
  with pytest.raises(checkpoint.CheckpointError, match="does not fit|unreadable|damaged"):
    ck.restore(1, _state(), "f")


@pytest.mark.unit
def test_half_written_checkpoint_is_never_listed(tmp_path):
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"))
  ck.save(1, _state(), dict(fingerprint="f"))
  ck.close()
  os.makedirs(tmp_path / "ck" / "2.orbax-checkpoint-tmp" / "state")  # Killed mid-save.
  assert checkpoint.Checkpointer(str(tmp_path / "ck")).latest_step() == 1
