"""Workdirs on object storage (`storage`, `lease`) against an in-memory `gs://`."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from papa_jax import config_schema, lease, preemption, reader, run, storage, workdir
from papa_jax.errors import ConfigError
from tests import fake_gcs
from tests.testing import sigterm_during_batch, tiny_config

WD = "gs://bucket/wd"


@pytest.fixture
def gcs():
  with fake_gcs.install() as fs:
    yield fs


@pytest.mark.unit
def test_remote_atomic_write_publishes_the_whole_object_or_nothing(gcs):
  path = f"{WD}/means/means_raw.npz"
  with workdir.atomic_write(path, "wb") as f:
    np.savez(f, a=np.arange(3))
  old = storage.readable(path).getvalue()
  with pytest.raises(RuntimeError, match="killed"):
    with workdir.atomic_write(path, "wb") as f:
      f.write(b"PK-partial")
      assert storage.readable(path).getvalue() == old  # Readers see the old object.
      raise RuntimeError("killed mid-write")
  assert storage.readable(path).getvalue() == old and gcs.puts == ["bucket/wd/means/means_raw.npz"]
  with np.load(storage.readable(path)) as z:
    np.testing.assert_array_equal(z["a"], np.arange(3))
  workdir.write_json(f"{WD}/config.json", dict(a=1))
  assert workdir.read_json(f"{WD}/config.json") == dict(a=1)
  assert storage.glob(f"{WD}/*/means_*.npz") == [path]


@pytest.mark.unit
def test_remote_listing_and_removal(gcs):
  """What `bind` under `overwrite` and the suite's cell discovery use."""
  for name in ("means/means_raw.npz", "probe/raw_k1_s0/result.json", "results.json"):
    storage.put(f"{WD}/{name}", b"x")
  assert storage.listdir(WD) == ["means", "probe", "results.json"] and storage.isdir(WD)
  assert storage.glob(f"{WD}/probe/*_k*_s*/result.json") == [f"{WD}/probe/raw_k1_s0/result.json"]
  storage.rmtree(f"{WD}/probe")
  storage.remove(f"{WD}/results.json")
  storage.remove(f"{WD}/never-written.json")  # Missing: no error, like the local one.
  assert storage.listdir(WD) == ["means"] and not storage.exists(f"{WD}/probe")


@pytest.mark.unit
def test_remote_write_error_names_the_object(gcs, monkeypatch):
  def full(path, data):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(storage, "put", full)
  with pytest.raises(workdir.WriteError, match=r"gs://bucket/wd/x.json \(No space.*intact"):
    workdir.write_json(f"{WD}/x.json", {})
  assert not storage.exists(f"{WD}/x.json")


@pytest.mark.unit
def test_lease_refuses_a_second_holder_naming_it_and_is_released(gcs):
  with workdir.lock(WD, stale_seconds=60):
    held = lease.read(f"{WD}/.lock")
    with pytest.raises(workdir.WorkdirLocked, match=f"in use by another run \\(host "
                       f"{held['host']}, pid {held['pid']}, started {held['started']}"):
      with workdir.lock(WD, stale_seconds=60):
        pass
  assert not storage.exists(f"{WD}/.lock")


@pytest.mark.unit
def test_lease_takes_over_a_stale_lease_and_keeps_its_own_fresh(gcs, caplog):
  dead = dict(host="other", pid=1, started="2026-01-01T00:00:00", token="x",
              heartbeat=time.time() - 10)
  storage.put(f"{WD}/.lock", json.dumps(dead).encode())
  with lease.hold(f"{WD}/.lock", WD, stale_seconds=0.4, settle_seconds=0) as mine:
    assert "Taking over the stale lease" in caplog.text and "host other, pid 1" in caplog.text
    time.sleep(0.5)  # Two heartbeats: not stale although older than stale_seconds.
    now = lease.read(f"{WD}/.lock")
    assert now["token"] == mine["token"] and time.time() - now["heartbeat"] < 0.4


@pytest.mark.unit
def test_lease_of_a_live_run_whose_clock_runs_behind_is_not_taken_over(gcs):
  """Its heartbeats look 10 min old by this host's clock, but they keep coming: watched
  before a takeover, the lease is seen to change and refused (clocks were trusted before)."""
  stop = threading.Event()

  def live_but_behind():  # Heartbeat every 0.05 s, stamped by a clock 600 s slow.
    while not stop.is_set():
      storage.put(f"{WD}/.lock", json.dumps(dict(host="behind", pid=3, started="t", token="b",
                                                 heartbeat=time.time() - 600)).encode())
      stop.wait(0.05)
  beat = threading.Thread(target=live_but_behind, daemon=True)
  beat.start()
  try:
    time.sleep(0.1)
    with pytest.raises(workdir.WorkdirLocked, match="host behind, pid 3.*refreshed while "
                       "watched.*clocks differ"):
      with lease.hold(f"{WD}/.lock", WD, stale_seconds=0.4, settle_seconds=0):
        pass
  finally:
    stop.set()
    beat.join()
  assert lease.read(f"{WD}/.lock")["token"] == "b"  # Still the live run's.


@pytest.mark.unit
def test_lease_race_lost_during_settle_is_refused(gcs, monkeypatch):
  real = storage.put

  def racing_put(path, data):  # Another run writes its lease just after ours.
    real(path, data)
    real(path, json.dumps(dict(host="racer", pid=2, started="t", token="r",
                               heartbeat=time.time())).encode())
  monkeypatch.setattr(storage, "put", racing_put)
  with pytest.raises(workdir.WorkdirLocked, match="host racer, pid 2"):
    with lease.hold(f"{WD}/.lock", WD, settle_seconds=0):
      pass


@pytest.mark.unit
def test_feature_cache_must_be_local(tmp_path):
  c = tiny_config(tmp_path, **{"run.cache_dir": "gs://bucket/cache"})
  with pytest.raises(ConfigError, match="run.cache_dir='gs://bucket/cache' must be a local"):
    config_schema.validate(c)


@pytest.mark.slow
def test_means_stage_on_object_storage_resumes_after_preemption(tmp_path, gcs, monkeypatch):
  c = tiny_config(tmp_path, stage="means", **{"run.checkpoint_every_batches": 1})
  local = str(tmp_path / "local")
  run.run(c, local)
  with sigterm_during_batch(monkeypatch, 2):
    with pytest.raises(preemption.Preempted):
      run.run(c, WD)
  assert storage.exists(f"{WD}/means/means_raw.partial.npz")
  assert not storage.exists(f"{WD}/means/means_raw.npz")
  assert not storage.exists(f"{WD}/.lock")  # Released on the way out.
  with sigterm_during_batch(monkeypatch, 99) as added:
    run.run(c, WD)
  assert len(added) == 1  # 48 examples at 16 a batch: only the third batch was left.
  assert not storage.exists(f"{WD}/means/means_raw.partial.npz")
  with np.load(storage.readable(f"{WD}/means/means_raw.npz")) as z, \
      np.load(f"{local}/means/means_raw.npz") as ref:
    for k in ("avgs", "sums", "counts"):
      np.testing.assert_array_equal(z[k], ref[k])
  assert sorted(storage.listdir(WD)) == ["config.json", "inputs.json", "means"]
  read, ref = reader.read_workdir(WD), reader.read_workdir(local)  # What report/explore read.
  np.testing.assert_array_equal(read.means["raw"].sums, ref.means["raw"].sums)
