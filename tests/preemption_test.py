"""SIGTERM stops every forward-only loop, not only the ones that checkpoint."""

import os
import signal

import jax
import numpy as np
import pytest

from papa_jax import parallel, preemption
from tests.launcher import free_port


@pytest.fixture
def handler():
  old = signal.getsignal(signal.SIGTERM)
  preemption.install()
  yield
  preemption.reset()
  signal.signal(signal.SIGTERM, old)


@pytest.mark.unit
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


@pytest.mark.unit
def test_map_batches_runs_to_the_end_without_a_request(handler):
  mesh = parallel.make_mesh(1)
  data = dict(x=np.ones((10, 2), np.float32), valid=np.ones(10, bool))
  steps = [s for s, _, _ in parallel.map_batches(jax.jit(lambda b: b["x"].sum()), data,
                                                  batch_size=4, mesh=mesh)]
  assert steps == [0, 1, 2]


_AGREE = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
import jax
from papa_jax import preemption
pid, port = int(sys.argv[1]), int(sys.argv[2])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_enable_preemption_service", False)  # As the launcher does.
preemption.install()
preemption.set_check_every(int(sys.argv[3]))
jax.distributed.initialize(f"localhost:{{port}}", 2, pid)
for step in range(3000):
  if preemption.should_stop():
    print(f"stopped at {{step}}", flush=True)
    sys.exit(preemption.EXIT_CODE)
  if pid == 1 and step == 40:
    os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(0.005 * (1 + pid))  # The hosts run at different speeds.
print("never stopped", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("every", [1, 7])
def test_two_processes_stop_at_the_same_step_when_one_is_signalled(every, tmp_path):
  """SIGTERM to process 1 alone, the processes at different speeds: both stop at the same
  check (a multiple of `every`), by the all-gather of their flags."""
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  script = tmp_path / "agree.py"
  script.write_text(_AGREE.format(root=root))
  port = free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  procs = [subprocess.Popen([sys.executable, str(script), str(pid), str(port), str(every)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
           for pid in range(2)]
  outs = [p.communicate(timeout=120) for p in procs]
  assert [p.returncode for p in procs] == [preemption.EXIT_CODE] * 2, outs[0][1][-2000:]
  steps = [int(out.split("stopped at ")[1]) for out, _ in outs]
  assert steps[0] == steps[1] > 40 and steps[0] % every == 0, steps
  assert "Another process was signalled" in outs[0][1]
