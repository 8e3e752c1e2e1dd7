"""Workdir file access on a local disk or object storage (`gs://`, `s3://`), through `epath`.

Local paths keep plain `os` calls (and their exact errors). Remote paths go
through `etils.epath` (fsspec or tf.io.gfile, as orbax uses). `atomic_write`
never lets a reader see a partial file: locally a temporary file is fsynced
and renamed into place; remotely the whole content is buffered in memory and
stored in one object put (object stores publish an object only when its
upload completes), so a killed run leaves the previous object, or none.
"""

from __future__ import annotations

import contextlib
import glob as glob_lib
import io
import os
import shutil
from typing import IO, Any, Iterator

import fsspec
from etils import epath

from papa_jax.errors import PapaError

# Other processes (hosts, suite shards) write the same workdir. gcsfs and s3fs keep every
# folder listing forever by default and answer `exists` and a file's size from it, so a
# lease or results.json another process wrote after a listing looked absent, or was read
# cut to its old size (a truncated lease reads as none: a live run's lease taken over).
# Ask the store each time (fsspec applies this to each new filesystem of the protocol).
for _protocol in ("gs", "gcs", "s3", "s3a"):
  fsspec.config.conf.setdefault(_protocol, {}).setdefault("use_listings_cache", False)


class WriteError(PapaError, OSError):
  """A result or checkpoint could not be written (a full disk, say); nothing was lost."""


def write_failed(path: str, e: OSError) -> WriteError:
  return WriteError(e.errno, f"Could not write {path} ({e.strerror or e}). The previous "
                    "version, if any, is intact and loadable: free disk space (or fix the "
                    "path) and rerun the same command to resume.")


def is_local(path: str | os.PathLike) -> bool:
  """Whether `path` is on a local (or mounted) filesystem, not a `scheme://` URI."""
  return "://" not in os.fspath(path)


def exists(path: str) -> bool:
  return os.path.exists(path) if is_local(path) else epath.Path(path).exists()


def isdir(path: str) -> bool:
  return os.path.isdir(path) if is_local(path) else epath.Path(path).is_dir()


def isfile(path: str) -> bool:
  return exists(path) and not isdir(path)


def makedirs(path: str) -> None:
  if is_local(path):
    os.makedirs(path, exist_ok=True)
  else:
    epath.Path(path).mkdir(parents=True, exist_ok=True)


def listdir(path: str) -> list[str]:
  """Names (not paths) in the folder `path`."""
  return os.listdir(path) if is_local(path) else [p.name for p in epath.Path(path).iterdir()]


def glob(pattern: str) -> list[str]:
  """Paths matching `pattern`, sorted."""
  if is_local(pattern):
    return sorted(glob_lib.glob(pattern))
  scheme, rest = pattern.split("://", 1)
  parts = rest.split("/")
  first = next((i for i, p in enumerate(parts) if glob_lib.has_magic(p)), len(parts))
  root = epath.Path(f"{scheme}://" + "/".join(parts[:first]))
  if first == len(parts):
    return [pattern] if root.exists() else []
  return sorted(str(p) for p in root.glob("/".join(parts[first:]))) if root.exists() else []


def open(path: str, mode: str = "r", **kwargs: Any) -> IO:  # pylint: disable=redefined-builtin
  """Opens `path` for reading (writes go through `atomic_write`)."""
  if is_local(path):
    return io.open(path, mode, **kwargs)
  return epath.Path(path).open(mode.replace("t", ""))


def read_text(path: str) -> str:
  with open(path) as f:
    return f.read()


def remove(path: str) -> None:
  """Deletes the file `path`, if it exists."""
  with contextlib.suppress(FileNotFoundError):
    if is_local(path):
      os.remove(path)
    else:
      epath.Path(path).unlink(missing_ok=True)


def rmtree(path: str) -> None:
  """Deletes the folder `path` and everything in it, if it exists."""
  if is_local(path):
    shutil.rmtree(path, ignore_errors=True)
  elif epath.Path(path).exists():
    epath.Path(path).rmtree(missing_ok=True)


def put(path: str, data: bytes) -> None:
  """Stores `data` as the object `path` in one write (remote paths only)."""
  with epath.Path(path).open("wb") as f:
    f.write(data)


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", **open_kwargs: Any) -> Iterator[IO]:
  """Writes `path` so that a reader sees the old content or the new, never a part.

  On any error (a full disk included) nothing is published and the previous
  content of `path`, if any, is left untouched; an `OSError` becomes a
  `WriteError` that says so.
  """
  if not is_local(path):
    yield from _remote_write(path, mode, **open_kwargs)
    return
  directory = os.path.dirname(os.path.abspath(path))
  tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
  try:
    os.makedirs(directory, exist_ok=True)
    with io.open(tmp, mode, **open_kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    if isinstance(e, OSError) and not isinstance(e, WriteError):
      raise write_failed(path, e) from e
    raise


def _remote_write(path: str, mode: str, **open_kwargs: Any) -> Iterator[IO]:
  """The body of `atomic_write` on object storage: buffer, then one put."""
  binary = "b" in mode
  buf: IO = io.BytesIO() if binary else io.StringIO(newline=open_kwargs.get("newline"))
  yield buf
  data = buf.getvalue() if binary else buf.getvalue().encode(
      open_kwargs.get("encoding") or "utf-8")
  try:
    epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
    put(path, data)
  except OSError as e:
    raise write_failed(path, e) from e


def readable(path: str) -> str | IO[bytes]:
  """What `np.load` reads `path` from: the path itself if local, else its bytes in memory."""
  if is_local(path):
    return path
  with open(path, "rb") as f:
    return io.BytesIO(f.read())


def display(path: str) -> str:
  """`path` as shown to a reader: absolute if local, the URI itself if remote."""
  return os.path.abspath(path) if is_local(path) else path
