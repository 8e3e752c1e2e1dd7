"""The workdir: fingerprints, atomic writes, binding to one config, a lock, provenance.

Every file a stage writes goes through `atomic_write` (`storage`: a temporary
file renamed into place, or one object put on object storage), so a killed run
never leaves a truncated result behind. A workdir is bound to the result fields
that its finished work depends on (each stage's finished outputs and groups,
`registry.finished_outputs`; e.g. PAPA runs do not depend on the `effective`
group), and to the content of the inputs it read (data files, model: `input_files`; recorded in
`inputs.json`): an edited file is refused by name, never reused. A workdir
holding no finished work yet is rebound freely, so a run that failed on a data
error does not lock its workdir to the broken config. Paths are
`layout.Layout`'s.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import os
import socket
from typing import Any, Iterator, Mapping, Sequence

import ml_collections
from absl import logging

from papa_jax import backend, cpu_tuning
from papa_jax.config import schema as config_schema
from papa_jax.workdir import input_files, lease, storage
from papa_jax.errors import ConfigError, StorageError, WorkdirError
from papa_jax.workdir.layout import RESULT_FILES, Layout
from papa_jax.workdir.lease import WorkdirLocked  # noqa: F401 (the error `lock` raises)


def fingerprint(obj: Any) -> str:
  """A 16-hex-digit hash of a JSON-able object (keys sorted)."""
  text = json.dumps(obj, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


WriteError, write_failed, atomic_write = (storage.WriteError, storage.write_failed,
                                         storage.atomic_write)


def write_json(path: str, obj: Any) -> None:
  with atomic_write(path) as f:
    json.dump(obj, f, indent=2, default=float)


def read_json(path: str) -> Any:
  with storage.open(path) as f:
    return json.load(f)


def bound_groups(workdir: str, finished: Mapping[str, tuple[str, ...]]) -> set[str]:
  """The config groups the finished work here depends on (partial sums do not count).

  `finished` maps glob patterns of finished outputs to their groups
  (`registry.finished_outputs()`).
  """
  groups: set[str] = set()
  for pattern, deps in finished.items():
    if any(not p.endswith(".partial.npz") for p in storage.glob(os.path.join(workdir, pattern))):
      groups.update(deps)
  return groups


# What `open` or `mkdir` answer in a folder that cannot be written (a read-only mount, or
# another user's folder).
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def read_only(workdir: str) -> str | None:
  """Why the existing local folder `workdir` cannot be written ('on a read-only mount
  (EROFS)', ...), or None: writable, absent, or on object storage (not checked here)."""
  if not storage.is_local(workdir) or not os.path.isdir(workdir):
    return None
  if os.access(workdir, os.W_OK):
    return None
  return _not_writable(workdir, errno.EROFS if os.statvfs(workdir).f_flag & os.ST_RDONLY
                       else errno.EACCES)


def _not_writable(workdir: str, code: int) -> str:
  return ("on a read-only mount (EROFS)" if code == errno.EROFS else
          f"not writable by this user ({errno.errorcode.get(code, code)})")


def read_only_error(workdir: str, why: str) -> WorkdirError:
  """The error of a command that must write to the read-only `workdir`."""
  e = WorkdirError(
      f"--workdir={workdir} is {why}. Its finished results can be read as they are "
      f"(papa_jax.api.load_results('{workdir}'), or --config.stage=explore with an absolute "
      "--config.explore.output outside it); give a writable --workdir to run stages (a copy "
      "of this one resumes from its results).")
  e.errno = errno.EROFS if "EROFS" in why else errno.EACCES
  return e


def prepare(workdir: str) -> None:
  """Creates `workdir`, or says clearly why it cannot be one (a file, a read-only mount,
  object storage that cannot be reached: `storage.preflight`)."""
  if storage.exists(workdir) and not storage.isdir(workdir):
    raise ConfigError(
        f"--workdir={workdir} exists and is not a directory; give a directory path.")
  why = read_only(workdir)
  if why:
    raise read_only_error(workdir, why)
  try:
    storage.makedirs(workdir)
  except StorageError:
    raise
  except OSError as e:
    if e.errno in NOT_WRITABLE:
      raise read_only_error(workdir, _not_writable(workdir, e.errno)) from e
    raise ConfigError(f"Cannot create --workdir={workdir}: {e}.") from e


def _input_problem(layout: Layout, inputs: Mapping[str, dict] | None,
                   sources: set[str]) -> tuple[dict[str, dict], str]:
  """The recorded sources, and how the `sources` finished work read differ from `inputs`
  ('' when they do not, or when `inputs` is None: not checked)."""
  recorded = {}
  if inputs is not None and storage.exists(layout.inputs):
    saved = read_json(layout.inputs)
    recorded = saved.get("sources", {}) if saved.get("format") == input_files.FORMAT else {}
  if inputs is None or not sources:
    return recorded, ""
  if not recorded:
    return recorded, ("holds results written before papa-jax recorded the content of the "
                      f"files they read (no {os.path.basename(layout.inputs)}), so they cannot "
                      "be shown to come from the current files")
  changed = input_files.changes(recorded, inputs, sources)
  return recorded, ("holds results of other input files: " + "; ".join(changed[:8])
                    if changed else "")


def bind(config: ml_collections.ConfigDict, workdir: str, *,
         finished: Mapping[str, tuple[str, ...]], output_dirs: Sequence[str] = (),
         main_process: bool = True, inputs: Mapping[str, dict] | None = None,
         finished_sources: Mapping[str, tuple[str, ...]] | None = None) -> None:
  """Refuses a workdir whose finished work came from other result fields or other inputs.

  Args:
    config: this run's config.
    workdir: the workdir.
    finished: finished-output glob -> config groups (`registry.finished_outputs()`).
    output_dirs: the stages' folders, removed with the results under `config.overwrite`.
    main_process: only the main process writes.
    inputs: the sources this run reads, by content (`input_files`; None: not checked).
    finished_sources: finished-output glob -> the sources it read.

  With `config.overwrite`, the other config's (or inputs') results are removed instead.
  """
  layout = Layout(workdir)
  path = layout.config
  mine = config_schema.result_config(config)
  recorded, problems = {}, []
  if storage.exists(path):
    theirs = config_schema.result_config(config_schema.migrate(read_json(path)))
    bound = bound_groups(workdir, finished)
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k)
                  and k.split(".")[0] in bound)
    recorded, changed = _input_problem(layout, inputs,
                                       bound_groups(workdir, finished_sources or {}))
    if diff:
      details = "; ".join(f"{k}: {theirs.get(k)!r} -> {mine.get(k)!r}" for k in diff[:8])
      problems.append(f"holds results of a different config ({details})")
    if changed:
      problems.append(changed)
    if problems and not config.overwrite:
      raise (ConfigError if diff else input_files.InputChangedError)(
          f"Workdir {workdir} {' and '.join(problems)}. Use another --workdir, or "
          "--config.overwrite=True to replace them (recomputed from the current files).")
    if problems and main_process:
      logging.warning("overwrite=True: removing the results in %s (%s).", workdir,
                      "; ".join(problems))
      for name in tuple(output_dirs) + ("cache",):
        storage.rmtree(layout.path(name))
      for name in RESULT_FILES:
        storage.remove(layout.path(name))
    elif not problems and mine != theirs:
      logging.info("%s held other result fields that no finished work here depends on; "
                   "rebinding the workdir.", path)
  if main_process:
    write_json(path, json.loads(config.to_json_best_effort()))
    if inputs is not None:
      kept = {} if problems else recorded  # Sources read before and not read by this run.
      write_json(layout.inputs, dict(format=input_files.FORMAT, sources=dict(kept, **inputs)))


