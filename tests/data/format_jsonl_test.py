"""JSON Lines: one object per line, blank lines allowed, any label type."""

import pytest

from papa_jax import data
from tests.data.conftest import custom_config, variants, write

pytestmark = pytest.mark.unit

JSONL = ('{"q": "Is it?", "a": "Yes, \\"really\\".", "y": 1}\n'
         '\n'
         '{"a": "No.", "q": "Was it \\u00e9t\\u00e9?", "y": 0, "extra": [1, 2]}\n'
         '  \n'
         '{"q": "Line\\nbreak", "a": "ok", "y": 10}\n')


@pytest.mark.parametrize("variant", sorted(variants(JSONL)))
def test_format_jsonl_pairs_bom_line_ends_blank_lines(tmp_path, variant):
  write(tmp_path, "t.jsonl", variants(JSONL)[variant])
  cfg = custom_config(tmp_path, format="jsonl", train="t.jsonl", validation="t.jsonl",
                      text_fields=("q", "a"), label_field="y")
  task = data.resolve_task(cfg)
  assert task.is_pair and task.label_names == ("0", "1", "10")  # Numeric order.
  recs = data.load_records(cfg, "validation")
  assert [(r["text_a"], r["text_b"], task.label_names[r["label"]]) for r in recs] == [
      ("Is it?", 'Yes, "really".', "1"), ("Was it été?", "No.", "0"), ("Line\nbreak", "ok", "10")]


def test_format_jsonl_string_float_and_boolean_labels(tmp_path):
  write(tmp_path, "t.jsonl", '{"t": "a", "y": true}\n{"t": "b", "y": false}\n')
  write(tmp_path, "r.jsonl",
        '{"t": "a", "y": 0.25}\n{"t": "b", "y": "3"}\n{"t": "c", "y": -1e-3}\n')
  cfg = custom_config(tmp_path, format="jsonl", train="t.jsonl", validation="t.jsonl",
                      text_fields=("t",), label_field="y")
  assert data.resolve_task(cfg).label_names == ("false", "true")
  assert [r["label"] for r in data.load_records(cfg, "train")] == [1, 0]
  reg = custom_config(tmp_path, format="jsonl", kind="regression", train="r.jsonl",
                      validation="r.jsonl", text_fields=("t",), label_field="y")
  assert [r["label"] for r in data.load_records(reg, "train")] == [0.25, 3.0, -0.001]
  assert data.resolve_task(reg).metrics == ("pearson", "spearman")
