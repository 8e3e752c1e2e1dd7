"""Where the shared real data lives: the `PAPA_SHARED` setting."""

from __future__ import annotations

import os
import pathlib

ENV = "PAPA_SHARED"


def shared_dir() -> pathlib.Path:
  """`$PAPA_SHARED`, else `../shared` beside the project root (or the cwd)."""
  if os.environ.get(ENV):
    return pathlib.Path(os.environ[ENV]).expanduser()
  repo = pathlib.Path(__file__).resolve().parents[1]
  for base in (repo, pathlib.Path.cwd()):
    candidate = base.parent / "shared"
    if candidate.is_dir():
      return candidate
  return repo.parent / "shared"


def data_dir(task_dir: str = "") -> pathlib.Path:
  return shared_dir() / "data" / task_dir
