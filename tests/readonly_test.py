"""A finished workdir on a read-only mount: read without its lock, never written.

The mounts are real (a bind mount remounted read-only, through libc, so the kernel answers
EROFS as on a read-only NFS or container volume): root ignores file modes, so `chmod` could
not show it. Where mounting is not permitted the mount tests skip, and
`test_read_only_is_told_from_the_mount_flags` still covers the decision.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import papa_jax as pj
from papa_jax import commands, run
from papa_jax.workdir import rules as workdir
from papa_jax.errors import WorkdirError
from papa_jax.explorer import page
from papa_jax.papa import means as means_lib
from tests.launcher import MAIN, ROOT, launcher_env
from tests.testing import tiny_config

MS_RDONLY, MS_REMOUNT, MS_BIND, MNT_DETACH = 1, 32, 4096, 2


@pytest.fixture
def mount(tmp_path):
  """(src, ro): a folder, and the same folder mounted read-only."""
  src, ro = tmp_path / "src", tmp_path / "ro"
  src.mkdir()
  ro.mkdir()
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.mount(str(src).encode(), str(ro).encode(), None, MS_BIND, None) != 0:
    pytest.skip(f"cannot bind-mount here ({os.strerror(ctypes.get_errno())}): the mount "
                "tests need root in a container that allows mounts")
  try:
    if libc.mount(None, str(ro).encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None) != 0:
      pytest.skip(f"cannot remount read-only ({os.strerror(ctypes.get_errno())})")
    yield src, ro
  finally:
    libc.umount2(str(ro).encode(), MNT_DETACH)


def _finished(path) -> None:
  """A small finished workdir: its config, raw means and results."""
  (path / "means").mkdir()
  (path / "config.json").write_text(tiny_config(path).to_json_best_effort())
  state = means_lib.MeansState(np.ones((2, 3, 4, 4)), np.full((4, 4), 2.0), 2)
  means_lib.save_means(str(path / "means" / "means_raw.npz"), state, dict(task="sst2"))
  rows = [dict(variant="raw", static_heads=0, seed=42, score=0.75)]
  (path / "results.json").write_text(json.dumps(dict(rows=rows, summary=[], seeds=[42])))


@pytest.mark.unit
def test_stage_run_on_a_read_only_workdir_is_one_line_before_any_work(mount, tmp_path):
  src, ro = mount
  _finished(src)
  with pytest.raises(WorkdirError) as e:
    run.run(tiny_config(tmp_path, stage="means"), str(ro))
  msg = str(e.value)
  assert e.value.errno == errno.EROFS and "\n" not in msg
  assert msg.startswith(f"--workdir={ro} is on a read-only mount (EROFS). Its finished "
                        f"results can be read as they are (papa_jax.api.load_results('{ro}')")
  assert "give a writable --workdir to run stages" in msg
  with pytest.raises(WorkdirError, match=r"read-only mount \(EROFS\)"):
    workdir.prepare(str(ro))
  with pytest.raises(WorkdirError, match=r"read-only mount \(EROFS\)"):
    workdir.prepare(str(ro / "new"))  # Not there yet: its mkdir says the same.
  with pytest.raises(WorkdirError, match=r"read-only mount \(EROFS\)"):
    with workdir.lock(str(ro)):  # Taken without `prepare`: the lock file says the same.
      pass
  assert sorted(os.listdir(ro)) == ["config.json", "means", "results.json"]


@pytest.mark.unit
def test_results_of_a_read_only_workdir_load_through_the_api(mount):
  src, ro = mount
  _finished(src)
  res = pj.load_results(str(ro))
  assert res["rows"][0]["score"] == 0.75 and res["config"]["data"]["max_length"] == 32
  np.testing.assert_array_equal(res["means"]["raw"].avgs, np.full((2, 3, 4, 4), 0.5))


@pytest.mark.unit
def test_explore_reads_a_read_only_workdir_without_its_lock_and_writes_elsewhere(
    mount, tmp_path, monkeypatch):
  src, ro = mount
  _finished(src)
  written = []

  def write_explorer(wd, *, path, **kwargs):  # The page itself: tests/explorer_test.py.
    written.append((wd, path))
    with open(path, "w", encoding="utf-8") as f:
      f.write("<html>")
    return path
  monkeypatch.setattr(page, "write_explorer", write_explorer)
  out = tmp_path / "pages" / "explorer.html"
  out.parent.mkdir()
  commands.main(tiny_config(tmp_path, stage="explore", **{"explore.output": str(out)}), str(ro))
  assert written == [(str(ro), str(out))] and out.read_text() == "<html>"
  assert ".lock" not in os.listdir(ro)
  for output in ("explorer.html", str(ro / "explorer.html")):  # Under the workdir.
    with pytest.raises(WorkdirError, match=(
        rf"--workdir={ro} is on a read-only mount \(EROFS\), and explore writes its page to "
        rf"{ro}/explorer.html. Give --config.explore.output=/a/writable/folder/explorer.html")):
      commands.main(tiny_config(tmp_path, stage="explore", **{"explore.output": output}),
                    str(ro))
  assert len(written) == 1


@pytest.mark.unit
def test_report_on_a_read_only_workdir_says_how_to_write_it_elsewhere(mount, tmp_path):
  src, ro = mount
  _finished(src)
  with pytest.raises(WorkdirError) as e:
    commands.main(tiny_config(tmp_path, stage="report"), str(ro))
  msg = str(e.value)
  assert msg.startswith(f"--workdir={ro} is on a read-only mount (EROFS), and report writes "
                        f"{ro}/report. Write the report elsewhere from Python: "
                        "papa_jax.suite.report_from_workdirs(papa_jax.suite.finished_cells(")
  assert "\n" not in msg and not os.path.exists(ro / ".lock")


@pytest.mark.unit
def test_read_only_is_told_from_the_mount_flags(tmp_path, monkeypatch):
  """Without a mount: what `os.access` and `statvfs` answer on a read-only mount, and for a
  folder of another user (root is never refused, so both are emulated)."""
  assert workdir.read_only(str(tmp_path)) is None
  assert workdir.read_only(str(tmp_path / "absent")) is None
  assert workdir.read_only("gs://bucket/wd") is None
  monkeypatch.setattr(os, "access", lambda path, mode: False)
  monkeypatch.setattr(os, "statvfs", lambda path: types.SimpleNamespace(f_flag=os.ST_RDONLY))
  assert workdir.read_only(str(tmp_path)) == "on a read-only mount (EROFS)"
  with pytest.raises(WorkdirError, match="read-only mount"):
    workdir.prepare(str(tmp_path))
  monkeypatch.setattr(os, "statvfs", lambda path: types.SimpleNamespace(f_flag=0))
  assert workdir.read_only(str(tmp_path)) == "not writable by this user (EACCES)"


@pytest.mark.integration
def test_launcher_on_a_read_only_workdir_is_one_line(mount):
  src, ro = mount
  _finished(src)
  out = subprocess.run([sys.executable, MAIN,
                        "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
                        f"--workdir={ro}", "--config.stage=means"], capture_output=True,
                       text=True, timeout=300, env=launcher_env())
  assert out.returncode == 1, out.stderr[-3000:]
  assert f"WorkdirError: --workdir={ro} is on a read-only mount (EROFS)." in out.stderr
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
