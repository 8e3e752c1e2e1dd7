"""Runs of `launch/main.py` in subprocesses, exactly as a user starts them."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

from tests.testing import require_model, require_shared

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = os.path.join(ROOT, "launch", "main.py")


# Pipeline runs use the smallest real checkpoint (SPLADE-tiny: BERT, 2 layers of 2 heads;
# fetched by .ci/run) unless a test needs what only a larger model shows. Its probes train in
# batches of 4, so an epoch is long enough (in steps) for a signal sent when a file appears to
# land within it.
SMALL_MODEL = "splade_tiny"
TRAIN_EXAMPLES, PROBE_BATCH = 480, 4
STEPS_PER_EPOCH = TRAIN_EXAMPLES // PROBE_BATCH


def model_flag(key: str = SMALL_MODEL) -> str:
  """The launcher flag for fetchable model `key` (the test skips when it is not installed)."""
  require_model(key)
  return f"--config.model.name={key}"


def quickstart_args(workdir, tfds_dir, extra=(), model=SMALL_MODEL):
  """A quickstart-sized run small enough for CI, slow enough to kill mid-stage."""
  return [sys.executable, MAIN, "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
          f"--workdir={workdir}", model_flag(model),
          f"--config.data.data_dir={require_shared('data', 'sst2')}",
          "--config.data.max_length=32", f"--config.data.max_train_examples={TRAIN_EXAMPLES}",
          "--config.data.max_eval_examples=64", "--config.run.batch_size=16",
          "--config.run.checkpoint_every_batches=3", "--config.papa.fractions=(0.0,1.0)",
          "--config.probe.cache_features=False", "--config.probe.encoder_dropout=True",
          "--config.probe.feature_dtype=float32", "--config.probe.epochs=3",
          f"--config.probe.batch_size={PROBE_BATCH}", "--config.run.log_every_steps=10", *extra]


def launcher_env(devices=1):
  return dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
              PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def run(args, timeout=600, env=None):
  out = subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                       env=env or launcher_env())
  assert out.returncode == 0, out.stderr[-4000:]
  return out


def signal_when(args, path, sig=signal.SIGKILL, timeout=300, env=None):
  """Starts the run, sends `sig` as soon as `path` exists; returns (status, log).

  `path` is a local path or a predicate that says when to send it."""
  ready = path if callable(path) else lambda: os.path.exists(path)
  with tempfile.TemporaryFile("w+") as log:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, text=True,
                            env=env or launcher_env())
    t0 = time.time()
    while not ready():
      if proc.poll() is not None:
        log.seek(0)
        raise AssertionError(f"run ended before {path} appeared:\n{log.read()[-3000:]}")
      if time.time() - t0 > timeout:
        proc.kill()
        raise AssertionError(f"{path} never appeared")
      time.sleep(0.05)
    proc.send_signal(sig)
    proc.wait(timeout=timeout)
    log.seek(0)
    return proc.returncode, log.read()


def kill_when(args, path, timeout=300, env=None):
  """Starts the run and SIGKILLs it as soon as `path` exists."""
  return signal_when(args, path, signal.SIGKILL, timeout, env)[0]


def result_rows(res: dict) -> list[tuple]:
  """(variant, static heads, score, best score) of every row of a results.json."""
  return [(r["variant"], r["static_heads"], r["score"], r["best_score"]) for r in res["rows"]]


def results(workdir):
  with open(os.path.join(workdir, "results.json")) as f:
    res = json.load(f)
  return result_rows(res), res


def free_port() -> int:
  """A TCP port on localhost that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def distributed_flags(port: int, pid: int, n: int = 2) -> list[str]:
  """The launcher flags of process `pid` of `n` (gloo collectives, coordinator on localhost)."""
  return ["--config.run.distributed.enabled=True",
          f"--config.run.distributed.coordinator_address=localhost:{port}",
          f"--config.run.distributed.num_processes={n}",
          f"--config.run.distributed.process_id={pid}",
          "--config.run.distributed.cpu_collectives=gloo"]


def run_two_processes(make_args) -> str:
  """Runs `make_args(pid, port)` as two JAX processes; returns process 1's log."""
  port = free_port()
  procs = [subprocess.Popen(make_args(pid, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=launcher_env(devices=1)) for pid in range(2)]
  errs = []
  for p in procs:
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-4000:]
    errs.append(err)
  assert "Process 1 of 2" in errs[1]
  return errs[1]


def two_processes_signal_one(make_args, path, target=1, timeout=600):
  """Runs `make_args(pid, port)` as two processes and sends SIGTERM to process `target`
  alone once `path` exists; returns (exit statuses, logs)."""
  port = free_port()
  logs = [tempfile.TemporaryFile("w+") for _ in range(2)]
  procs = [subprocess.Popen(make_args(pid, port), stdout=subprocess.DEVNULL, stderr=logs[pid],
                            text=True, env=launcher_env(devices=1)) for pid in range(2)]
  t0 = time.time()
  while not os.path.exists(path):
    assert all(p.poll() is None for p in procs), f"a process ended before {path} appeared"
    assert time.time() - t0 < timeout, f"{path} never appeared"
    time.sleep(0.05)
  procs[target].send_signal(signal.SIGTERM)
  rcs = []
  for p in procs:
    try:
      rcs.append(p.wait(timeout=timeout))
    except subprocess.TimeoutExpired:  # A process left waiting in a collective.
      for q in procs:
        q.kill()
      rcs.append(None)
  out = []
  for f in logs:
    f.seek(0)
    out.append(f.read())
    f.close()
  return rcs, out


def stopped_at(log: str) -> str:
  """The Preempted message the launcher logged: '<loop>: stopped after batch N.' etc."""
  found = re.findall(r"\] (.*stopped (?:after batch|before batch|at step) [^.(]*)", log)
  assert found, log[-3000:]
  return found[-1].strip()
