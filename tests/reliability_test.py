"""Reliability: kill -9 and resume, determinism, two-process means, launcher errors
(tests/multiprocess_test.py: whole runs over two processes).

These drive `launch/main.py` in subprocesses, exactly as a user would.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.launcher import MAIN, ROOT, distributed_flags, run_two_processes
from tests.launcher import STEPS_PER_EPOCH as STEPS
from tests.launcher import kill_when as _kill_when
from tests.launcher import launcher_env as _env
from tests.launcher import quickstart_args as _args
from tests.launcher import results as _results
from tests.launcher import run as _run
from tests.launcher import signal_when as _signal_when
from tests.testing import require_shared

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
  run_two_processes(lambda pid, port: _args(
      str(multi), str(tmp / "tfds"), ["--config.stage=means", *distributed_flags(port, pid)]))
  ref = np.load(wd / "means" / "means_raw.npz")
  got = np.load(multi / "means" / "means_raw.npz")
  assert json.loads(str(got["metadata"]))["num_examples"] == 480
  np.testing.assert_array_equal(ref["counts"], got["counts"])
  np.testing.assert_array_equal(ref["row_counts"], got["row_counts"])
  assert np.abs(ref["avgs"] - got["avgs"]).max() <= 1e-6
  for key in ("sums_sq", "sums_xlogx", "row_sums"):  # The controls' sums, same pass.
    np.testing.assert_allclose(got[key], ref[key], rtol=1e-5, atol=1e-4, err_msg=key)


@pytest.mark.parametrize("flag,message", [
    ("--config.probe.lerning_rate=1e-3", "did you mean --config.probe.learning_rate?"),
    ("--config.run.workdir=x", "--config.run.workdir: no such config field"),
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
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  assert not (tmp_path / "w").exists()  # Nothing was written.


@pytest.mark.parametrize("flag", ["--help", "--helpfull"])
def test_help_exits_zero_with_the_usage(flag):
  """Asked-for help is a success (absl's own status is 1); a bad flag above is not."""
  out = subprocess.run([sys.executable, MAIN, flag], capture_output=True, text=True,
                       timeout=120, env=_env())
  assert out.returncode == 0, out.stderr[-2000:]
  assert "--workdir" in out.stdout and "launch/main.py --config=" in out.stdout


def test_damaged_model_is_one_line(tmp_path):
  """A model folder whose config.json declares another architecture (a ModelFileError)."""
  model = tmp_path / "model"
  shutil.copytree(require_shared("fixtures", "tiny-random", "bert", "BertModel"), model)
  cfg = json.loads((model / "config.json").read_text())
  (model / "config.json").write_text(json.dumps(dict(cfg, model_type="gpt2")))
  out = subprocess.run([sys.executable, MAIN,
                        "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
                        f"--workdir={tmp_path / 'w'}", f"--config.model.name={model}"],
                       capture_output=True, text=True, timeout=300, env=_env())
  assert out.returncode == 1, out.stderr[-3000:]
  assert f"ModelFileError: config.json of {model}: Unsupported model_type 'gpt2'" in out.stderr

  assert "Traceback (most recent call last)" not in out.stderr


def test_unreachable_hub_model_is_one_line_saying_what_works_offline(tmp_path):
  """The README's own-model example names a hub id; offline it ends in one line."""
  out = subprocess.run([sys.executable, MAIN,
                        "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
                        f"--workdir={tmp_path / 'w'}", "--config.model.name=bert-base-uncased"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(_env(), HF_HUB_OFFLINE="1"))
  assert out.returncode == 1, out.stderr[-3000:]
  assert "ModelNotFound: Could not get 'bert-base-uncased' from the Hugging Face hub" in out.stderr
  assert "python -m papa_jax.convert.fetch KEY" in out.stderr
  assert "Traceback (most recent call last)" not in out.stderr


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
  assert "point PAPA_SHARED at the folder that holds data/" in out.stderr
  assert ("Traceback (most recent call last)" in out.stderr) == traceback
