"""Every name docs/coming_from.md gives exists, with the keywords it shows."""

import dataclasses
import importlib
import inspect
import os
import re

import typing

import pytest
from flax import linen as nn

import papa_jax as pj
from papa_jax.attention import Intervention
from papa_jax.convert import Pretrained
from papa_jax.data.preprocess import Encoded
from papa_jax.interventions import ProbsFn
from papa_jax.models.encoder import Encoder
from papa_jax.papa.means import Means

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(ROOT, "docs", "coming_from.md"), encoding="utf-8") as _f:
  TEXT = _f.read()
CODE = re.findall(r"`([^`]+)`", TEXT)
# The objects the page's variables stand for.
OBJECTS = {"pj": pj, "m": Pretrained, "out": pj.EncoderOutput, "enc": Encoded, "means": Means}


def _resolve(dotted: str):
  head, *rest = dotted.split(".")
  if head == "papa_jax":
    for i in range(len(rest), 0, -1):  # The longest importable module, then attributes.
      try:
        obj, rest = importlib.import_module(".".join(["papa_jax", *rest[:i]])), rest[i:]
        break
      except ImportError:
        continue
  else:
    obj = OBJECTS[head]
  for part in rest:
    if isinstance(obj, type) and part == "apply" and issubclass(obj, (nn.Module, Pretrained)):
      obj = Encoder.__call__  # `apply(ids, mask, **kwargs)` passes them on to the encoder.
    elif dataclasses.is_dataclass(obj) and part in {f.name for f in dataclasses.fields(obj)}:
      obj = None  # A field without a class default: it exists.
    else:
      obj = getattr(obj, part)  # AttributeError names the missing one.
    if isinstance(obj, property):
      obj = typing.get_type_hints(obj.fget)["return"]
  return obj


def _params(obj) -> set[str]:
  if dataclasses.is_dataclass(obj):
    return {f.name for f in dataclasses.fields(obj)}
  return set(inspect.signature(obj).parameters)


def _calls():
  """(callable, its keywords) for every call written, nested ones too."""
  for code in CODE:
    for m in re.finditer(r"\b((?:pj|m|out|enc|means|papa_jax)(?:\.\w+)+)\(", code):
      depth, i = 1, m.end()
      while depth and i < len(code):
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
      top = code[m.end():i - 1]
      while re.search(r"\([^()]*\)", top):  # Keywords of nested calls are theirs.
        top = re.sub(r"\([^()]*\)", "", top)
      yield m.group(1), set(re.findall(r"(?<![=\w])(\w+)=", top))


def test_coming_from_names_exist():
  names = {n for code in CODE for n in re.findall(r"\b(?:pj|m|out|enc|means|papa_jax)"
                                                    r"(?:\.\w+)+", code)}
  assert len(names) > 25
  for name in sorted(names):
    _resolve(name)


@pytest.mark.parametrize("name,keywords", sorted((n, tuple(sorted(k))) for n, k in _calls()))
def test_coming_from_keywords_exist(name, keywords):
  unknown = set(keywords) - _params(_resolve(name))
  assert not unknown, f"{name} takes no {sorted(unknown)}"


def test_coming_from_capture_fields_and_contracts():
  row = next(line for line in TEXT.splitlines() if "`Capture` fields" in line)
  fields = {f.name for f in dataclasses.fields(pj.Capture)}
  named = {c for c in re.findall(r"`([a-z_]+)`", row.split("|")[2])}
  assert named and named <= fields, named - fields
  assert list(inspect.signature(ProbsFn.__call__).parameters) == [
      "self", "probs", "mask", "layer", "values"]  # fn(probs, mask, *, layer, values)
  assert "site" in Intervention.__annotations__ and callable(Intervention.__call__)
  assert [s for s in ("values", "probs", "context") if f"`{s}`" in TEXT] == [
      "values", "probs", "context"]
