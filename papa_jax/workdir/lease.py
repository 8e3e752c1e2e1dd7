"""A workdir lock where `flock` does not work (object storage): a lease object.

The lease (JSON) names its holder (host, pid, start time) and a heartbeat time
that a background thread refreshes every `stale_seconds / 4` while the lock is
held. A lease whose heartbeat is older than `stale_seconds` belongs to a run
that died (or lost its network) and is taken over with a log line.

Object stores reachable through `epath` offer no exclusive create, so taking
the lease is check-then-write followed, after `settle_seconds`, by a re-read:
of two runs that raced, the one whose token is no longer in the lease backs
off. A racer whose write lands later than the other's re-read (its
check-to-write gap longer than `settle_seconds`) is not caught there; the
heartbeat thread then finds the foreign token and logs an error.

Staleness does not trust clocks. A lease whose heartbeat is recent by this
host's clock is refused at once; one that looks old is watched for
`stale_seconds / 2` (two of a live holder's heartbeats) and taken over only if
it did not change. A live holder whose clock runs behind is therefore refused,
not robbed; a dead one whose clock ran ahead is taken over once this host's
clock passes its last heartbeat by `stale_seconds`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import threading
import time
import uuid
from typing import Any, Iterator

from absl import logging

from papa_jax.workdir import storage
from papa_jax.errors import ConfigError, StorageError


class WorkdirLocked(ConfigError):
  """Another live run holds the workdir."""


def describe(holder: dict[str, Any]) -> str:
  return f"host {holder.get('host')}, pid {holder.get('pid')}, started {holder.get('started')}"


def _now() -> str:
  return datetime.datetime.now().isoformat(timespec="seconds")


def read(path: str) -> dict[str, Any] | None:
  """The lease at `path`, or None (no lease, or an unreadable one: treated as stale); a
  store that cannot be reached raises its `StorageError`."""
  try:
    return json.loads(storage.read_text(path))
  except StorageError:
    raise
  except (OSError, ValueError):
    return None


def _refused(workdir: str, holder: dict[str, Any], age: float) -> WorkdirLocked:
  return WorkdirLocked(
      f"Workdir {workdir} is in use by another run ({describe(holder)}; heartbeat "
      f"{age:.0f} s ago). Wait for it to finish, or give this run another --workdir (a "
      "lease with no heartbeat for run.lease_stale_seconds is taken over).")


@contextlib.contextmanager
def hold(path: str, workdir: str, stale_seconds: float = 120.0,
         settle_seconds: float = 1.0) -> Iterator[dict[str, Any]]:
  """Holds the lease object `path` of `workdir` while the block runs; yields it."""
  old = read(path)
  if old is not None:
    age = time.time() - float(old.get("heartbeat", 0))
    if age < stale_seconds:
      raise _refused(workdir, old, age)
    old = _unchanged(path, workdir, old, stale_seconds / 2)
    if old is not None:
      logging.warning("Taking over the stale lease of %s (%s; no heartbeat for %.0f s).",
                      workdir, describe(old), age)
  mine = dict(host=socket.gethostname(), pid=os.getpid(), started=_now(),
              token=uuid.uuid4().hex, heartbeat=time.time())
  storage.put(path, json.dumps(mine).encode())
  time.sleep(settle_seconds)
  now = read(path)
  if now is None or now.get("token") != mine["token"]:
    raise _refused(workdir, now or {}, time.time() - float((now or {}).get("heartbeat", 0)))
  stop = threading.Event()
  beat = threading.Thread(target=_heartbeat, args=(path, mine, stop, stale_seconds / 4),
                          daemon=True, name="papa-lease")
  beat.start()
  try:
    yield mine
  finally:
    stop.set()
    beat.join()
    if (read(path) or {}).get("token") == mine["token"]:
      storage.remove(path)


def _unchanged(path: str, workdir: str, old: dict[str, Any],
               watch: float) -> dict[str, Any] | None:
  """`old` if the lease at `path` stays `old` for `watch` seconds (its holder is dead),
  None if it is gone (released); refused if it changed (a live holder, whatever its
  clock says)."""
  logging.info("The lease of %s looks stale (%s): watching it for %.1f s.", workdir,
               describe(old), watch)
  time.sleep(watch)
  now = read(path)
  if now is not None and now != old:
    raise WorkdirLocked(
        f"Workdir {workdir} is in use by another run ({describe(now)}): its lease was "
        "refreshed while watched, though its heartbeat looked older than "
        "run.lease_stale_seconds by this host's clock (the hosts' clocks differ). Wait for "
        "it to finish, or give this run another --workdir.")
  return now


def _heartbeat(path: str, mine: dict[str, Any], stop: threading.Event, every: float) -> None:
  """Refreshes the heartbeat of `mine` every `every` seconds until `stop`."""
  while not stop.wait(every):
    try:
      now = read(path)
      if now is None or now.get("token") != mine["token"]:
        logging.error("Lost the lease %s to another run (%s): two runs may now write this "
                      "workdir; stop one of them.", path, describe(now or {}))
        return
      storage.put(path, json.dumps(dict(mine, heartbeat=time.time())).encode())
    except OSError as e:  # A network blip: retried at the next beat.
      logging.warning("Could not refresh the lease %s: %s", path, e)
