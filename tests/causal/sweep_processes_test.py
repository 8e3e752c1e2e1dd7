"""A patching and a knockout sweep split over two JAX processes (gloo on localhost) equal
one process's, on every process."""

import sys

import numpy as np
import pytest

from tests.launcher import free_port, launcher_env, run

pytestmark = pytest.mark.slow  # Three JAX processes.


def _args(out, processes, pid, port):
  return [sys.executable, "-m", "tests.causal.sweep_process", str(out), str(processes),
          str(pid), str(port)]


def test_sweeps_split_over_two_processes_equal_one_process(tmp_path):
  """Two processes of two devices each run alternate chunks (together as many as one process,
  each fewer) and both end with one process's results (two devices: the same chunk size)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  (tmp_path / "one").mkdir()
  (tmp_path / "two").mkdir()
  run(_args(tmp_path / "one", 1, 0, 0), env=launcher_env(devices=2))
  port = free_port()
  procs = [subprocess.Popen(_args(tmp_path / "two", 2, pid, port), stderr=subprocess.PIPE,
                            text=True, env=launcher_env(devices=2)) for pid in (0, 1)]
  for p in procs:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-4000:]
  one = np.load(tmp_path / "one" / "process0.npz")
  two = [np.load(tmp_path / "two" / f"process{pid}.npz") for pid in (0, 1)]
  assert one["patched"].shape == (12, 4) and one["knocked"].shape == (3, 2, 4)
  assert np.ptp(one["patched"]) > 1e-3 and np.ptp(one["knocked"]) > 1e-3
  assert (two[0]["chunks"] + two[1]["chunks"] == one["chunks"]).all()
  assert (two[0]["chunks"] > 0).all() and (two[1]["chunks"] > 0).all()
  for got in two:
    for key in ("patched", "knocked"):
      np.testing.assert_allclose(got[key], one[key], rtol=1e-6, atol=1e-7, err_msg=key)
