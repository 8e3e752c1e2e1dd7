"""The package's import graph: no cycle, and the layers import only downward.

Run alone with `python -m pytest tests/imports_test.py -q -s` to print each module's
floor (one above everything it imports).
"""

import ast
import os

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "papa_jax"

# The layers above the library's folders: stages, commands and what runs them.
ABOVE = ("papa_jax.stage", "papa_jax.registry", "papa_jax.run", "papa_jax.commands",
         "papa_jax.suite", "papa_jax.analysis", "papa_jax.papa", "papa_jax.explorer")
# What each low layer must never import (module prefixes): the core does not know
# about stages, analyses, commands or readers above it.
# Leaves any module may import (no module but errors below them): the errors, and the
# platform whose code paths traced programs take.
LEAVES = ("papa_jax.errors", "papa_jax.backend")
FORBIDDEN = {
    "papa_jax.errors": ("papa_jax.",),
    "papa_jax.backend": ("papa_jax.",),
    "papa_jax.workdir.layout": ("papa_jax.",),
    "papa_jax.attention": ("papa_jax.",),
    "papa_jax.measures.effective": ("papa_jax.",),
    "papa_jax.models": ("papa_jax.analysis", "papa_jax.papa", "papa_jax.stage", "papa_jax.run",
                        "papa_jax.convert", "papa_jax.interventions", "papa_jax.data"),
    "papa_jax.data": ("papa_jax.models", "papa_jax.analysis", "papa_jax.papa", "papa_jax.stage",
                      "papa_jax.config.schema", "papa_jax.run"),
    "papa_jax.config.fields": ("papa_jax.",),
    "papa_jax.config.schema": ("papa_jax.data", "papa_jax.stage", "papa_jax.registry",
                               "papa_jax.run"),
    "papa_jax.runner": ("papa_jax.stage", "papa_jax.registry", "papa_jax.run"),
    "papa_jax.stage": ("papa_jax.registry", "papa_jax.run", "papa_jax.commands",
                       "papa_jax.analysis", "papa_jax.papa", "papa_jax.suite"),
    "papa_jax.run": ("papa_jax.commands", "papa_jax.suite", "papa_jax.report",
                     "papa_jax.explorer"),
    # Each folder of the package (one rule per folder): nothing of the layers above them
    # (ABOVE; the report reads PAPA's paper fractions from papa.schedule), and what else
    # each must not know.
    "papa_jax.workdir": ABOVE + (
        "papa_jax.report", "papa_jax.probing", "papa_jax.data", "papa_jax.models",
        "papa_jax.convert", "papa_jax.measures",
    ),
    "papa_jax.report": tuple(b for b in ABOVE if b != "papa_jax.papa") + (
        "papa_jax.probing", "papa_jax.convert", "papa_jax.models",
    ),
    "papa_jax.probing": ABOVE + ("papa_jax.report", "papa_jax.convert"),
    "papa_jax.measures": ABOVE + (
        "papa_jax.report", "papa_jax.probing", "papa_jax.data", "papa_jax.workdir",
        "papa_jax.convert", "papa_jax.config",
    ),
    "papa_jax.config": ABOVE + (
        "papa_jax.workdir", "papa_jax.data", "papa_jax.models", "papa_jax.report",
        "papa_jax.probing", "papa_jax.measures",
    ),
}


def _modules() -> dict[str, str]:
  out = {}
  for d, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, ".")
        out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(d, f)
  return out


def import_graph() -> dict[str, set[str]]:
  """Module -> the package modules it imports, anywhere in the file (lazy imports too)."""
  modules = _modules()
  graph = {}
  for name, path in modules.items():
    deps = set()
    is_pkg = path.endswith("__init__.py")
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = name.split(".")[:len(name.split(".")) - node.level + (1 if is_pkg else 0)]
          base = ".".join(parts + ([base] if base else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                   for a in node.names]
      else:
        continue
      deps.update(t for t in targets if t in modules and t != name)
    graph[name] = deps
  return graph


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
  out: dict[str, int] = {}

  def floor(m, path=()):
    if m in path:
      raise AssertionError(f"import cycle: {' -> '.join(path + (m,))}")
    if m not in out:
      out[m] = 1 + max((floor(d, path + (m,)) for d in graph[m]), default=-1)
    return out[m]

  for m in graph:
    floor(m)
  return out


def test_imports_have_no_cycle():
  f = floors(import_graph())  # Raises naming the cycle.
  for m in sorted(f, key=lambda m: (f[m], m)):
    print(f"{f[m]:2d} {m}")


def test_imports_subpackages_have_no_cycle_between_them():
  """Seen a folder at a time (`papa_jax/papa/`, `papa_jax/analysis/`, each top-level module),
  the graph is acyclic too: two folders never import each other, through any files."""
  rooms: dict[str, set[str]] = {}
  room = lambda m: ".".join(m.split(".")[:2])
  for m, deps in import_graph().items():
    rooms.setdefault(room(m), set()).update(room(d) for d in deps if room(d) != room(m))
  f = floors(rooms)
  print({m: f[m] for m in sorted(f, key=f.get)})


def _may_import_leaf(m: str, d: str) -> bool:
  """Any module may import a leaf; a leaf only the leaves before it."""
  if d not in LEAVES:
    return False
  return m not in LEAVES or LEAVES.index(d) < LEAVES.index(m)


def test_imports_low_layers_import_nothing_above_them():
  graph = import_graph()
  bad = []
  for low, banned in FORBIDDEN.items():
    for m, deps in graph.items():
      if m == low or m.startswith(low + "."):
        bad += [f"{m} imports {d}" for d in deps if d.startswith(banned) and
                not (d == low or d.startswith(low + ".")) and not _may_import_leaf(m, d)]
  assert not bad, bad


def test_imports_graph_sees_lazy_imports():
  """The walker counts imports inside functions (a cycle hidden in one still counts)."""
  graph = import_graph()
  assert "papa_jax.convert.fetch" in graph["papa_jax.convert"]  # Inside a function.
  assert "papa_jax.papa.means" in graph["papa_jax.registry"]
  rooms = {"a": {"b"}, "b": {"a"}}
  try:
    floors(rooms)
  except AssertionError as e:
    assert "a -> b -> a" in str(e)
  else:
    raise AssertionError("a two-module cycle was not found")


def test_family_names_stay_in_the_converter():
  """Model and analysis code branch on `EncoderConfig` flags, never on a family's name:
  no string literal naming a family (or a Hugging Face model_type) outside `convert/`."""
  from papa_jax.convert.hf_config import MODEL_TYPES
  families = set(MODEL_TYPES) | set(MODEL_TYPES.values())
  found = []
  for module, path in _modules().items():
    if module.startswith(PACKAGE + ".convert"):
      continue
    with open(path) as f:
      tree = ast.parse(f.read())
    found += [f"{module}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
              if isinstance(n, ast.Constant) and n.value in families]
  assert not found, f"family names outside papa_jax/convert: {found}"
