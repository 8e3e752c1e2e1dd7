"""The workdir: binding, one run at a time, atomic writes that survive a full disk."""

import errno
import json
import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from configs import quickstart
from papa_jax import registry
from papa_jax.workdir import checkpoint, resume, storage, rules as workdir
from papa_jax.probing import features
from papa_jax.errors import ConfigError, StorageError
from papa_jax.workdir.layout import Layout
from papa_jax.papa import means as means_lib


@pytest.mark.unit
def test_invalid_workdir_that_is_a_file(tmp_path):
  path = tmp_path / "results.txt"
  path.write_text("x")
  with pytest.raises(ConfigError, match="exists and is not a directory"):
    workdir.prepare(str(path))


@pytest.mark.unit
def test_prepare_passes_a_storage_error_on_whole(monkeypatch):
  """A store that refuses the mkdir says so itself, not as 'Cannot create --workdir'."""
  def refused(path):
    raise StorageError(f"{path}: access refused (RefreshError: expired).")
  monkeypatch.setattr(storage, "exists", lambda path: False)
  monkeypatch.setattr(storage, "makedirs", refused)
  with pytest.raises(StorageError, match=r"^gs://b/wd: access refused") as e:
    workdir.prepare("gs://b/wd")
  assert not isinstance(e.value, ConfigError)


@pytest.mark.unit
def test_workdir_without_finished_work_is_not_bound(tmp_path):
  a, b = quickstart.get_config(), quickstart.get_config()
  b.data.data_dir = "/fixed/path"
  bind = lambda c: workdir.bind(c, str(tmp_path), finished=registry.finished_outputs())
  bind(a)
  bind(b)  # No finished work yet: rebinding is fine.
  assert json.load(open(tmp_path / "config.json"))["data"]["data_dir"] == "/fixed/path"
  (tmp_path / "means").mkdir()
  (tmp_path / "means" / "means_raw.partial.npz").write_bytes(b"")
  bind(a)  # Partial sums are not finished work either.
  (tmp_path / "means" / "means_raw.npz").write_bytes(b"")
  with pytest.raises(ConfigError, match="different config.*data.data_dir"):
    bind(b)


_HOLD = """
import sys, time
sys.path.insert(0, {root!r})
from papa_jax.workdir import rules as workdir
with workdir.lock({wd!r}):
  print("locked", flush=True)
  time.sleep(600)
"""


