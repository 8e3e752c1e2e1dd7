"""The whole pipeline on a `gs://` workdir served by a local GCS emulator (no network).

The in-memory fake of `tests/storage_test.py` reaches only what goes through
`epath`; orbax writes checkpoint arrays through tensorstore, which speaks GCS's
JSON API itself. Here both talk HTTP to `gcp-storage-emulator`: gcsfs through
`STORAGE_EMULATOR_HOST`, tensorstore through `TENSORSTORE_GCS_HTTP_URL`, as
each library documents for testing. The launcher runs in subprocesses, as a
user starts it.

One gap of the emulator is filled here: GCS answers a media download with the
object's generation in an `x-goog-generation` header, which tensorstore reads
(and rejects as a malformed generation when absent); the emulator omits it.
The emulator also ignores preconditions (`ifGenerationMatch`), which a single
writer per object, as here, does not need; the lease's races are tested against
fake-gcs-server, which checks them (tests/lease_race_test.py).
"""

import contextlib
import importlib
import json
import signal
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from papa_jax.workdir import lease, storage, rules as workdir
from tests.launcher import PROBE_BATCH
from tests.launcher import STEPS_PER_EPOCH as STEPS
from tests.launcher import (
  free_port,
  launcher_env,
  quickstart_args,
  result_rows,
  results,
  run,
  signal_when,
)

pytestmark = pytest.mark.slow  # An emulator server; whole runs in subprocesses.

BUCKET = "bucket"
# Sorting and two probes (all heads input-dependent, half constant), each saving an
# orbax checkpoint per epoch (of STEPS steps).
SORT_EXAMPLES = 160
EXTRA = ("--config.papa.fractions=(0.0,0.5)", "--config.sort.epochs=2",
         f"--config.sort.max_train_examples={SORT_EXAMPLES}")


@pytest.fixture(scope="module")
def emulator():
  """A GCS emulator on a free local port with an empty bucket; yields its URL."""
  pytest.importorskip("gcsfs", reason="gs:// workdirs need gcsfs: pip install -e '.[test]'")
  server_lib = pytest.importorskip(
      "gcp_storage_emulator.server", reason="needs gcp-storage-emulator: pip install -e '.[test]'")
  objects = importlib.import_module("gcp_storage_emulator.handlers.objects")
  download = objects.download

  def download_with_generation(request, response, storage, *args, **kwargs):
    download(request, response, storage, *args, **kwargs)
    with contextlib.suppress(Exception):  # A missing object: download said so.
      obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
      response["x-goog-generation"] = obj["generation"]
      response["x-goog-metageneration"] = obj["metageneration"]

  objects.download = download_with_generation  # `objects.get` looks it up per call.
  port = free_port()
  server = server_lib.create_server("localhost", port, in_memory=True, default_bucket=BUCKET)
  server.start()
  try:
    yield f"http://localhost:{port}"
  finally:
    server.stop()
    objects.download = download


def _env(url: str) -> dict:
  return dict(launcher_env(), STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
              GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator")


def _objects(url: str, prefix: str) -> list[str]:
  """Names of the objects under `prefix`, as the emulator lists them."""
  query = urllib.parse.urlencode(dict(prefix=prefix))
  with urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}/o?{query}") as r:
    return [o["name"] for o in json.load(r).get("items", [])]


def _object_url(url: str, name: str) -> str:
  return f"{url}/storage/v1/b/{BUCKET}/o/{urllib.parse.quote(name, safe='')}"


def _read(url: str, name: str) -> bytes:
  with urllib.request.urlopen(_object_url(url, name) + "?alt=media") as r:
    return r.read()


def _delete(url: str, name: str) -> None:
  urllib.request.urlopen(urllib.request.Request(_object_url(url, name), method="DELETE")).close()


@pytest.fixture
def gs_here(emulator, monkeypatch):
  """This process's `gs://` (epath, gcsfs) on the emulator, with fresh filesystem objects."""
  gcsfs = pytest.importorskip("gcsfs")
  from etils.epath import backend  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
  cache = backend.fsspec_backend._get_filesystem  # pylint: disable=protected-access
  cache.cache_clear()
  gcsfs.GCSFileSystem.clear_instance_cache()
  yield
  cache.cache_clear()
  gcsfs.GCSFileSystem.clear_instance_cache()


