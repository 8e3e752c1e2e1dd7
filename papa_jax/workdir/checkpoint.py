"""Orbax checkpoints of train states, with metadata that must match to resume.

Orbax commits each step atomically (written to a temporary directory, then
renamed), so a checkpoint killed half-way is never listed or restored. The
JSON metadata holds a `fingerprint` of the run (model, task, static heads,
hyper-parameters); restoring under another fingerprint is an error.
"""

from __future__ import annotations

import os
from typing import Any

import jax
from absl import logging
import orbax.checkpoint as ocp

from papa_jax.workdir import storage, rules as workdir
from papa_jax.errors import PapaError


class CheckpointError(PapaError, ValueError):
  """A checkpoint that belongs to another run or cannot be read."""


class Checkpointer:
  """Save/restore `(state, meta)` per step under `directory`."""

  def __init__(self, directory: str, max_to_keep: int = 2):
    self.directory = storage.display(directory)
    self._mgr = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

  def latest_step(self) -> int | None:
    return self._mgr.latest_step()

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Saves step `step`; on failure the previous steps stay the latest, intact."""
    try:
      self._mgr.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
      self._mgr.wait_until_finished()
    except OSError as e:
      raise workdir.write_failed(os.path.join(self.directory, str(step)), e) from e
    except Exception as e:  # Orbax wraps I/O errors in its own types.
      if isinstance(e.__cause__, OSError) or "No space left" in str(e):
        raise workdir.WriteError(28, f"Could not write checkpoint {self.directory}/{step} "
                                 f"({e}). The previous checkpoint is intact: free disk "
                                 "space and rerun the same command to resume.") from e
      raise

  def restore(self, step: int, abstract_state: Any, fingerprint: str) -> tuple[Any, dict]:
    """Restores step `step` into the shapes/shardings of `abstract_state`."""
    path = os.path.join(self.directory, str(step))
    try:
      meta = self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # Orbax raises many types for damaged files.
      raise CheckpointError(f"Checkpoint {path} is unreadable ({type(e).__name__}: {e}); "
                            "delete it to start that run afresh.") from e
    if meta.get("fingerprint") != fingerprint:
      raise CheckpointError(
          f"Checkpoint {path} was written by another run (fingerprint "
          f"{meta.get('fingerprint')}, this run {fingerprint}: a different model, task or "
          "settings). Use another workdir, or set --config.overwrite=True to discard it.")
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    try:
      state = self._mgr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(target)))["state"]
    except Exception as e:
      raise CheckpointError(f"Checkpoint {path} does not fit this run's train state or is "
                            f"damaged ({type(e).__name__}: {str(e)[:300]}).") from e
    return state, meta

  def close(self) -> None:
    try:
      self._mgr.close()
    except Exception as e:  # A failed save's background error, already raised once.
      logging.warning("Closing checkpoints in %s: %s", self.directory, e)
