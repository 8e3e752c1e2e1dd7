"""The project's errors: one base for every bad input, and no bare built-in error raised where a
user's model files are read (the launcher prints a `PapaError` as one line)."""

import ast
import builtins
import os

import pytest

from papa_jax import errors

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A built-in error is allowed where one of these comments ends one of its lines or the line above:
# the check guards a Python caller's argument (the launcher validates every config field before
# such a call) or is a consistency check of ours (a bug, not a bad input).
MARKS = ("# caller's argument", "# internal check")
# Where the raise is left as it is: an optional package an environment lacks, an abstract method.
KEPT = ("ImportError", "NotImplementedError")
BUILTIN = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, Exception)}


def _bare_raises(path: str):
  """(name, line, marked) of each built-in error made in `path` (`raise ValueError(...)`, and
  `return ValueError(...)` for a caller to raise)."""
  with open(path, encoding="utf-8") as f:
    source = f.read()
  lines = source.splitlines()
  for node in ast.walk(ast.parse(source, path)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id in BUILTIN):
      text = lines[max(node.lineno - 2, 0):node.end_lineno]
      yield node.func.id, node.lineno, any(line.rstrip().endswith(MARKS) for line in text)


def _package_files():
  for dirpath, _, files in os.walk(os.path.join(ROOT, "papa_jax")):
    for name in sorted(files):
      if name.endswith(".py"):
        yield os.path.relpath(os.path.join(dirpath, name), ROOT)


def test_errors_no_bare_builtin_raise_a_users_input_can_reach():
  """Every `raise ValueError(...)` (or another built-in) in the package is a project error class
  the launcher prints as one line, or carries a comment saying why it is not a user's input."""
  found, marked = [], 0
  for rel in _package_files():
    for exc, line, ok in _bare_raises(os.path.join(ROOT, rel)):
      marked += ok
      if not ok and exc not in KEPT:
        found.append(f"{rel}:{line}: raise {exc}")
  assert not found, ("a bad input should raise a papa_jax.errors class (ConfigError, "
                     "ModelFileError, ResultFileError, ...), which the launcher prints as one "
                     f"line; or end the raise with one of {MARKS} when no user's input reaches "
                     "it:\n" + "\n".join(found))
  assert marked > 30  # The scan sees the marked raises (it would pass on an empty package).


def test_errors_the_scan_finds_an_unmarked_raise(tmp_path):
  path = tmp_path / "m.py"
  path.write_text("def f(x):\n  if x:\n    raise ValueError(\n        'x')\n"
                  "  if isinstance(x, TypeError):\n    return OSError(x)\n"
                  "  # internal check\n  raise KeyError(x)\n")
  assert sorted(_bare_raises(str(path))) == [("KeyError", 8, True), ("OSError", 6, False),
                                             ("ValueError", 3, False)]


def test_errors_every_project_error_is_a_papa_error_and_keeps_its_builtin_type():
  # pylint: disable=import-outside-toplevel
  from papa_jax import tokenization
  from papa_jax.workdir import checkpoint, storage
  from papa_jax.probing import features
  from papa_jax.analysis import finetune
  from papa_jax.convert import fetch
  from papa_jax.data import errors as data_errors
  from papa_jax.papa import means
  for cls, builtin in ((errors.ConfigError, ValueError), (errors.ModelFileError, ValueError),
                       (errors.ModelNotFound, FileNotFoundError),
                       (data_errors.DataError, ValueError), (data_errors.TaskConfigError,
                                                             errors.ConfigError),
                       (tokenization.TokenizerError, ValueError),
                       (means.MeansFileError, ValueError), (checkpoint.CheckpointError, ValueError),
                       (features.CacheTooLarge, ValueError), (storage.WriteError, OSError),
                       (fetch.FetchError, RuntimeError),
                       (finetune.ArchitectureMismatch, ValueError)):
    assert issubclass(cls, errors.PapaError) and issubclass(cls, builtin), cls
