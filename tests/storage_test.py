"""Workdirs on object storage (`storage`, `lease`) against an in-memory `gs://`; a store
that cannot be reached (`storage.preflight`)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest

from papa_jax import preemption, reader, run
from papa_jax.config import schema as config_schema
from papa_jax.workdir import lease, storage, rules as workdir
from papa_jax.errors import ConfigError, StorageError
from tests import fake_gcs
from tests.launcher import MAIN, ROOT, launcher_env
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


# ---- a store that cannot be reached (`storage.preflight`) ----

OFFLINE_ENV = ("STORAGE_EMULATOR_HOST", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
               "FSSPEC_S3_ENDPOINT_URL", "HTTPS_PROXY", "https_proxy", "AWS_ACCESS_KEY_ID",
               "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION",
               "GOOGLE_APPLICATION_CREDENTIALS", "GCE_METADATA_HOST")


@pytest.fixture
def offline(monkeypatch, tmp_path):
  """No emulator, proxy or credential variables, no checked bucket, and ~ without config."""
  for name in OFFLINE_ENV:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
  monkeypatch.setattr(storage, "_ready", set())
  for scheme in ("gs", "s3"):
    monkeypatch.delitem(storage.fsspec.config.conf.get(scheme, {}), "endpoint_url",
                        raising=False)


def _closed_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]  # Closed once the socket is: a connection is refused.


@pytest.mark.unit
def test_unreachable_gcs_is_one_line_within_seconds_naming_the_credentials(offline,
                                                                          monkeypatch, tmp_path):
  """A name lookup that hangs (no network) is not waited for past `PROBE_SECONDS`."""
  pytest.importorskip("gcsfs")
  release = threading.Event()

  def hung_lookup(*args, **kwargs):
    release.wait(60)
    raise OSError("never answered")
  monkeypatch.setattr(socket, "create_connection", hung_lookup)
  monkeypatch.setattr(storage, "PROBE_SECONDS", 1.0)
  key = tmp_path / "key.json"
  key.write_text("{}")
  monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
  t0 = time.monotonic()
  try:
    with pytest.raises(StorageError) as e:
      workdir.prepare("gs://papa-jax-nonexistent/x")
  finally:
    release.set()
  assert time.monotonic() - t0 < 3
  msg = str(e.value)
  assert "\n" not in msg
  assert msg.startswith("Cannot reach gs://papa-jax-nonexistent/x: storage.googleapis.com:443 "
                        "does not answer (no answer within 1 s)")
  assert f"GOOGLE_APPLICATION_CREDENTIALS = {key} (present)" in msg
  assert f"{tmp_path}/gcloud/application_default_credentials.json absent" in msg
  assert "GCE metadata server" in msg
  assert "give a local --workdir" in msg and "STORAGE_EMULATOR_HOST" in msg


@pytest.mark.unit
def test_s3_without_s3fs_is_one_line(offline, monkeypatch):
  monkeypatch.setitem(sys.modules, "s3fs", None)  # As if not installed.
  t0 = time.monotonic()
  with pytest.raises(StorageError, match=r"^s3://bucket/x needs s3fs: pip install s3fs "):
    workdir.prepare("s3://bucket/x")
  assert time.monotonic() - t0 < 1


@pytest.mark.unit
def test_unreachable_s3_names_the_aws_credentials_and_an_offline_endpoint(offline,
                                                                         monkeypatch):
  monkeypatch.setitem(sys.modules, "s3fs", types.ModuleType("s3fs"))  # Installed.
  port = _closed_port()
  monkeypatch.setitem(storage.ENDPOINTS, "s3", ("127.0.0.1", port))
  monkeypatch.setenv("AWS_PROFILE", "research")
  with pytest.raises(StorageError) as e:
    storage.exists("s3://bucket/x/results.json")
  msg = str(e.value)
  assert msg.startswith(f"Cannot reach s3://bucket/x/results.json: 127.0.0.1:{port} does not "
                        "answer (")
  assert ("AWS_ACCESS_KEY_ID unset; AWS_PROFILE set; "
          f"{os.environ['HOME']}/.aws/credentials absent") in msg
  assert "AWS_ENDPOINT_URL at a local S3 server" in msg


@pytest.mark.unit
def test_preflight_skips_the_probe_for_an_emulator_and_runs_once_per_bucket(offline,
                                                                           monkeypatch):
  pytest.importorskip("gcsfs")
  probes = []
  monkeypatch.setattr(storage, "_connects", lambda *a: probes.append(a))  # Reachable.
  storage.preflight("gs://a/x")
  storage.preflight("gs://a/y/z")
  storage.preflight("gs://b")
  assert [p[:2] for p in probes] == [("storage.googleapis.com", 443)] * 2
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://localhost:1")
  storage.preflight("gs://c")
  assert len(probes) == 2


@pytest.mark.unit
def test_preflight_skips_an_in_memory_store(offline, gcs, monkeypatch):
  monkeypatch.setattr(storage, "_connects", lambda *a: pytest.fail("probed the fake store"))
  storage.put(f"{WD}/a.json", b"{}")
  assert storage.listdir(WD) == ["a.json"]


@pytest.mark.unit
@pytest.mark.parametrize("refusal", ["RefreshError", "Forbidden"])
def test_refused_credentials_are_one_line(gcs, monkeypatch, refusal):
  """What google-auth raises for an expired token, and gcsfs for a 403."""
  exceptions = pytest.importorskip("google.auth.exceptions")

  def refuse(*args, **kwargs):
    if refusal == "RefreshError":
      raise exceptions.RefreshError("invalid_grant: Token has been expired or revoked.")
    raise OSError("Forbidden: https://storage.googleapis.com/b/bucket/o\nno storage.objects")
  monkeypatch.setattr(fake_gcs.FakeGCS, "ls", refuse)
  monkeypatch.setattr(fake_gcs.FakeGCS, "_open", refuse)
  with pytest.raises(StorageError) as e:
    storage.listdir(WD)
  assert "\n" not in str(e.value)
  assert str(e.value).startswith(f"{WD}: access refused (")
  assert "Credentials checked: GOOGLE_APPLICATION_CREDENTIALS" in str(e.value)
  with pytest.raises(StorageError, match="access refused"):  # Not a full disk's WriteError.
    workdir.write_json(f"{WD}/config.json", {})


@pytest.mark.integration
@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_launcher_on_unreachable_object_storage_is_one_line_within_15_s(scheme, tmp_path):
  """As the bug report ran it: a `gs://` workdir with no network took 55 s and six library
  tracebacks; an `s3://` one without s3fs was a traceback."""
  package = storage.PACKAGES[scheme]
  installed = importlib.util.find_spec(package) is not None
  if installed and storage._connects(*storage.ENDPOINTS[scheme], 4) is None:
    pytest.skip(f"{storage.ENDPOINTS[scheme][0]} is reachable: this covers the offline case")
  env = {k: v for k, v in launcher_env().items() if k not in OFFLINE_ENV}
  env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
  wd = f"{scheme}://papa-jax-nonexistent/x"
  t0 = time.monotonic()
  out = subprocess.run([sys.executable, MAIN,
                        "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
                        f"--workdir={wd}"], capture_output=True, text=True, timeout=120, env=env)
  elapsed = time.monotonic() - t0
  assert out.returncode == 1, out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  want = f"StorageError: Cannot reach {wd}: " if installed else (
      f"StorageError: {wd} needs {package}: pip install {package}")
  lines = [l for l in out.stderr.splitlines() if "StorageError" in l]
  assert len(lines) == 1 and want in lines[0], out.stderr[-3000:]
  assert elapsed < 15, elapsed
