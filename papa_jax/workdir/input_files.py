"""What a run read, by content: each input file's size and SHA-256, per source.

A *source* is one thing results depend on: a data split (`"train"`,
`"validation"`, ...: its file, or for the TFDS catalog its dataset, version,
split and prepared files) or the model (`"model"`: its fingerprint and the
files of its directory). A source's record is `{"files": {path: file record},
...identity}`; a file record holds its `size`, `mtime_ns`, `ctime_ns`, `ino`
and `sha256`. The workdir keeps the records of what its results read
(`Layout.inputs`, written by `workdir.bind`); they are also the hash cache: a
file whose size, mtime, ctime and inode equal the recorded ones is not hashed
again, unless it was changed within `RACY_NS` of its hashing (a same-size edit
in the same timestamp tick would otherwise go unseen). SHA-256 streams at about
1.5 GB/s on a SHA-NI CPU, so even a GB-sized file costs about a second, once
per workdir.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Iterable, Mapping

from papa_jax.errors import ConfigError

FORMAT = "papa-inputs-1"
CHUNK = 1 << 20  # Bytes per read while hashing.
RACY_NS = 2_000_000_000  # A file changed this close to its hashing is hashed again next time.
STAT_FIELDS = ("size", "mtime_ns", "ctime_ns", "ino")


class InputChangedError(ConfigError):
  """A file that finished results read has other content now."""


def sha256(path: str) -> str:
  """The SHA-256 of a file's bytes, streamed (hex)."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(CHUNK):
      h.update(chunk)
  return h.hexdigest()


def _stat(path: str) -> dict[str, int]:
  st = os.stat(path)
  return dict(size=st.st_size, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns, ino=st.st_ino)


def file_record(path: str, known: Mapping[str, Any] | None = None) -> dict[str, Any]:
  """`path`'s stat and SHA-256; `known` (a record of the same path) is reused when the
  stat is unchanged and was not racy when hashed."""
  stat = _stat(path)
  if known and known.get("trusted") and all(known.get(k) == v for k, v in stat.items()):
    return dict(known)
  digest = sha256(path)
  after, now = _stat(path), time.time_ns()
  if after != stat:
    raise InputChangedError(f"{path} changed while it was being read; rerun once nothing "
                            "writes to it.")
  return dict(stat, sha256=digest, trusted=max(stat["mtime_ns"], stat["ctime_ns"]) < now - RACY_NS)


def source_record(paths: Iterable[str], known: Mapping[str, Any] | None = None,
                  **identity: Any) -> dict[str, Any]:
  """The record of one source: its files (hashed, or reused from `known`) and `identity`."""
  files = (known or {}).get("files", {})
  return dict(identity, files={p: file_record(p, files.get(p)) for p in paths})


def content(record: Mapping[str, Any]) -> dict[str, Any]:
  """What a source's results depend on. A source with a `fingerprint` (the model: its
  parameters' values and tokenizer files) is that; else its identity and its files'
  hashes in order, without paths or stat (a moved copy of the same bytes is the same)."""
  if "fingerprint" in record:
    return dict(fingerprint=record["fingerprint"])
  return dict({k: v for k, v in record.items() if k != "files"},
              sha256=[f["sha256"] for f in record.get("files", {}).values()])


def _size(n: int) -> str:
  return f"{n:,} bytes"


def _file_change(path: str, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> str:
  if old is None:
    return f"{path} was added"
  if new is None:
    return f"{path} is gone"
  if old["size"] != new["size"]:
    return f"{path} changed size ({_size(old['size'])} -> {_size(new['size'])})"
  return (f"{path} changed content (same size, {_size(new['size'])}; sha256 "
          f"{old['sha256'][:12]}... -> {new['sha256'][:12]}...)")


def source_changes(name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  """How source `name` differs from what results read (empty: the same content)."""
  if content(old) == content(new):
    return []
  out = [f"{name}: {k} {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
         if k not in ("files", "fingerprint") and old.get(k) != new.get(k)]
  fo, fn = old.get("files", {}), new.get("files", {})
  by_name = lambda files: {os.path.basename(p): p for p in files}
  if set(fo) != set(fn) and by_name(fo).keys() == by_name(fn).keys():
    fo = {by_name(fn)[os.path.basename(p)]: r for p, r in fo.items()}  # The same files, moved.
  out += [f"{name}: " + _file_change(p, fo.get(p), fn.get(p)) for p in sorted(set(fo) | set(fn))
          if fo.get(p, {}).get("sha256") != fn.get(p, {}).get("sha256")]
  if not out and old.get("fingerprint") != new.get("fingerprint"):
    out.append(f"{name}: fingerprint {old.get('fingerprint')} -> {new.get('fingerprint')} "
               "though its files are the same (converted differently by another papa-jax?)")
  return out or [f"{name}: its content differs"]


def changes(recorded: Mapping[str, Any], current: Mapping[str, Any],
            sources: Iterable[str]) -> list[str]:
  """Every difference between recorded and current sources among `sources`
  (a source this run does not read is not compared)."""
  return [line for s in sorted(set(sources)) if s in recorded and s in current
          for line in source_changes(s, recorded[s], current[s])]
