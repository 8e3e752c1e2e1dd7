"""Runs over two JAX processes (gloo on localhost) against one process with the same mesh:
the analysis stages, the whole pipeline, and SIGTERM to one host. These drive
`launch/main.py` in subprocesses, exactly as a user would (the two-process means pass:
tests/reliability_test.py)."""

import json
import os
import sys

import numpy as np
import pytest

from tests.launcher import MAIN, ROOT, SMALL_MODEL, model_flag
from tests.launcher import distributed_flags as _distributed
from tests.launcher import launcher_env as _env
from tests.launcher import results as _results
from tests.launcher import run as _run
from tests.launcher import run_two_processes as _run_two_processes
from tests.launcher import stopped_at as _stopped_at
from tests.launcher import two_processes_signal_one as _two_processes_signal_one
from tests.testing import require_model, require_shared

pytestmark = pytest.mark.slow  # Several processes at once, each a whole run.


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


def _small_run(workdir, *flags):
  """The quickstart on a small SST-2 subset (32 tokens, one sorting epoch, two probe epochs),
  with `flags` on top."""
  return [sys.executable, MAIN, "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
          f"--workdir={workdir}", model_flag(),
          f"--config.data.data_dir={require_shared('data', 'sst2')}",
          "--config.data.max_length=32", "--config.data.max_eval_examples=40",
          "--config.run.batch_size=16", "--config.sort.epochs=1", "--config.probe.epochs=2",
          *flags]


def _pipeline_args(workdir, extra=()):
  """Every stage on a small run: means, sort (a half-heads fraction), cached probes."""
  return _small_run(workdir, "--config.data.max_train_examples=96",
                    "--config.papa.fractions=(0.0,0.5,1.0)", "--config.papa.seeds=(1,2)",
                    "--config.papa.orderings=lambda,gradient",
                    "--config.sort.max_train_examples=-1", *extra)


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
    return _small_run(workdir, "--config.data.max_train_examples=480",
                      "--config.papa.fractions=(0.0,1.0)", "--config.papa.seeds=(1,)",
                      "--config.sort.max_train_examples=64", "--config.effective.split=train",
                      "--config.effective.max_examples=480",
                      "--config.run.checkpoint_every_batches=1",
                      "--config.run.checkpoint_every_steps=2", *extra)

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
  # SPLADE-tiny's effective pass is quick (30 batches in about 3 s): the hosts agree every 2
  # batches there, so a signal sent at the first partial lands mid-pass even on a busy machine.
  rcs, logs = _two_processes_signal_one(
      args(["--config.stage=effective", "--config.run.distributed.preemption_check_every=2"]),
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


def test_multiprocess_optimal_constants_equal_single_process(tmp_path):
  """The loss-optimal constants' fit and the probes on them from two processes (one device
  each) equal one process with two devices (the same mesh): the fit's held-out losses, the
  constants it chose and every probe score."""
  require_model(SMALL_MODEL)
  one, two = tmp_path / "one", tmp_path / "two"
  flags = ("--config.data.max_train_examples=64", "--config.papa.fractions=(0.0,1.0)",
           "--config.papa.seeds=(1,)", "--config.papa.variants=raw,optimal",
           "--config.sort.max_train_examples=-1", "--config.optimal.epochs=2")
  _run(_small_run(one, *flags), env=_env(devices=2), timeout=900)
  _run_two_processes(lambda pid, port: _small_run(two, *flags, *_distributed(port, pid)))
  rows_a, res_a = _results(one)
  rows_b, res_b = _results(two)
  assert rows_a == rows_b and any("optimal" in str(r) for r in rows_a), rows_a
  assert res_b["processes"] == 2
  for ra, rb in zip(res_a["rows"], res_b["rows"]):
    assert ra["score"] == pytest.approx(rb["score"], abs=1e-6), (ra["run"], rb["run"])
  sa, sb = (np.load(w / "optimal" / "selection.npz") for w in (one, two))
  ra, rb = json.loads(str(sa["record"])), json.loads(str(sb["record"]))
  assert len(ra["held_out_loss"]) == 3  # The mean it starts at, then two epochs.
  for key in ("train_loss", "held_out_loss"):
    np.testing.assert_allclose(rb[key], ra[key], rtol=1e-5, err_msg=key)
  np.testing.assert_allclose(sb["logits"], sa["logits"], atol=1e-5)
  np.testing.assert_allclose(np.load(two / "means" / "means_optimal.npz")["avgs"],
                             np.load(one / "means" / "means_optimal.npz")["avgs"], atol=1e-6)
