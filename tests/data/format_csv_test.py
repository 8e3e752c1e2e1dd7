"""CSV (RFC 4180) and TSV (GLUE: no quoting), with and without a header."""

import pytest

from papa_jax import data
from papa_jax.data import tables
from tests.data.conftest import custom_config, variants, write

pytestmark = pytest.mark.unit

CSV = 'id,text,label\n1,"Hello, world",pos\n2,"She said ""hi""",neg\n3,plain text,pos\n'
WANT = [("Hello, world", "pos"), ('She said "hi"', "neg"), ("plain text", "pos")]


def _texts_labels(cfg, split="train"):
  task = data.resolve_task(cfg)
  return [(r["text_a"], task.label_names[r["label"]]) for r in data.load_records(cfg, split)]


@pytest.mark.parametrize("variant", sorted(variants(CSV)))
def test_format_csv_bom_line_ends_and_quoting(tmp_path, variant):
  write(tmp_path, "t.csv", variants(CSV)[variant])
  cfg = custom_config(tmp_path, format="csv", train="t.csv", validation="t.csv",
                      text_fields=("text",), label_field="label")
  assert _texts_labels(cfg) == WANT
  assert data.resolve_task(cfg).label_names == ("neg", "pos")


def test_format_csv_quoted_newline_keeps_line_numbers(tmp_path):
  # The record from line 3 spans lines 3-5; the row after it is line 6.
  text = 'text,label\nfirst,pos\n"two\nline ""field""\n, with comma",neg\nlast,pos\nbad,maybe\n'
  write(tmp_path, "t.csv", "text,label\nx,pos\ny,neg\n")
  write(tmp_path, "v.csv", text)
  cfg = custom_config(tmp_path, format="csv", train="t.csv", validation="v.csv",
                      text_fields=("text",), label_field="label")
  with pytest.raises(data.DataError, match=r"v\.csv:7: label 'maybe' is not in"):
    data.load_records(cfg, "validation")
  rows = list(tables.read_table(str(tmp_path / "v.csv"), "csv", header=True, quoting="",
                                text_fields=("text",), label_field="label"))
  assert [(r.line, r.texts[0]) for r in rows] == [
      (2, "first"), (3, 'two\nline "field"\n, with comma'), (6, "last"), (7, "bad")]


def test_format_csv_crlf_inside_quotes_is_kept_and_counted(tmp_path):
  path = write(tmp_path, "t.csv", b'text,label\r\n"a\r\nb",pos\r\nc,neg\r\n')
  rows = list(tables.read_table(str(path), "csv", header=True, quoting="",
                                text_fields=("text",), label_field="label"))
  assert [(r.line, r.texts[0], r.label) for r in rows] == [(2, "a\r\nb", "pos"), (4, "c", "neg")]


def test_format_csv_without_header_by_column_number(tmp_path):
  # Labels are compared without surrounding spaces; a trailing blank line is skipped.
  write(tmp_path, "t.csv", '"a, b",x, 1\nc,"y",0 \n\n')
  cfg = custom_config(tmp_path, format="csv", header=False, train="t.csv", validation="t.csv",
                      text_fields=("0", "1"), label_field="2")
  recs = data.load_records(cfg, "train")
  assert [(r["text_a"], r["text_b"], r["label"]) for r in recs] == [("a, b", "x", 1), ("c", "y", 0)]
  assert data.resolve_task(cfg).is_pair


def test_format_tsv_default_no_quoting_keeps_quotes(tmp_path):
  # GLUE TSV (MRPC): a field may start with a quote and hold an odd number of them.
  write(tmp_path, "t.tsv", 'label\ts\n1\t"Quoted" start and 5" end\n0\t"unclosed\n')
  cfg = custom_config(tmp_path, format="tsv", train="t.tsv", validation="t.tsv",
                      text_fields=("s",), label_field="label")
  recs = data.load_records(cfg, "train")
  assert [r["text_a"] for r in recs] == ['"Quoted" start and 5" end', '"unclosed']


def test_format_tsv_rfc4180_quoting_when_declared(tmp_path):
  write(tmp_path, "t.tsv", 's\tlabel\n"a\tb ""c"""\t1\nplain\t0\n')
  cfg = custom_config(tmp_path, format="tsv", quoting="rfc4180", train="t.tsv",
                      validation="t.tsv", text_fields=("s",), label_field="label")
  assert [r["text_a"] for r in data.load_records(cfg, "train")] == ['a\tb "c"', "plain"]
