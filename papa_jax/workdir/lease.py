"""A workdir lock where `flock` does not work (object storage): a lease object.

The lease (JSON) names its holder (host, pid, start time, a random token). A
background thread rewrites it every `stale_seconds / 4` while the lock is held;
a lease not rewritten for `stale_seconds` belongs to a run that died (or lost
its network) and is taken over with a log line.

On `gs://` through gcsfs (`conditional`) every step is one conditional write,
which GCS applies atomically:
- taking a free lease creates the object only if there is none
  (`ifGenerationMatch=0`): of two runs racing, exactly one gets it, the other is
  refused, naming the winner;
- taking over a stale lease replaces only the generation judged stale: of two
  runs racing for it, one wins;
- each heartbeat replaces only this run's last generation, so a lease another
  run overwrote is found at the next heartbeat (HTTP 412), which logs an error;
- the release deletes only this run's generation.
Staleness is judged by the store's clock alone: the age of the lease's last
write is the `Date` of the store's answer minus the object's `updated` time
(`conditional.stat`), whatever the hosts' clocks say. (A write whose answer was
lost and whose retry got 412 is recognised by the token in the lease.)

Elsewhere (`s3://`, or `gs://` through TensorFlow or a test's in-memory store)
the store offers no condition reachable here, and the lease is the older
protocol: check, write, and after `settle_seconds` a re-read; of two runs that
raced, the one whose token is no longer in the lease backs off. A racer whose
write lands later than the other's re-read (its check-to-write gap longer than
`settle_seconds`) is not caught there; the heartbeat thread then finds the
foreign token and logs an error. There staleness does not trust clocks either:
a lease whose heartbeat is recent by this host's clock is refused at once; one
that looks old is watched for `stale_seconds / 2` (two of a live holder's
heartbeats) and taken over only if it did not change. A live holder whose clock
runs behind is therefore refused, not robbed; a dead one whose clock ran ahead
is taken over once this host's clock passes its last heartbeat by
`stale_seconds`. (s3fs's `pipe_file(mode="create")` sends `If-None-Match: *`,
and `put_object` takes `IfMatch`, which AWS S3 honours; s3:// stays on this
protocol until they are wired and tested against an S3 server that checks them.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Iterator

from absl import logging

from papa_jax.workdir import conditional, storage
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


def _mine() -> dict[str, Any]:
  return dict(host=socket.gethostname(), pid=os.getpid(), started=_now(),
              token=uuid.uuid4().hex, heartbeat=time.time())


@contextlib.contextmanager
def hold(path: str, workdir: str, stale_seconds: float = 120.0,
         settle_seconds: float = 1.0) -> Iterator[dict[str, Any]]:
  """Holds the lease object `path` of `workdir` while the block runs; yields it (its holder).

  Raises:
    WorkdirLocked: another live run holds it (named in the message).
  """
  fs = conditional.filesystem(path)
  held = (_hold_conditional(fs, path, workdir, stale_seconds) if fs is not None else
          _hold_checked(path, workdir, stale_seconds, settle_seconds))
  with held as mine:
    yield mine


@contextlib.contextmanager
def _beating(beat: Callable[[threading.Event, float], None], every: float,
             release: Callable[[], None]) -> Iterator[None]:
  """Runs `beat(stop, every)` in a thread while the block runs; then stops it and calls
  `release` (after an error in the block too)."""
  stop = threading.Event()
  thread = threading.Thread(target=beat, args=(stop, every), daemon=True, name="papa-lease")
  thread.start()
  try:
    yield
  finally:
    stop.set()
    thread.join()
    release()


# ---- gs:// through gcsfs: conditional writes, the store's clock ----

TAKE_ATTEMPTS = 3  # Looks at a lease that changes hands while this run tries to take it.


def _holder(version: conditional.Version | None) -> dict[str, Any]:
  """The holder a lease version names ({} for none, or an unreadable one)."""
  try:
    holder = json.loads(version.data) if version is not None else {}
  except ValueError:
    return {}
  return holder if isinstance(holder, dict) else {}


@dataclasses.dataclass
class _Held:
  """The generation of the lease that this run wrote last."""
  generation: int


def _take(fs: Any, path: str, workdir: str, stale_seconds: float,
          mine: dict[str, Any]) -> _Held:
  """Creates the lease, or replaces a stale one, with one conditional write."""
  for _ in range(TAKE_ATTEMPTS):
    seen = conditional.stat(fs, path)
    holder = _holder(seen)
    if seen is not None and holder.get("token") == mine["token"]:
      return _Held(seen.generation)  # Our write landed; its answer was lost, its retry 412.
    if seen is not None and seen.age < stale_seconds:
      raise _refused(workdir, holder, seen.age)
    generation = conditional.write(fs, path, json.dumps(mine).encode(),
                                   seen.generation if seen is not None else 0)
    if generation is not None:
      if seen is not None:
        logging.warning("Taking over the stale lease of %s (%s; no heartbeat for %.0f s by "
                        "the store's clock).", workdir, describe(holder), seen.age)
      return _Held(generation)
    # HTTP 412: another run created it, or took it over, first. Look again.
  raise WorkdirLocked(
      f"Workdir {workdir} is in use by another run ({describe(_holder(conditional.stat(fs, path)))}"
      f"): its lease changed hands {TAKE_ATTEMPTS} times while this run tried to take it. "
      "Wait for the other runs to finish, or give this run another --workdir.")


@contextlib.contextmanager
def _hold_conditional(fs: Any, path: str, workdir: str,
                      stale_seconds: float) -> Iterator[dict[str, Any]]:
  mine = _mine()
  held = _take(fs, path, workdir, stale_seconds, mine)
  with _beating(functools.partial(_rewrite, fs, path, mine, held), stale_seconds / 4,
                lambda: _release(fs, path, mine)):
    yield mine


def _rewrite(fs: Any, path: str, mine: dict[str, Any], held: _Held, stop: threading.Event,
             every: float) -> None:
  """Rewrites the lease every `every` seconds until `stop`, each time only if it is still
  the generation this run wrote last."""
  beats = 0
  while not stop.wait(every):
    beats += 1
    data = json.dumps(dict(mine, heartbeat=time.time(), beat=beats)).encode()
    try:
      generation = conditional.write(fs, path, data, held.generation)
      if generation is None:  # HTTP 412: the lease is another generation now.
        seen = conditional.stat(fs, path)
        if _holder(seen).get("token") == mine["token"]:
          held.generation = seen.generation  # Ours (a retried write that had landed).
          continue
        logging.error("Lost the lease %s to another run (%s): two runs may now write this "
                      "workdir; stop one of them.", path, describe(_holder(seen)))
        return
      held.generation = generation
    except Exception as e:  # pylint: disable=broad-except  # A network blip: next beat.
      logging.warning("Could not refresh the lease %s: %s", path, e)


def _release(fs: Any, path: str, mine: dict[str, Any]) -> None:
  """Deletes the lease if it is still this run's."""
  try:
    seen = conditional.stat(fs, path)
    # Compared before the conditional delete: fake-gcs-server ignores the condition on a
    # delete (GCS applies it), so there, too, only this run's own lease is deleted.
    if seen is not None and _holder(seen).get("token") == mine["token"]:
      conditional.delete(fs, path, seen.generation)
  except Exception as e:  # pylint: disable=broad-except  # Taken over once stale.
    logging.warning("Could not release the lease %s (%s): the next run takes it over after "
                    "run.lease_stale_seconds.", path, e)


# ---- elsewhere: check, write, settle, re-read; clocks checked by watching ----


@contextlib.contextmanager
def _hold_checked(path: str, workdir: str, stale_seconds: float,
                  settle_seconds: float) -> Iterator[dict[str, Any]]:
  old = read(path)
  if old is not None:
    age = time.time() - float(old.get("heartbeat", 0))
    if age < stale_seconds:
      raise _refused(workdir, old, age)
    old = _unchanged(path, workdir, old, stale_seconds / 2)
    if old is not None:
      logging.warning("Taking over the stale lease of %s (%s; no heartbeat for %.0f s).",
                      workdir, describe(old), age)
  mine = _mine()
  storage.put(path, json.dumps(mine).encode())
  time.sleep(settle_seconds)
  now = read(path)
  if now is None or now.get("token") != mine["token"]:
    raise _refused(workdir, now or {}, time.time() - float((now or {}).get("heartbeat", 0)))
  with _beating(functools.partial(_heartbeat, path, mine), stale_seconds / 4,
                lambda: _remove_own(path, mine)):
    yield mine


def _remove_own(path: str, mine: dict[str, Any]) -> None:
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
