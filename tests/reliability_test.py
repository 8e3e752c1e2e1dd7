"""Reliability: kill -9 and resume, determinism, two-process runs, launcher errors.

These drive `launch/main.py` in subprocesses, exactly as a user would.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from tests.launcher import MAIN, ROOT, SMALL_MODEL, free_port, model_flag
from tests.launcher import STEPS_PER_EPOCH as STEPS
from tests.launcher import kill_when as _kill_when
from tests.launcher import launcher_env as _env
from tests.launcher import quickstart_args as _args
from tests.launcher import results as _results
from tests.launcher import run as _run
from tests.launcher import signal_when as _signal_when
from tests.testing import require_model, require_shared

pytestmark = pytest.mark.slow  # Whole runs in subprocesses, several processes at once.


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("reliability")
  wd = tmp / "reference"
  _run(_args(str(wd), str(tmp / "tfds")))
  return tmp, wd


def test_determinism_same_config_twice_gives_identical_results(reference):
  tmp, wd = reference
  again = tmp / "again"
  _run(_args(str(again), str(tmp / "tfds")))
  rows_a, res = _results(wd)
  rows_b, _ = _results(again)
  assert rows_a == rows_b  # Scores identical, not merely close.
  np.testing.assert_array_equal(np.load(wd / "means" / "means_raw.npz")["sums"],
                                np.load(again / "means" / "means_raw.npz")["sums"])
  assert res["seeds"] == [42] and res["config"]["papa"]["seeds"] == [42]
  assert "jax" in res["versions"] and "flax" in res["versions"]
  assert "git_revision" in res
  assert res["cpu"]["kind"] in ("avx2", "avx512", "avx512_bf16", "other") and res["cpu"]["model"]
  assert res["xla_flags"].startswith("--xla_force_host_platform_device_count=1")


def test_resume_after_sigkill_in_means_and_in_training(reference):
  tmp, wd = reference
  killed = tmp / "killed"
  args = _args(str(killed), str(tmp / "tfds"))
  # 1. Killed during the attention-means pass, once partial sums exist.
  rc = _kill_when(args, str(killed / "means" / "means_raw.partial.npz"))
  assert rc == -signal.SIGKILL
  assert not (killed / "means" / "means_raw.npz").exists()
  # 2. Rerun, killed during probe training after an epoch's checkpoint.
  rc = _kill_when(args, str(killed / "probe" / "raw_k0_s42" / "checkpoints" / str(STEPS)))
  assert rc == -signal.SIGKILL  # After epoch 1.
  assert (killed / "means" / "means_raw.npz").exists()
  assert not (killed / "probe" / "raw_k0_s42" / "result.json").exists()
  # 3. Rerun to the end: same means and scores as the uninterrupted run.
  out = _run(args)
  assert "resumed after epoch" in out.stderr
  ref = np.load(wd / "means" / "means_raw.npz")
  got = np.load(killed / "means" / "means_raw.npz")
  assert np.abs(ref["avgs"] - got["avgs"]).max() <= 1e-6
  np.testing.assert_array_equal(ref["counts"], got["counts"])
  assert _results(killed)[0] == _results(wd)[0]


def test_resume_after_sigterm_in_means_and_mid_epoch(reference):
  """Preemption: SIGTERM checkpoints (means partial sums, or the probe within its
  epoch), exits with status 75, and the rerun ends as the uninterrupted run."""
  tmp, wd = reference
  pre = tmp / "preempted"
  (pre / "means").mkdir(parents=True)
  args = _args(str(pre), "", ["--config.run.checkpoint_every_steps=7"])
  rc, log = _signal_when(args, str(pre / "means" / "means_raw.partial.npz"), signal.SIGTERM)
  assert rc == 75, log[-3000:]
  assert "Rerun the same command to resume" in log
  assert not (pre / "means" / "means_raw.npz").exists()
  ckpt = pre / "probe" / "raw_k0_s42" / "checkpoints"
  rc, log = _signal_when(args, str(ckpt / "7"), signal.SIGTERM)  # Step 7 of epoch 1.
  assert rc == 75, log[-3000:]
  assert "resuming at batch" in log  # The means pass resumed from its partial sums.
  steps = sorted(int(p) for p in os.listdir(ckpt) if p.isdigit())
  assert 7 < steps[-1] < STEPS  # A checkpoint written on SIGTERM, within the first epoch.
  out = _run(args)
  assert f"resumed after epoch 0, step {steps[-1]} of epoch 1" in out.stderr
  ref = np.load(wd / "means" / "means_raw.npz")
  got = np.load(pre / "means" / "means_raw.npz")
  assert np.abs(ref["avgs"] - got["avgs"]).max() <= 1e-6
  assert _results(pre)[0] == _results(wd)[0]  # Scores identical to the uninterrupted run.


def test_multiprocess_means_equal_single_process(reference):
  """Two JAX processes (gloo on localhost), each reading its own data shard."""
  tmp, wd = reference
  multi = tmp / "multi"
  _run_two_processes(lambda pid, port: _args(str(multi), str(tmp / "tfds"),
                                             ["--config.stage=means", *_distributed(port, pid)]))
  ref = np.load(wd / "means" / "means_raw.npz")
  got = np.load(multi / "means" / "means_raw.npz")
  assert json.loads(str(got["metadata"]))["num_examples"] == 480
  np.testing.assert_array_equal(ref["counts"], got["counts"])
  np.testing.assert_array_equal(ref["row_counts"], got["row_counts"])
  assert np.abs(ref["avgs"] - got["avgs"]).max() <= 1e-6
  for key in ("sums_sq", "sums_xlogx", "row_sums"):  # The controls' sums, same pass.
    np.testing.assert_allclose(got[key], ref[key], rtol=1e-5, atol=1e-4, err_msg=key)


def _distributed(port: int, pid: int, n: int = 2) -> list[str]:
  return ["--config.run.distributed.enabled=True",
          f"--config.run.distributed.coordinator_address=localhost:{port}",
          f"--config.run.distributed.num_processes={n}",
          f"--config.run.distributed.process_id={pid}",
          "--config.run.distributed.cpu_collectives=gloo"]


def _run_two_processes(make_args) -> str:
  """Runs `make_args(pid, port)` as two JAX processes; returns process 1's log."""
  port = free_port()
  procs = [subprocess.Popen(make_args(pid, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(devices=1)) for pid in range(2)]
  errs = []
  for p in procs:
    _, err = p.communicate(timeout=900)
    assert p.returncode == 0, err[-4000:]
    errs.append(err)
  assert "Process 1 of 2" in errs[1]
  return errs[1]


def test_multiprocess_effective_stage_equals_single_process(tmp_path):
  """Same statistics and example counts from two processes as from one. MiniLM-L3: its heads
  (size 32) leave long examples a null space, which SPLADE-tiny's (64) would not at 64 tokens."""
  require_model("minilm_l3")

  def args(workdir, extra=()):
    return [sys.executable, MAIN,
            "--config=" + os.path.join(ROOT, "configs", "effective.py") + ":model=minilm_l3",
            f"--workdir={workdir}", f"--config.data.data_dir={require_shared('data', 'sst2')}",
            "--config.effective.max_examples=20", "--config.run.batch_size=8", *extra]

  _run(args(tmp_path / "one"))
  _run_two_processes(lambda pid, port: args(tmp_path / "two", _distributed(port, pid)))
  one = json.load(open(tmp_path / "one" / "effective" / "stats.json"))
  two = json.load(open(tmp_path / "two" / "effective" / "stats.json"))
  assert one["summary"]["examples"] == two["summary"]["examples"] == 20
  assert one["count/long"] == two["count/long"] and one["count/all"] == two["count/all"] == 20
  for key in ("mass_raw/all", "mass_eff/all", "js/all", "corr/all", "null_ratio/all"):
    np.testing.assert_allclose(np.asarray(two[key], float), np.asarray(one[key], float),
                               atol=2e-5, err_msg=key)


def test_multiprocess_mixing_stage_equals_single_process(tmp_path):
  """The context-mixing stage: the same per-head and per-layer means from two processes."""
  require_model(SMALL_MODEL)

  def args(workdir, extra=()):
    return [sys.executable, MAIN, "--config=" + os.path.join(ROOT, "configs", "effective.py")
            + f":stage=mixing,model={SMALL_MODEL}", f"--workdir={workdir}",
            f"--config.data.data_dir={require_shared('data', 'sst2')}",
            "--config.effective.max_examples=12", "--config.run.batch_size=4",
            "--config.data.max_length=32", "--config.mixing.methods=norms,alti,value_zeroing",
            *extra]

  _run(args(tmp_path / "one"))
  _run_two_processes(lambda pid, port: args(tmp_path / "two", _distributed(port, pid)))
  one = json.load(open(tmp_path / "one" / "mixing" / "stats.json"))
  two = json.load(open(tmp_path / "two" / "mixing" / "stats.json"))
  assert one["summary"]["examples"] == two["summary"]["examples"] == 12
  assert two["processes"] == 2
  for key in ("norm_mass", "head_share", "attention_self"):
    np.testing.assert_allclose(np.asarray(two[key], float), np.asarray(one[key], float),
                               atol=2e-5, err_msg=key)
  for key, v in one["summary"]["layers"].items():
    np.testing.assert_allclose(two["summary"]["layers"][key], v, atol=2e-5, err_msg=key)
  assert set(one["summary"]["layers"]) >= {"self_alti", "self_value_zeroing",
                                           "rollout_self_alti"}


def _pipeline_args(workdir, extra=()):
  """Every stage on a small run: means, sort (a half-heads fraction), cached probes."""
  return [sys.executable, MAIN, "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
          f"--workdir={workdir}", model_flag(),
          f"--config.data.data_dir={require_shared('data', 'sst2')}",
          "--config.data.max_length=32", "--config.data.max_train_examples=96",
          "--config.data.max_eval_examples=40", "--config.run.batch_size=16",
          "--config.papa.fractions=(0.0,0.5,1.0)", "--config.papa.seeds=(1,2)",
          "--config.papa.orderings=lambda,gradient", "--config.sort.epochs=1",
          "--config.sort.max_train_examples=-1", "--config.probe.epochs=2", *extra]


def test_multiprocess_whole_pipeline_equals_single_process(tmp_path):
  """Two processes (one device each) vs one process with two devices: the same mesh,
  so means agree to 1e-6 and every score, ranking and example count is identical."""
  one, two = tmp_path / "one", tmp_path / "two"
  _run(_pipeline_args(one), env=_env(devices=2), timeout=900)
  _run(_pipeline_args(one, ["--config.stage=effective"]), env=_env(devices=2))
  _run_two_processes(lambda pid, port: _pipeline_args(two, _distributed(port, pid)))
  _run_two_processes(lambda pid, port: _pipeline_args(
      two, ["--config.stage=effective", *_distributed(port, pid)]))
  a, b = np.load(one / "means" / "means_raw.npz"), np.load(two / "means" / "means_raw.npz")
  assert np.abs(a["avgs"] - b["avgs"]).max() <= 1e-6
  np.testing.assert_array_equal(a["counts"], b["counts"])
  assert (json.loads(str(a["metadata"]))["num_examples"]
          == json.loads(str(b["metadata"]))["num_examples"] == 96)
  assert (json.load(open(one / "sort" / "sorted_heads.json"))
          == json.load(open(two / "sort" / "sorted_heads.json")))
  ga = json.load(open(one / "orderings" / "gradient.json"))
  gb = json.load(open(two / "orderings" / "gradient.json"))
  np.testing.assert_allclose(gb["scores"], ga["scores"], rtol=1e-4)
  assert ga["ranking"] == gb["ranking"]
  rows_a, res_a = _results(one)
  rows_b, res_b = _results(two)
  # 3 static-head counts x 2 seeds with PAPA's gates; 2 more x 2 seeds with the gradient.
  assert rows_a == rows_b and len(rows_a) == 10
  assert res_b["processes"] == 2 and res_a["processes"] == 1
  for r in res_a["rows"] + res_b["rows"]:
    assert (r["examples"], r["eval_examples"]) == (96, 40)
  for run_dir in os.listdir(one / "probe"):
    pa = np.load(one / "probe" / run_dir / "predictions.npz")
    pb = np.load(two / "probe" / run_dir / "predictions.npz")
    np.testing.assert_array_equal(pa["predictions"], pb["predictions"])
  ea = json.load(open(one / "effective" / "stats.json"))
  eb = json.load(open(two / "effective" / "stats.json"))
  assert ea["count/all"] == eb["count/all"] == ea["summary"]["examples"]
  np.testing.assert_allclose(eb["null_ratio/all"], ea["null_ratio/all"], atol=2e-5)


def _two_processes_signal_one(make_args, path, target=1, timeout=600):
  """Runs `make_args(pid, port)` as two processes and sends SIGTERM to process `target`
  alone once `path` exists; returns (exit statuses, logs)."""
  port = free_port()
  logs = [tempfile.TemporaryFile("w+") for _ in range(2)]
  procs = [subprocess.Popen(make_args(pid, port), stdout=subprocess.DEVNULL, stderr=logs[pid],
                            text=True, env=_env(devices=1)) for pid in range(2)]
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


def _stopped_at(log: str) -> str:
  """The Preempted message the launcher logged: '<loop>: stopped after batch N.' etc."""
  found = re.findall(r"\] (.*stopped (?:after batch|before batch|at step) [^.(]*)", log)
  assert found, log[-3000:]
  return found[-1].strip()


def test_multiprocess_sigterm_to_one_host_stops_every_host_at_the_same_step(tmp_path):
  """A pod's hosts are signalled at different steps: SIGTERM to process 1 alone, in the
  means pass, mid-epoch in a probe and in an analysis stage, stops both processes at the
  same step with one consistent checkpoint and status 75; the reruns end as the
  uninterrupted run (one process, the same two-device mesh) did."""
  one, two = tmp_path / "one", tmp_path / "two"

  def run_args(workdir, extra=()):
    # 30 batches per pass and per epoch, each checkpointed (every 2 steps in a probe): a
    # signal sent when a checkpoint appears lands mid-pass, where the hosts agree to stop at
    # a multiple of preemption_check_every.
    return [sys.executable, MAIN, "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
            f"--workdir={workdir}", model_flag(),
            f"--config.data.data_dir={require_shared('data', 'sst2')}",
            "--config.data.max_length=32", "--config.data.max_train_examples=480",
            "--config.data.max_eval_examples=40", "--config.run.batch_size=16",
            "--config.papa.fractions=(0.0,1.0)", "--config.papa.seeds=(1,)",
            "--config.sort.epochs=1", "--config.sort.max_train_examples=64",
            "--config.probe.epochs=2", "--config.effective.split=train",
            "--config.effective.max_examples=160",
            "--config.run.checkpoint_every_batches=1", "--config.run.checkpoint_every_steps=2",
            *extra]

  _run(run_args(one), env=_env(devices=2), timeout=900)
  _run(run_args(one, ["--config.stage=effective"]), env=_env(devices=2))

  def args(extra=()):
    return lambda pid, port: run_args(two, [*extra, *_distributed(port, pid)])

  # Each signal lands mid-work: the means unfinished, then the first probe unfinished.
  unfinished = {two / "means" / "means_raw.partial.npz": two / "means" / "means_raw.npz",
                two / "probe" / "raw_k0_s1" / "checkpoints" / "2":
                    two / "probe" / "raw_k0_s1" / "result.json"}
  for path, final in unfinished.items():
    rcs, logs = _two_processes_signal_one(args(), str(path))
    assert rcs == [75, 75], [log[-2000:] for log in logs]
    assert _stopped_at(logs[0]) == _stopped_at(logs[1])
    assert "Another process was signalled" in logs[0]
    assert not final.exists(), final
  _run_two_processes(args())
  rcs, logs = _two_processes_signal_one(args(["--config.stage=effective"]),
                                        str(two / "effective" / "partial.partial.npz"))
  assert rcs == [75, 75] and _stopped_at(logs[0]) == _stopped_at(logs[1]), logs[0][-2000:]
  assert not (two / "effective" / "stats.json").exists()  # Stopped mid-pass.
  _run_two_processes(args(["--config.stage=effective"]))
  a, b = np.load(one / "means" / "means_raw.npz"), np.load(two / "means" / "means_raw.npz")
  assert np.abs(a["avgs"] - b["avgs"]).max() <= 1e-6
  assert _results(one)[0] == _results(two)[0]
  ea = json.load(open(one / "effective" / "stats.json"))
  eb = json.load(open(two / "effective" / "stats.json"))
  assert ea["count/all"] == eb["count/all"]
  np.testing.assert_allclose(eb["null_ratio/all"], ea["null_ratio/all"], atol=2e-5)


@pytest.mark.parametrize("flag,message", [
    ("--config.probe.lerning_rate=1e-3", "lerning_rate"),
    ("--config.probe.epochs=many", "epochs"),
    ("--config.data.max_length=1.5", "max_length"),
    ("--config.effective.other_model=x", "renamed: use --config.finetune.other_model"),
    ("--config.effective.figure_head=2", "renamed: use --config.figures.head"),
])
def test_invalid_launcher_config_flags_fail(flag, message, tmp_path):
  out = subprocess.run([sys.executable, MAIN,
                        "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
                        f"--workdir={tmp_path / 'w'}", flag], capture_output=True, text=True,
                       timeout=120, env=_env())
  assert out.returncode != 0
  assert message in out.stderr
  assert not (tmp_path / "w").exists()  # Nothing was written.


@pytest.mark.parametrize("traceback", [False, True])
def test_invalid_input_is_one_line_without_a_traceback(traceback, tmp_path):
  """A bad input (here: no data) ends the launcher with status 1 and one line naming it; the
  traceback only with PAPA_TRACEBACK=1."""
  env = dict(_env(), PAPA_SHARED=str(tmp_path / "nowhere"))
  if traceback:
    env["PAPA_TRACEBACK"] = "1"
  out = subprocess.run([sys.executable, MAIN,
                        "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
                        f"--workdir={tmp_path / 'w'}"], capture_output=True, text=True,
                       timeout=300, env=env)
  assert out.returncode == 1, out.stderr[-3000:]
  assert "DataError: Data dir" in out.stderr and "lacks 'train.tsv'" in out.stderr
  assert ("Traceback (most recent call last)" in out.stderr) == traceback
