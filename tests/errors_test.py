"""The project's errors: one base for every bad input, and no bare built-in error raised where a
user's model files are read (the launcher prints a `PapaError` as one line)."""

import ast
import builtins
import os

import pytest

from papa_jax import errors

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where a user's input is read, and the raises there that are internal consistency checks (a
# bug of ours, not a bad input) or an environment's missing optional package.
CHECKED = ("papa_jax/convert",)
ALLOWED = {
    ("papa_jax/convert/hf_params.py", "ValueError", "Two rules write"),
    ("papa_jax/convert/hf_params.py", "ValueError", "Converted tree differs from the model"),
    ("papa_jax/convert/fetch.py", "KeyError", "Unknown fetchable model"),
}
BUILTIN = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, Exception)}


def _bare_raises(path: str):
  """(name, first words of its message, line) of each `raise Builtin(...)` in `path`."""
  with open(path, encoding="utf-8") as f:
    source = f.read()
  for node in ast.walk(ast.parse(source, path)):
    if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
        and isinstance(node.exc.func, ast.Name) and node.exc.func.id in BUILTIN):
      yield node.exc.func.id, ast.get_source_segment(source, node.exc) or "", node.lineno


def test_errors_no_bare_builtin_raise_where_model_files_are_read():
  found, used = [], set()
  for folder in CHECKED:
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
      for name in sorted(files):
        if not name.endswith(".py"):
          continue
        rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
        for exc, text, line in _bare_raises(os.path.join(ROOT, rel)):
          allowed = [a for a in ALLOWED if a[0] == rel and a[1] == exc and a[2] in text]
          used.update(allowed)
          if not allowed and exc not in ("ImportError", "NotImplementedError"):
            found.append(f"{rel}:{line}: raise {exc}")
  assert not found, ("a bad model file should raise a papa_jax.errors class (ModelFileError, "
                     "ModelNotFound, ...), which the launcher prints as one line:\n"
                     + "\n".join(found))
  assert used == ALLOWED, f"allowed raises that are gone: {ALLOWED - used}"


def test_errors_every_project_error_is_a_papa_error_and_keeps_its_builtin_type():
  # pylint: disable=import-outside-toplevel
  from papa_jax import checkpoint, features, storage, tokenization
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