@pytest.mark.integration
def test_lock_second_run_is_refused_naming_the_first_then_stale_lock_taken_over(tmp_path,
                                                                                caplog):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  holder = subprocess.Popen([sys.executable, "-c", _HOLD.format(root=root, wd=str(tmp_path))],
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(workdir.WorkdirLocked, match=rf"in use by another run \(host .*, pid "
                       rf"{holder.pid}, started "):
      with workdir.lock(str(tmp_path)):
        pass
  finally:
    holder.kill()  # SIGKILL: the lock file still names the dead run.
    holder.wait()
  assert str(holder.pid) in pathlib.Path(Layout(str(tmp_path)).lock).read_text()
  with caplog.at_level("WARNING"):
    with workdir.lock(str(tmp_path)):
      assert str(os.getpid()) in pathlib.Path(Layout(str(tmp_path)).lock).read_text()
  assert "stale lock" in caplog.text and str(holder.pid) in caplog.text
  with workdir.lock(str(tmp_path)):  # Released cleanly: no warning the second time.
    pass


class _FullDisk:
  """A file object that accepts `limit` bytes, then fails as a full disk does."""

  def __init__(self, f, limit):
    self.f, self.limit = f, limit

  def write(self, data):
    if self.f.tell() + len(data) > self.limit:
      self.f.write(data[: max(0, self.limit - self.f.tell())])
      raise OSError(errno.ENOSPC, "No space left on device")
    return self.f.write(data)

  def __getattr__(self, name):
    return getattr(self.f, name)


def _fill_disk_after(monkeypatch, limit):
  real = workdir.atomic_write.__wrapped__

  def failing(path, mode="w", **kw):
    gen = real(path, mode, **kw)
    f = next(gen)
    try:
      yield _FullDisk(f, limit)
    except BaseException as e:
      gen.throw(e)
    else:
      next(gen, None)
  monkeypatch.setattr(workdir, "atomic_write", workdir.contextlib.contextmanager(failing))


@pytest.mark.unit
def test_full_disk_while_writing_means_leaves_the_last_good_state(tmp_path, monkeypatch):
  path = str(tmp_path / "means_raw.partial.npz")
  resume.save(path, "key", 5, {"sum/attention": np.ones((2, 3, 4, 4))})
  _fill_disk_after(monkeypatch, 100)
  later = means_lib.MeansState(np.full((2, 3, 4, 4), 2.0), np.ones((4, 4)), 144)
  with pytest.raises(workdir.WriteError, match="means_raw.partial.npz.*No space left.*intact"):
    resume.save(path, "key", 9, {"sum/attention": later.sums})
  with pytest.raises(workdir.WriteError, match="means_raw.npz"):
    means_lib.save_means(str(tmp_path / "means_raw.npz"), later, {})
  back = resume.load(path, "key")
  assert back.position == 5 and np.all(back.arrays["sum/attention"] == 1.0)
  assert sorted(os.listdir(tmp_path)) == ["means_raw.partial.npz"]  # No temporary left.


@pytest.mark.unit
def test_full_disk_while_writing_results_json(tmp_path, monkeypatch):
  path = str(tmp_path / "result.json")
  workdir.write_json(path, {"score": 0.5})
  _fill_disk_after(monkeypatch, 5)
  with pytest.raises(workdir.WriteError, match="result.json"):
    workdir.write_json(path, {"score": 0.75, "more": list(range(100))})
  assert json.load(open(path)) == {"score": 0.5}


@pytest.mark.unit
def test_full_disk_while_writing_a_checkpoint(tmp_path, monkeypatch):
  ck = checkpoint.Checkpointer(str(tmp_path / "ck"))
  state = {"w": jnp.ones(4)}
  ck.save(10, state, dict(fingerprint="f", epoch=1))
  real_open = open

  def failing_open(file, mode="r", *args, **kwargs):
    if "w" in str(mode) and "/20" in str(file):
      raise OSError(errno.ENOSPC, "No space left on device")
    return real_open(file, mode, *args, **kwargs)
  monkeypatch.setattr("builtins.open", failing_open)  # Orbax's metadata files fail.
  with pytest.raises(workdir.WriteError, match="Could not write .*/20 .*No space left.*intact"):
    ck.save(20, {"w": jnp.full(4, 2.0)}, dict(fingerprint="f", epoch=2))
  ck.close()  # The disk stays full until orbax's background writers are done.
  monkeypatch.setattr("builtins.open", real_open)
  again = checkpoint.Checkpointer(str(tmp_path / "ck"))
  assert again.latest_step() == 10
  got, meta = again.restore(10, state, "f")
  assert meta["epoch"] == 1 and np.all(np.asarray(got["w"]) == 1.0)


@pytest.mark.unit
def test_full_disk_before_a_feature_cache_is_filled(tmp_path, monkeypatch):
  def no_space(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(os, "posix_fallocate", no_space)
  with pytest.raises(workdir.WriteError, match="No space left"):
    features._reserve(str(tmp_path / "f.npy.tmp-1"), (1000, 7, 64, 384), np.dtype("u2"))
  assert not os.listdir(tmp_path)


@pytest.mark.integration
def test_provenance_records_the_settings_that_change_numbers(monkeypatch):
  monkeypatch.delenv("PAPA_CPU_TUNING", raising=False)
  monkeypatch.setenv("PAPA_FUSED_ATTENTION", "0")
  p = workdir.provenance()
  assert p["env"] == {"PAPA_FUSED_ATTENTION": "0"} and p["fused_attention"] is False
  monkeypatch.setenv("PAPA_FUSED_ATTENTION", "1")
  monkeypatch.setenv("PAPA_CPU_TUNING", "off")
  p = workdir.provenance()
  assert p["env"] == {"PAPA_CPU_TUNING": "off", "PAPA_FUSED_ATTENTION": "1"}
  assert p["fused_attention"] is True and "xla_flags" in p and p["cpu"]["kind"]
