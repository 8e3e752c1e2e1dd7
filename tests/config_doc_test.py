"""docs/config.md is the generator's output, and every field it lists is described."""

import os

import pytest

from papa_jax.config import doc as config_doc, fields as config_fields, schema as config_schema

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _leaves(fields, prefix=""):
  for name, f in fields.items():
    if isinstance(f, config_fields.Group):
      assert f.doc.strip(), f"group {prefix}{name} has no description"
      yield from _leaves(f.fields, f"{prefix}{name}.")
    else:
      yield f"{prefix}{name}", f


def test_config_doc_is_up_to_date():
  with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
    written = f.read()
  assert written == config_doc.render(), (
      "docs/config.md is stale: run `python -m papa_jax.config.doc > docs/config.md`.")


def test_config_doc_lists_every_field_with_a_description():
  text = config_doc.render()
  leaves = dict(_leaves(config_fields.FIELDS))
  assert sorted(leaves) == sorted(config_schema._flat(config_schema.get_config().to_dict()))
  for name, f in leaves.items():
    assert f.doc.strip() and f.doc.strip()[-1] in ".)", f"{name}: write a one-line description"
    assert f"| `{name}` |" in text
