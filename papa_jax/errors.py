"""Errors every layer raises; a leaf module, so any module can import it.

`PapaError` is the base of every error that names a bad input (a config field, a data file
and line, a model file and tensor, a tokenizer, a workdir, storage): the launcher prints one
as a single line and exits with status 1 (`PAPA_TRACEBACK=1` shows the traceback). Each
subclass keeps the built-in type a Python caller would expect (`ValueError`, `OSError`, ...).
"""

from __future__ import annotations


class PapaError(Exception):
  """A bad input the user can fix; the message names it and, where there is one, the fix."""


class ConfigError(PapaError, ValueError):
  """A config that cannot run, found before any long computation."""


class ModelNotFound(PapaError, FileNotFoundError):
  """A model (or its tokenizer) that is neither on disk nor downloadable; the message says
  what to pass instead."""


class ModelFileError(PapaError, ValueError):
  """A model's files that cannot be the model they declare (a config field, a tensor's name
  or shape, an ONNX graph); the message names the file and the field or tensor."""


class StorageError(PapaError, OSError):
  """Object storage that cannot be reached: no filesystem package, no network, no credentials;
  the message names the path, what was checked and how to work offline."""


class WorkdirError(PapaError, OSError):
  """A workdir that cannot be used as asked (read-only, or files that are not this project's);
  the message names the file and what to do."""


class IncompleteWorkdir(WorkdirError, FileNotFoundError):
  """A workdir without the outputs a command reads; the message names the stage to run."""


class TrainingDiverged(PapaError, FloatingPointError):
  """A probe whose loss became NaN or infinite; the message names the step and the remedy."""


class ResultFileError(PapaError, ValueError):
  """A workdir's output file that cannot be what its name says (a shape, a format, an older
  version's layout); the message names the file and the stage to rerun."""