@contextlib.contextmanager
def lock(workdir: str, stale_seconds: float = 120.0) -> Iterator[None]:
  """One run per workdir: an exclusive lock held while the stages run.

  The lock file names its holder (host, pid, start time). The kernel drops the
  lock when its process dies, so a lock file left by a killed run is stale and
  is taken over with a log line. (On a filesystem without working `flock`
  across hosts, runs on different hosts are not kept apart.) On object storage
  (`gs://`...) the lock is a lease object (`lease.hold`) instead, taken over
  when its heartbeat is older than `stale_seconds`.
  """
  path = Layout(workdir).lock
  if not storage.is_local(path):
    with lease.hold(path, workdir, stale_seconds):
      yield
    return
  try:
    f = open(path, "a+")  # pylint: disable=consider-using-with
  except OSError as e:
    if e.errno in NOT_WRITABLE:
      raise read_only_error(workdir, _not_writable(workdir, e.errno)) from e
    raise
  try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    f.seek(0)
    holder = f.read().strip() or "{}"
    f.close()
    try:
      h = json.loads(holder)
      who = f"host {h.get('host')}, pid {h.get('pid')}, started {h.get('started')}"
    except json.JSONDecodeError:
      who = holder
    raise WorkdirLocked(f"Workdir {workdir} is in use by another run ({who}). Wait for it to "
                        "finish, or give this run another --workdir.") from None
  f.seek(0)
  previous = f.read().strip()
  if previous:
    logging.warning("Taking over the stale lock of %s (that run ended without releasing it: "
                    "%s).", workdir, previous)
  f.seek(0)
  f.truncate()
  f.write(json.dumps(dict(host=socket.gethostname(), pid=os.getpid(),
                          started=datetime.datetime.now().isoformat(timespec="seconds"))))
  f.flush()
  try:
    yield
  finally:
    f.seek(0)
    f.truncate()
    f.flush()
    fcntl.flock(f, fcntl.LOCK_UN)
    f.close()


def package_versions() -> dict[str, str]:
  import importlib.metadata as md  # pylint: disable=import-outside-toplevel
  out = {}
  for name in ("papa-jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy",
               "transformers", "tokenizers", "tensorflow-datasets"):
    with contextlib.suppress(md.PackageNotFoundError):
      out[name] = md.version(name)
  return out


def git_revision() -> str | None:
  """HEAD of the project's checkout (`-dirty` when tracked files changed)."""
  import subprocess  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                         text=True, timeout=5)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True, timeout=5).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None
  return rev.stdout.strip() + ("-dirty" if dirty else "") if rev.returncode == 0 else None


# Environment variables of this project that can change numbers (`cpu_tuning`, `backend`).
NUMERIC_ENV = ("PAPA_CPU_TUNING", "PAPA_FUSED_ATTENTION")


def provenance() -> dict[str, Any]:
  """Versions, git revision, JAX topology, CPU, XLA flags and the settings that change
  numbers (environment variables, fused attention), saved with every result."""
  import jax  # pylint: disable=import-outside-toplevel
  return dict(versions=package_versions(), git_revision=git_revision(),
              backend=jax.default_backend(), devices=jax.device_count(),
              processes=jax.process_count(), cpu=cpu_tuning.cpu_info(),
              xla_flags=os.environ.get("XLA_FLAGS", ""),
              env={k: os.environ[k] for k in NUMERIC_ENV if k in os.environ},
              fused_attention=backend.use_fused_attention())