def _upload(url: str, name: str, data: bytes) -> None:
  """Stores an object as another process would: straight to the emulator."""
  query = urllib.parse.urlencode(dict(uploadType="media", name=name))
  urllib.request.urlopen(urllib.request.Request(
      f"{url}/upload/storage/v1/b/{BUCKET}/o?{query}", data=data, method="POST",
      headers={"Content-Type": "application/octet-stream"})).close()


def test_objects_another_process_wrote_after_a_listing_are_seen_whole(emulator, gs_here):
  """gcsfs caches folder listings forever by default: a lease or results.json written by
  another host after this process listed the folder looked absent, or was read cut to the
  size the listing had (a truncated lease reads as none, so a live lease was taken over)."""
  wd = f"gs://{BUCKET}/shared/cell"
  storage.put(f"{wd}/results.json", b"{}")
  assert storage.listdir(wd) == ["results.json"]  # Listed, as a suite lists its cells.
  holder = dict(host="other", pid=7, started="t", token="x", heartbeat=time.time())
  _upload(emulator, "shared/cell/.lock", json.dumps(holder).encode())
  _upload(emulator, "shared/cell/results.json", b'{"rows": [1, 2, 3]}')
  assert storage.exists(f"{wd}/.lock") and lease.read(f"{wd}/.lock") == holder
  assert storage.read_text(f"{wd}/results.json") == '{"rows": [1, 2, 3]}'
  with pytest.raises(workdir.WorkdirLocked, match="host other, pid 7"):
    with workdir.lock(wd, stale_seconds=60):
      pass


def test_pipeline_on_gcs_resumes_after_sigkill_like_a_local_run(tmp_path, emulator):
  local = tmp_path / "local"
  run(quickstart_args(str(local), str(tmp_path / "tfds"), EXTRA))
  env = _env(emulator)
  args = quickstart_args(f"gs://{BUCKET}/wd", str(tmp_path / "tfds"), EXTRA)
  epoch2 = f"wd/probe/raw_k0_s42/checkpoints/{2 * STEPS}/commit_success.txt"

  # 1. Killed in the baseline probe's third epoch, after its epoch-2 checkpoint committed.
  status, _ = signal_when(args, lambda: epoch2 in _objects(emulator, "wd/probe/"), env=env)
  assert status == -signal.SIGKILL
  names = _objects(emulator, "wd/")
  # The sorting run finished on gs:// (2 epochs, an orbax step each) and ranked the heads as
  # the local run did.
  sort_steps = 2 * SORT_EXAMPLES // PROBE_BATCH
  assert f"wd/sort/checkpoints/{sort_steps}/commit_success.txt" in names
  assert json.loads(_read(emulator, "wd/sort/sorted_heads.json")) == json.loads(
      (local / "sort" / "sorted_heads.json").read_text())
  assert "wd/results.json" not in names and "wd/.lock" in names  # Died holding its lease.

  # 2. The dead run's lease refuses a new run, naming the holder, until it is stale.
  held = json.loads(_read(emulator, "wd/.lock"))
  out = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
  assert out.returncode == 1, out.stderr[-3000:]
  assert f"in use by another run (host {held['host']}, pid {held['pid']}" in out.stderr

  # 3. A kill while orbax wrote epoch 2's step: on GCS a step counts once its
  # commit_success.txt is there (no rename), so without it the step is not resumed from.
  _delete(emulator, epoch2)
  time.sleep(2)
  out = run([*args, "--config.run.lease_stale_seconds=1"], env=env)
  assert "Taking over the stale lease" in out.stderr
  assert "resumed after epoch 1" in out.stderr  # Not after the uncommitted epoch 2.

  # 4. Same scores as the local run; the lease is gone.
  got = json.loads(_read(emulator, "wd/results.json"))
  ref_rows, _ = results(str(local))
  assert result_rows(got) == ref_rows
  assert "wd/.lock" not in _objects(emulator, "wd/")

  # 5. An analysis stage and the explorer read that workdir and write beside it.
  run([*args, "--config.stage=effective", "--config.effective.max_examples=16"], env=env)
  run([*args, "--config.stage=explore"], env=env)
  names = _objects(emulator, "wd/")
  assert {"wd/effective/stats.json", "wd/effective/stats.csv", "wd/explorer.html"} <= set(names)
  assert json.loads(_read(emulator, "wd/effective/stats.json"))
