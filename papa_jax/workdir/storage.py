"""Workdir file access on a local disk or object storage (`gs://`, `s3://`), through `epath`.

Local paths keep plain `os` calls (and their exact errors). Remote paths go
through `etils.epath` (fsspec or tf.io.gfile, as orbax uses). `atomic_write`
never lets a reader see a partial file: locally a temporary file is fsynced
and renamed into place; remotely the whole content is buffered in memory and
stored in one object put (object stores publish an object only when its
upload completes), so a killed run leaves the previous object, or none.

The first access to a bucket runs `preflight` (once per bucket and process): the
filesystem package is there and the endpoint answers within `PROBE_SECONDS`, else
one `StorageError` line names the path, the credentials found and how to test
offline (without it, gcsfs retries for a minute and ends in library tracebacks).
An emulator endpoint (`STORAGE_EMULATOR_HOST`, `AWS_ENDPOINT_URL`...) or a test's
in-memory filesystem skips the network probe. A credential refused on first access
is the same kind of line.
"""

from __future__ import annotations

import contextlib
import glob as glob_lib
import importlib
import importlib.util
import io
import os
import shutil
import socket
import threading
from typing import IO, Any, Iterator

import fsspec
from etils import epath

from papa_jax.errors import PapaError, StorageError

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


# Per scheme: the fsspec package, the public endpoint, the variables that point it elsewhere
# (an emulator or a private server: not probed), where credentials come from, and how to test
# without the network.
_SCHEMES = {"gcs": "gs", "s3a": "s3"}
PACKAGES = {"gs": "gcsfs", "s3": "s3fs"}
ENDPOINTS = {"gs": ("storage.googleapis.com", 443), "s3": ("s3.amazonaws.com", 443)}
EMULATOR_ENV = {"gs": ("STORAGE_EMULATOR_HOST",),
                "s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "FSSPEC_S3_ENDPOINT_URL")}
OFFLINE = {
    "gs": "point STORAGE_EMULATOR_HOST at a local GCS emulator (as tests/gcs_emulator_test.py "
          "does)",
    "s3": "point AWS_ENDPOINT_URL at a local S3 server (moto_server, MinIO)"}
PROBE_SECONDS = 4.0
_ready: set[tuple[str, str]] = set()  # (scheme, bucket) that passed `preflight`.


def _scheme_bucket(path: str) -> tuple[str, str]:
  scheme, rest = os.fspath(path).split("://", 1)
  return _SCHEMES.get(scheme.lower(), scheme.lower()), rest.split("/", 1)[0]


def _connects(host: str, port: int, seconds: float) -> str | None:
  """None if a TCP connection to host:port opens within `seconds`, else why not.

  The name lookup ignores socket timeouts, so both run in a daemon thread that is
  left behind, not waited for, when it takes longer.
  """
  outcome: list[str | None] = []

  def connect() -> None:
    try:
      socket.create_connection((host, port), timeout=seconds).close()
      outcome.append(None)
    except OSError as e:
      outcome.append(str(e) or type(e).__name__)
  probe = threading.Thread(target=connect, daemon=True, name="papa-storage-probe")
  probe.start()
  probe.join(seconds)
  return outcome[0] if outcome else f"no answer within {seconds:.0f} s"


def _endpoint(scheme: str) -> tuple[str, int]:
  """Where a connection to `scheme`'s store goes first: its endpoint, or the HTTPS proxy."""
  host, port = ENDPOINTS[scheme]
  if scheme == "s3":
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    host = f"s3.{region}.amazonaws.com" if region else host
  proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
  no_proxy = (os.environ.get("NO_PROXY") or os.environ.get("no_proxy") or "").split(",")
  if proxy and not any(n.strip() and host.endswith(n.strip().lstrip("*")) for n in no_proxy):
    netloc = proxy.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    name, _, number = netloc.rpartition(":")
    return (name, int(number)) if number.isdigit() else (netloc, 80)
  return host, port


def credentials(scheme: str) -> str:
  """The credential sources of `scheme` and whether each is there, for an error message."""
  home = os.path.expanduser("~")
  if scheme == "gs":
    gac = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    adc = os.path.join(os.environ.get("CLOUDSDK_CONFIG") or os.path.join(home, ".config",
                       "gcloud"), "application_default_credentials.json")
    return "; ".join((
        "GOOGLE_APPLICATION_CREDENTIALS " + (
            f"= {gac} ({'present' if os.path.exists(gac) else 'missing'})" if gac else "unset"),
        f"{adc} {'present' if os.path.exists(adc) else 'absent'}",
        "the GCE metadata server: " + ("this is a GCE machine" if _on_gce() else
                                       "not a GCE machine")))
  if scheme == "s3":
    shared = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws",
                                                                           "credentials")
    return "; ".join([f"{v} {'set' if os.environ.get(v) else 'unset'}"
                      for v in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE")] +
                     [f"{shared} {'present' if os.path.exists(shared) else 'absent'}"])
  return "none known"


def _on_gce() -> bool:
  """Whether this is a Google Compute Engine machine (whose metadata server gives
  credentials), as google-auth tells without the network: by the DMI product name."""
  if os.environ.get("GCE_METADATA_HOST"):
    return True
  try:
    with io.open("/sys/class/dmi/id/product_name", encoding="utf-8") as f:
      return f.read().startswith("Google")
  except OSError:
    return False


def _offline(scheme: str) -> str:
  return (f"To test offline, give a local --workdir (and local data), or "
          f"{OFFLINE.get(scheme, 'use a local path')}.")


def _in_memory(scheme: str) -> bool:
  """Whether `scheme` is registered to a filesystem that is not its network one (a test's
  in-memory store)."""
  cls = fsspec.registry.get(scheme)
  return cls is not None and cls.__module__.split(".")[0] != PACKAGES[scheme]


def preflight(path: str) -> None:
  """Checks once per bucket that the object store of `path` can be reached.

  Raises:
    StorageError: its filesystem package is not installed, or its endpoint does not answer
      within `PROBE_SECONDS` (one line naming `path`, the credentials found and how to test
      offline). A bucket that passed is not checked again in this process; one that failed
      is, on its next use.
  """
  scheme, bucket = _scheme_bucket(path)
  if (scheme, bucket) in _ready or scheme not in PACKAGES:
    return
  if not _in_memory(scheme):
    package = PACKAGES[scheme]
    tf_gcs = scheme == "gs" and importlib.util.find_spec("tensorflow") is not None
    if not tf_gcs:  # epath reads gs:// through tf.io.gfile when TensorFlow is installed.
      try:
        importlib.import_module(package)
      except ImportError as e:
        raise StorageError(f"{path} needs {package}: pip install {package} ({e}).") from None
    endpoint = fsspec.config.conf.get(scheme, {}).get("endpoint_url")
    if not endpoint and not any(os.environ.get(v) for v in EMULATOR_ENV[scheme]):
      host, port = _endpoint(scheme)
      why = _connects(host, port, PROBE_SECONDS)
      if why is not None:
        raise StorageError(
            f"Cannot reach {path}: {host}:{port} does not answer ({why}). Credentials "
            f"checked: {credentials(scheme)}. {_offline(scheme)}")
  _ready.add((scheme, bucket))


def _refused(e: BaseException) -> bool:
  """Whether `e` is a store's refusal of credentials (none, expired, or not allowed)."""
  name, module = type(e).__name__, type(e).__module__.split(".")
  return (isinstance(e, PermissionError) or module[:2] == ["google", "auth"]
          or (isinstance(e, OSError) and str(e).startswith("Forbidden"))  # gcsfs: 403.
          or (name == "HttpError" and getattr(e, "code", None) in (401, 403))
          or (module[0] == "botocore" and "Credentials" in name))


@contextlib.contextmanager
def _remote(path: str) -> Iterator[epath.Path]:
  """`path` as an `epath.Path`, after `preflight`; a refused credential raises one
  `StorageError` line."""
  preflight(path)
  try:
    yield epath.Path(path)
  except StorageError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    if not _refused(e):
      raise
    scheme = _scheme_bucket(path)[0]
    raise StorageError(
        f"{path}: access refused ({type(e).__name__}: {' '.join(str(e).split())[:200]}). "
        f"Credentials checked: {credentials(scheme)}. {_offline(scheme)}") from e


@contextlib.contextmanager
def access(path: str) -> Iterator[None]:
  """What `_remote` does around a call made outside `epath` (a conditional write)."""
  with _remote(path):
    yield


def exists(path: str) -> bool:
  if is_local(path):
    return os.path.exists(path)
  with _remote(path) as p:
    return p.exists()


def isdir(path: str) -> bool:
  if is_local(path):
    return os.path.isdir(path)
  with _remote(path) as p:
    return p.is_dir()


def isfile(path: str) -> bool:
  return exists(path) and not isdir(path)


def makedirs(path: str) -> None:
  if is_local(path):
    os.makedirs(path, exist_ok=True)
  else:
    with _remote(path) as p:
      p.mkdir(parents=True, exist_ok=True)


def listdir(path: str) -> list[str]:
  """Names (not paths) in the folder `path`."""
  if is_local(path):
    return os.listdir(path)
  with _remote(path) as folder:
    return [p.name for p in folder.iterdir()]


def glob(pattern: str) -> list[str]:
  """Paths matching `pattern`, sorted."""
  if is_local(pattern):
    return sorted(glob_lib.glob(pattern))
  scheme, rest = pattern.split("://", 1)
  parts = rest.split("/")
  first = next((i for i, p in enumerate(parts) if glob_lib.has_magic(p)), len(parts))
  with _remote(f"{scheme}://" + "/".join(parts[:first])) as root:
    if first == len(parts):
      return [pattern] if root.exists() else []
    return sorted(str(p) for p in root.glob("/".join(parts[first:]))) if root.exists() else []


def open(path: str, mode: str = "r", **kwargs: Any) -> IO:  # pylint: disable=redefined-builtin
  """Opens `path` for reading (writes go through `atomic_write`)."""
  if is_local(path):
    return io.open(path, mode, **kwargs)
  with _remote(path) as p:
    return p.open(mode.replace("t", ""))


def read_text(path: str) -> str:
  with open(path) as f:
    return f.read()


def remove(path: str) -> None:
  """Deletes the file `path`, if it exists."""
  with contextlib.suppress(FileNotFoundError):
    if is_local(path):
      os.remove(path)
    else:
      with _remote(path) as p:
        p.unlink(missing_ok=True)


def rmtree(path: str) -> None:
  """Deletes the folder `path` and everything in it, if it exists."""
  if is_local(path):
    shutil.rmtree(path, ignore_errors=True)
    return
  with _remote(path) as p:
    if p.exists():
      p.rmtree(missing_ok=True)


def put(path: str, data: bytes) -> None:
  """Stores `data` as the object `path` in one write (remote paths only)."""
  with _remote(path) as p, p.open("wb") as f:
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
    with _remote(path) as p:
      p.parent.mkdir(parents=True, exist_ok=True)
    put(path, data)
  except StorageError:
    raise
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
