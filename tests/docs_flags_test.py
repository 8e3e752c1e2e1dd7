"""Every launcher command written in the README, docs/ and the configs' docstrings parses.

Each `python launch/main.py ...` in a shell code block is parsed as the launcher
parses it (`config_schema.launcher_argv`, then ml_collections' `config_flags` with
`lock_config=True`): its config file built with its argument, each `--config.x=v`
applied, the result validated. A config file the repository does not have must be
written out in the same document (a python block whose first line is `# configs/x.py`).
Flags written in prose (`--config.x=VALUE`, placeholders allowed) must name a field.
"""

import ast
import glob
import os
import re
import shlex

import pytest
from absl import flags
from ml_collections import config_flags

from papa_jax import convert
from papa_jax.config import schema as config_schema
from papa_jax.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/docs/*.md"))]
CONFIGS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(f"{ROOT}/configs/*.py"))
# Prose that shows a mistake on purpose (docs/reliability.md: what a typo does).
MISTAKES = {"probe.lerning_rate", "run.workdir"}  # Bad flags the docs show as examples.
pytestmark = pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
_BLOCK = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)


def _text(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    text = f.read()
  if path.endswith(".py"):  # A config's docstring holds its commands; make it a shell block.
    doc = re.match(r'\s*"""(.*?)"""', text, re.S)
    lines = (doc.group(1) if doc else "").split("\n")  # Line k here is line k of the file.
    return "\n".join(["```sh", *lines[1:], "```", ""])
  return text


def _launcher_args(line: str) -> list[list[str]]:
  """The arguments of each `launch/main.py` call in a shell line (also inside a quoted
  remote command, as in `gcloud ... --command="... python launch/main.py ..."`)."""
  out = []
  tokens = shlex.split(line, comments=True)
  for i, tok in enumerate(tokens):
    if tok.endswith("launch/main.py") and i and "python" in tokens[i - 1]:
      args = []
      for t in tokens[i + 1:]:
        if t in ("&&", ";", "|", "||"):
          break
        args.append(t)
      out.append(args)
    elif "launch/main.py" in tok and " " in tok:  # A quoted command.
      out += _launcher_args(tok)
  return out


def commands() -> list[tuple[str, list[str], str]]:
  """(where, launcher arguments, the document's text) for every command written."""
  found = []
  for path in DOCS + CONFIGS:
    text = _text(path)
    for m in _BLOCK.finditer(text):
      if m.group(1) not in ("", "sh", "bash", "shell", "console"):
        continue
      first = text[:m.start(2)].count("\n") + 1
      body = re.sub(r"\\\n", " ", m.group(2))
      for k, line in enumerate(body.split("\n")):
        if "launch/main.py" in line:
          for args in _launcher_args(line):
            found.append((f"{path}:{first + k}", args, text))
  return found


def _config_path(spec: str, text: str, tmp_path) -> str:
  """`configs/x.py[:arg]` with the file made absolute; one written only in the document
  is saved under tmp_path."""
  path, colon, arg = spec.partition(":")
  if os.path.exists(os.path.join(ROOT, path)):
    full = os.path.join(ROOT, path)
  else:
    block = next((b for lang, b in _BLOCK.findall(text)
                  if lang == "python" and b.startswith(f"# {path}\n")), None)
    assert block is not None, f"{path} is neither in the repository nor written in the document"
    full = str(tmp_path / os.path.basename(path))
    with open(full, "w", encoding="utf-8") as f:
      f.write(block)
  return full + (colon + arg if arg not in ("", "...") else "")


def parse(args: list[str], text: str = "", tmp_path=None):
  """The config the launcher would run for `args` (its `--workdir` and other flags
  ignored); raises on an unknown field, a wrong type, a moved field or a failed check."""
  config_args = [a for a in args if a.startswith("--config")]
  spec = [a for a in config_args if a.startswith("--config=")]
  assert len(spec) == 1, f"one --config=FILE expected, got {spec}"
  config_args[config_args.index(spec[0])] = "--config=" + _config_path(
      spec[0][len("--config="):], text, tmp_path)
  argv = ["main.py", *config_schema.launcher_argv(config_args)]
  fv = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                           sys_argv=argv)  # Overrides are read from here.
  fv(argv)
  config = holder.value
  config_schema.validate(config)
  return config


COMMANDS = commands()


@pytest.mark.unit
def test_docs_commands_are_found():
  where = {w.split(":")[0] for w, _, _ in COMMANDS}
  assert len(COMMANDS) >= 20 and {"README.md", "docs/tasks.md", "configs/suite.py"} <= where


@pytest.mark.unit
@pytest.mark.parametrize("where,args,text", COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_docs_command_parses_against_the_schema(where, args, text, tmp_path):
  try:
    parse(args, text, tmp_path)
  except Exception as e:  # pylint: disable=broad-except
    pytest.fail(f"{where}: {' '.join(args)}\n  {type(e).__name__}: {e}")


def _names(config, prefix=""):
  for k, v in config.items():
    yield prefix + k
    if hasattr(v, "items"):
      yield from _names(v, f"{prefix}{k}.")


def _known() -> set[str]:
  return set(_names(config_schema.get_config())) | set(_names(parse(["--config=configs/suite.py"])))


@pytest.mark.unit
def test_docs_prose_flags_name_fields():
  known, bad = _known(), []
  for path in DOCS:
    prose = _BLOCK.sub("", _text(path))
    for name in re.findall(r"--config\.([A-Za-z_][\w.]*)", prose):
      name = name.rstrip(".")
      if name not in known and name not in MISTAKES:
        bad.append(f"{path}: --config.{name}")
  assert not bad, "flags that name no config field:\n" + "\n".join(bad)


@pytest.mark.unit
def test_docs_field_names_exist():
  """`probe.seed`, `means.checkpoint_every_batches`: a quoted field name of a config group
  (file names such as `report.json` aside) is a field; old names only as renamed."""
  known = _known() | set(config_schema.MOVED)
  groups = "|".join(k for k, v in config_schema.get_config().items() if hasattr(v, "items"))
  quoted = re.compile(rf"`(?:config\.)?((?:{groups}|suite|means)\.[a-z_][\w.]*)[=`]")
  files = (".json", ".csv", ".md", ".safetensors", ".py", ".npz", ".html", ".png")
  bad = [f"{path}: {name}" for path in DOCS for name in quoted.findall(_text(path))
         if name not in known and not name.endswith(files)]
  assert not bad, "names that are no config field:\n" + "\n".join(bad)


@pytest.mark.unit
@pytest.mark.parametrize("flag,message", [
    ("--config.probe.lerning_rate=1e-3", "lerning_rate"),
    ("--config.probe.epochs=many", "epochs"),
    ("--config.effective.other_model=x", "renamed"),
    ("--config.papa.orderings=lambda,sideways", "sideways"),
])
def test_invalid_docs_command_is_caught(flag, message):
  with pytest.raises(Exception, match=message):
    parse(["--config=configs/quickstart.py", flag])


@pytest.mark.unit
@pytest.mark.parametrize("flag,message", [
    ("--config.probe.lerning_rate=1e-3", r"--config\.probe\.lerning_rate: no such config "
     r"field; did you mean --config\.probe\.learning_rate\? The probe group has .*epochs"),
    ("--config.run.workdir=x", r"--config\.run\.workdir: no such config field.* The run group "
     r"has .*batch_size"),
    ("--config.nothing_like_it=1", r"--config\.nothing_like_it: no such config field\. Every "
     r"field: docs/config\.md\."),
])
def test_invalid_unknown_field_names_it_and_the_nearest(flag, message):
  """Before the flag parser (whose error is a traceback ending in AttributeError)."""
  with pytest.raises(ConfigError, match=message):
    config_schema.launcher_argv(["--config=configs/quickstart.py", flag])
  config_schema.launcher_argv(["--config.probe.learning_rate=1e-3", "--config.data=x"])
  # Fields the config file adds (the suite's per-task data folders) are fields too.
  config_schema.launcher_argv(["--config=configs/suite.py:models=minilm,tasks=sst2",
                               "--config.suite.data_dirs.sst2=/x"])
  with pytest.raises(ConfigError, match=r"did you mean --config\.suite\.data_dirs\.sst2\?"):
    config_schema.launcher_argv(["--config=configs/suite.py:models=minilm,tasks=sst2",
                                 "--config.suite.data_dir.sst2=/x"])


@pytest.mark.integration
def test_launcher_help_names_every_stage_and_command():
  """`launch/main.py --help` prints its docstring: it names every `config.stage` value."""
  from papa_jax import commands  # pylint: disable=import-outside-toplevel
  with open(os.path.join(ROOT, "launch", "main.py"), encoding="utf-8") as f:
    doc = ast.get_docstring(ast.parse(f.read()))
  missing = [n for n in commands.names() if not re.search(rf"\b{n}\b", doc)]
  assert not missing, f"launch/main.py's docstring does not name the stages {missing}"


OWN_DATA = [(w, a, t) for w, a, t in COMMANDS if "--config.data.task=custom" in a
            or not os.path.exists(os.path.join(ROOT, a[0].partition("=")[2].partition(":")[0]))]


@pytest.mark.unit
def test_docs_own_data_examples_are_found():
  assert {w.partition(":")[0] for w, _, _ in OWN_DATA} >= {"README.md", "docs/tasks.md"}


@pytest.mark.unit
@pytest.mark.parametrize("where,args,text", OWN_DATA, ids=[w for w, _, _ in OWN_DATA])
def test_docs_own_data_example_model_resolves_offline(where, args, text, tmp_path,
                                                      monkeypatch):
  """The examples a user adapts first (own data, a config written in the document) name a
  model that is there without a network (a hub id fails offline)."""
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  convert.resolve_model_dir(parse(args, text, tmp_path).model.name)
