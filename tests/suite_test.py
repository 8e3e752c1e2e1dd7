"""Experiment suites: cells, seeds, the report over finished workdirs, kill and rerun."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from configs import suite as suite_config
from papa_jax import commands, suite
from papa_jax.probing import features
from papa_jax.errors import ConfigError
from tests.testing import override, require_model, require_shared

pytestmark = pytest.mark.slow  # Whole suites end to end (one in a subprocess).

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The two smallest real checkpoints (fetched by .ci/run): SPLADE-tiny (4 heads, k = 0, 2, 4)
# and MiniLM-L3 (ONNX, 36 heads), as a two-model ladder.
A, B = "splade_tiny", "minilm_l3"
TINY = {"data.max_train_examples": 48, "data.max_eval_examples": 32, "run.batch_size": 16,
        "papa.fractions": (0.0, 0.5, 1.0), "probe.epochs": 1, "sort.epochs": 1,
        "sort.max_train_examples": -1, "run.log_every_steps": 2}


def tiny_suite(models=f"{A}+{B}", tasks="sst2"):
  c = suite_config.get_config(f"models={models},tasks={tasks},seeds=2")
  for t in c.suite.tasks:
    c.suite.max_length[t] = 32
    c.suite.data_dirs[t] = str(require_shared("data", {"ner": "conll2003"}.get(t, t)))
  return override(c, **TINY)


@pytest.fixture(scope="module")
def finished_suite(tmp_path_factory):
  require_model(A), require_model(B)
  path = str(tmp_path_factory.mktemp("suite") / "s")
  calls = []
  real = features.compute

  def counting(*args, **kwargs):
    calls.append(kwargs.get("desc", args[-1] if len(args) > 5 else ""))
    return real(*args, **kwargs)
  features.compute = counting
  try:
    paths = commands.main(tiny_suite(), path)
  finally:
    features.compute = real
  return path, paths, calls


def test_suite_runs_every_cell_and_writes_the_report(finished_suite):
  path, paths, _ = finished_suite
  assert sorted(os.listdir(path)) == sorted([f"{A}__sst2", f"{B}__sst2", "report"])
  for key in ("md", "json", "csv", "curves", "scatter"):
    assert os.path.exists(paths[key]), key
  rep = json.load(open(paths["json"]))
  assert len(rep["experiments"]) == 2
  for exp in rep["experiments"]:
    cell = os.path.join(path, f"{exp['model']}__sst2")
    rows = json.load(open(os.path.join(cell, "results.json")))["rows"]
    base = [r["score"] for r in rows if r["static_heads"] == 0]
    assert len(base) == 2  # Two seeds.
    assert exp["baseline"]["mean"] == pytest.approx(np.mean(base), abs=1e-12)
    assert exp["n_examples"] == 32 and exp["seeds"] == [42, 43]
  md = open(paths["md"]).read()
  assert B in md and "sst2" in md


def test_suite_seeds_give_different_probes_from_one_feature_pass(finished_suite):
  path, _, calls = finished_suite
  # 2 cells x 3 static-head sets x (train, eval): features once per set, not per
  # seed; the baseline's train features come from the raw means pass itself.
  assert len(calls) == 2 * (3 * 2 - 1)
  assert "features raw_k0 train" not in calls and calls.count("features raw_k0 eval") == 2
  cell = os.path.join(path, f"{A}__sst2", "probe")
  a = np.load(os.path.join(cell, "raw_k2_s42", "predictions.npz"))["logits"]
  b = np.load(os.path.join(cell, "raw_k2_s43", "predictions.npz"))["logits"]
  assert not np.allclose(a, b)  # Different probe seeds, different probes.


def test_suite_report_stage_alone_over_finished_workdirs(finished_suite, tmp_path):
  path, paths, _ = finished_suite
  again = suite.report_from_workdirs(
      sorted([os.path.join(path, f"{A}__sst2"), os.path.join(path, f"{B}__sst2")]),
      str(tmp_path / "r"))
  want = json.load(open(paths["json"]))
  got = json.load(open(again["json"]))
  assert got["experiments"] == want["experiments"]  # Deterministic, from saved predictions.
  one = suite.report_from_workdirs([os.path.join(path, f"{A}__sst2")], str(tmp_path / "one"))
  assert len(json.load(open(one["json"]))["experiments"]) == 1


def test_load_experiment_names_a_workdir_from_before_per_seed_results(finished_suite, tmp_path):
  path, _, _ = finished_suite
  cell = os.path.join(path, f"{A}__sst2")
  assert suite.load_experiment(cell).predictions  # The current layout loads.
  old = tmp_path / "old"
  old.mkdir()
  (old / "config.json").write_text(open(os.path.join(cell, "config.json")).read())
  res = json.load(open(os.path.join(cell, "results.json")))
  for r in res["rows"]:
    del r["seed"]
  (old / "results.json").write_text(json.dumps(res))
  with pytest.raises(ValueError, match=r"old/results.json: rows without a 'seed'"):
    suite.load_experiment(str(old))


def _suite_args(path):
  return [sys.executable, os.path.join(ROOT, "launch", "main.py"),
          "--config=" + os.path.join(ROOT, "configs", "suite.py") + f":models={A}+{B},"
          "tasks=sst2,seeds=2", f"--workdir={path}",
          f"--config.suite.data_dirs.sst2={require_shared('data', 'sst2')}",
          "--config.suite.max_length.sst2=32"] + [
              f"--config.{k}={v}".replace(" ", "") for k, v in TINY.items()]


def test_suite_killed_midway_finishes_the_rest_without_redoing(tmp_path):
  require_model(A), require_model(B)
  path = tmp_path / "s"
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  first = path / f"{A}__sst2" / "results.json"
  proc = subprocess.Popen(_suite_args(path), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=env)
  t0 = time.time()
  while not (path / f"{B}__sst2" / "means").exists():  # The second cell started.
    assert proc.poll() is None and time.time() - t0 < 600
    time.sleep(0.1)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert first.exists() and not (path / "report").exists()
  finished = sorted((path / f"{A}__sst2").glob("probe/*/result.json")) + [
      path / f"{A}__sst2" / "means" / "means_raw.npz"]
  done = [os.path.getmtime(p) for p in finished]
  out = subprocess.run(_suite_args(path), capture_output=True, text=True, env=env, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  assert [os.path.getmtime(p) for p in finished] == done  # Reused, not redone.
  assert "done before" in out.stderr and (path / "report" / "report.md").exists()
  assert (path / f"{B}__sst2" / "results.json").exists()


def test_suite_shards_partition_the_grid():
  c = suite_config.get_config("models=minilm+minilm_sre+splade_tiny,tasks=sst2+cola")
  every = suite.cells(c)
  parts = []
  for i in range(1, 4):
    c.suite.shard = f"{i}/3"
    parts.append(suite.shard_cells(c))
  assert sorted(sum(parts, [])) == sorted(every) and all(len(p) == 2 for p in parts)
  for bad in ("0/2", "3/2", "1", "a/b", "1/0"):
    c.suite.shard = bad
    with pytest.raises(ConfigError, match=r"suite.shard=.*use I/N"):
      suite.shard_cells(c)


def test_two_suite_shards_at_once_run_every_cell_once_and_report_as_one(finished_suite,
                                                                        tmp_path):
  """Shards 1/2 and 2/2 started together over one workdir: each cell runs once, in its
  shard, and the report the last shard writes equals the single-process suite's."""
  ref_path, ref_paths, _ = finished_suite
  path = tmp_path / "s"
  procs = [subprocess.Popen(_suite_args(path) + [f"--config.suite.shard={i}/2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
           for i in (1, 2)]
  logs = []
  for p in procs:
    _, err = p.communicate(timeout=1200)
    assert p.returncode == 0, err[-3000:]
    logs.append(err)
  assert f"{A} on sst2" in logs[0] and f"{B} on sst2" not in logs[0]
  assert f"{B} on sst2" in logs[1] and f"{A} on sst2" not in logs[1]
  assert sum("report over 2 experiments" in log for log in logs) >= 1
  for cell in (f"{A}__sst2", f"{B}__sst2"):
    got = json.load(open(path / cell / "results.json"))["rows"]
    want = json.load(open(os.path.join(ref_path, cell, "results.json")))["rows"]
    assert [(r["static_heads"], r["seed"], r["score"]) for r in got] == [
        (r["static_heads"], r["seed"], r["score"]) for r in want]
  got = json.load(open(path / "report" / "report.json"))["experiments"]
  want = json.load(open(ref_paths["json"]))["experiments"]
  assert got == want
