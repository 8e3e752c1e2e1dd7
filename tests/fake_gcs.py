"""An in-memory `gs://` for tests: fsspec's memory filesystem behind `etils.epath`.

`epath.Path("gs://...")` uses fsspec's "gcs" filesystem when TensorFlow is not
installed; `install()` registers this one in its place (no network). Like GCS,
an object written here becomes visible only when its upload is closed, whole.
"""

from __future__ import annotations

import contextlib
import importlib
import io
from typing import Iterator

import fsspec
from etils.epath import backend as epath_backend
from fsspec.implementations import memory


class _Upload(io.BytesIO):
  """A write stream published as one object when closed (GCS's resumable upload)."""

  def __init__(self, fs: "FakeGCS", path: str):
    super().__init__()
    self.fs, self.path = fs, path

  def close(self) -> None:
    if not self.closed:
      self.fs.store[self.path] = memory.MemoryFile(self.fs, self.path, self.getvalue())
      self.fs.puts.append(self.path)
    super().close()


class FakeGCS(memory.MemoryFileSystem):
  """Object storage in memory: `gs://bucket/a/b` is the key `bucket/a/b`."""

  protocol = ("gs", "gcs")
  root_marker = ""

  def __init__(self, *args, **kwargs):
    kwargs.pop("finalize_on_close", None)
    super().__init__(*args, global_store=False, **kwargs)
    self.puts: list[str] = []  # Every object upload, in order.

  @classmethod
  def _strip_protocol(cls, path):
    path = str(path)
    for p in ("gs://", "gcs://"):
      if path.startswith(p):
        path = path[len(p):]
    return path.strip("/")

  def _open(self, path, mode="rb", **kwargs):
    if "w" in mode:
      return _Upload(self, self._strip_protocol(path))
    return super()._open(path, mode, **kwargs)


@contextlib.contextmanager
def install() -> Iterator[FakeGCS]:
  """`gs://` paths go to a fresh in-memory store while the block runs."""
  fsspec.register_implementation("gcs", FakeGCS, clobber=True)
  fsspec.register_implementation("gs", FakeGCS, clobber=True)
  cache = epath_backend.fsspec_backend._get_filesystem  # pylint: disable=protected-access
  cache.cache_clear()
  FakeGCS.clear_instance_cache()
  try:
    yield epath_backend.fsspec_backend.fs("gs://")
  finally:
    cache.cache_clear()
    FakeGCS.clear_instance_cache()
    for p in ("gcs", "gs"):
      importlib.import_module("fsspec.registry")._registry.pop(p, None)  # pylint: disable=protected-access
