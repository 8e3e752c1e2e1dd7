"""Conditional writes of one small `gs://` object, through gcsfs's session (GCS's JSON API).

A write is a multipart upload with `ifGenerationMatch`: 0 creates the object only where
there is none, a generation number replaces only that generation. The store checks the
condition and stores the object in one step, so of two writers racing on one generation
exactly one succeeds; the other gets HTTP 412 (`write` returns None). A delete carries the
same condition. (fake-gcs-server, the emulator of tests/lease_race_test.py, checks it on
multipart uploads, not on deletes; gcp-storage-emulator checks it nowhere.)

`stat` dates an object by the store's own clock: the HTTP `Date` of its answer minus the
object's `updated` time, never this host's clock. `Date` has whole seconds, rounded down,
so an age reads up to 1 s short (and a fresh object's as 0, not less).

Only gcsfs is used here (the `gcs` extra); `filesystem` is None where it is not what
fsspec serves `gs://` with (a test's in-memory store), and for other schemes.
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import json
import uuid
from typing import Any

import fsspec

from papa_jax.workdir import storage

ATTEMPTS = 3  # Reads of an object that is replaced between its metadata and its content.


@dataclasses.dataclass(frozen=True)
class Version:
  """One generation of an object: its number, content and age by the store's clock."""
  generation: int
  data: bytes
  age: float


def filesystem(path: str) -> Any | None:
  """gcsfs's filesystem for the `gs://` path `path`, or None (not `gs://`, or not gcsfs)."""
  if path.split("://", 1)[0].lower() not in ("gs", "gcs"):
    return None
  try:
    cls = fsspec.get_filesystem_class("gs")
  except ImportError:  # No gcsfs: epath reads gs:// through TensorFlow.
    return None
  if cls.__module__.split(".")[0] != "gcsfs":
    return None
  with storage.access(path):
    return fsspec.filesystem("gs")


def age(date: str | None, updated: str) -> float:
  """Seconds from `updated` (RFC 3339: the object's time) to `date` (an HTTP `Date`: the
  store's now); 0 without a `Date` (the object counts as just written)."""
  if not date:
    return 0.0
  now = email.utils.parsedate_to_datetime(date)
  return max(0.0, (now - datetime.datetime.fromisoformat(updated)).total_seconds())


def stat(fs: Any, path: str) -> Version | None:
  """The object `path` now (None if there is none)."""
  bucket, key, _ = fs.split_path(path)
  for _ in range(ATTEMPTS):
    with storage.access(path):
      try:
        headers, body = fs.call("GET", "b/{}/o/{}", bucket, key)
      except FileNotFoundError:
        return None
      meta = json.loads(body)
      try:
        _, data = fs.call("GET", "b/{}/o/{}", bucket, key, alt="media",
                          generation=meta["generation"])
      except FileNotFoundError:  # Replaced (or deleted) since: look again.
        continue
    return Version(int(meta["generation"]), data, age(headers.get("Date"), meta["updated"]))
  return None  # Replaced at every look: as if none (a create then fails, and looks again).


def write(fs: Any, path: str, data: bytes, if_generation: int) -> int | None:
  """Stores `data` as the object `path` if its generation is `if_generation` (0: if there
  is no object); its new generation, or None where the condition failed (HTTP 412)."""
  bucket, key, _ = fs.split_path(path)
  boundary = uuid.uuid4().hex
  meta = json.dumps(dict(name=key))
  body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{meta}\r\n"
          f"--{boundary}\r\nContent-Type: application/json\r\n\r\n").encode() + data + (
              f"\r\n--{boundary}--").encode()
  location = fs._location  # pylint: disable=protected-access (the emulator's, or GCS's)
  with storage.access(path):
    try:
      _, out = fs.call("POST", f"{location}/upload/storage/v1/b/{{}}/o", bucket,
                       uploadType="multipart", ifGenerationMatch=str(if_generation), data=body,
                       headers={"Content-Type": f'multipart/related; boundary="{boundary}"'})
    except FileExistsError:  # gcsfs's name for HTTP 412.
      return None
  return int(json.loads(out)["generation"])


def delete(fs: Any, path: str, if_generation: int) -> bool:
  """Deletes the object `path` if its generation is `if_generation`; whether it did."""
  bucket, key, _ = fs.split_path(path)
  with storage.access(path):
    try:
      fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(if_generation))
    except (FileExistsError, FileNotFoundError):  # 412: another generation; 404: none.
      return False
  return True
