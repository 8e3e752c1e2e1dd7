"""Data errors a person can act on: each names the file and line, and what is wrong."""

import logging
import re

import pytest

from papa_jax import data
from papa_jax.data import conll, readers, textio
from tests.data.conftest import custom_config, write

pytestmark = pytest.mark.unit


def _csv(tmp_path, train, dev="text,label\nok,a\n", **custom):
  write(tmp_path, "train.csv", train)
  write(tmp_path, "dev.csv", dev)
  fields = dict(format="csv", train="train.csv", validation="dev.csv", text_fields=("text",),
                label_field="label")
  return custom_config(tmp_path, **{**fields, **custom})


def _raises(fn, *patterns):
  with pytest.raises(data.DataError) as e:
    fn()
  for p in patterns:
    assert re.search(p, str(e.value)), f"{p!r} not in {str(e.value)!r}"
  return str(e.value)


def test_invalid_missing_field_names_the_fields_found(tmp_path):
  cfg = _csv(tmp_path, "sentence,label\na,x\n")
  _raises(lambda: data.load_records(cfg, "train"),
          r"train\.csv:1: header \['sentence', 'label'\] lacks columns \['text'\] \(text_fields\)")
  write(tmp_path, "t.jsonl", '{"text": "a", "y": 1}\n{"txt": "b", "y": 0}\n')
  cfg = custom_config(tmp_path, format="jsonl", train="t.jsonl", validation="t.jsonl",
                      text_fields=("text",), label_field="y", label_names=("0", "1"))
  _raises(lambda: data.load_records(cfg, "train"),
          r"t\.jsonl:2: object lacks fields \['text'\]; it has \['txt', 'y'\]")


def test_invalid_unknown_label_names_label_and_label_set(tmp_path):
  cfg = _csv(tmp_path, "text,label\na,pos\nb,neg\n", "text,label\nc,pos\nd,neutral\n")
  _raises(lambda: data.load_records(cfg, "validation"),
          r"dev\.csv:3: label 'neutral' is not in the custom label set \['neg', 'pos'\]")
  write(tmp_path, "t.txt", "EU B-ORG\nrejects B-VERB\n")
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="t.txt",
                      validation="t.txt", label_names=("O", "B-ORG"))
  _raises(lambda: data.load_records(cfg, "train"),
          r"t\.txt:2: label 'B-VERB' is not in the custom label set \['O', 'B-ORG'\]")


def test_invalid_builtin_label_outside_label_set(tmp_path):
  write(tmp_path, "train.tsv", "sentence\tlabel\nfine\t1\nodd\t7\n")
  task = data.get_task("sst2")
  _raises(lambda: list(readers.read_split(task, str(tmp_path), "train")),
          r"train\.tsv:3: label '7' is not in the sst2 label set \['negative', 'positive'\] "
          r"\(or its id 0\.\.1\)")


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_invalid_undecodable_byte_names_line_offset_and_bytes(tmp_path, bom):
  body = "text,label\r\nfine,a\r\n".encode() + b"caf\xe9 au lait,b\r\n"
  write(tmp_path, "train.csv", bom + body)
  cfg = _csv(tmp_path, bom + body)
  offset = len(bom) + body.index(b"\xe9")
  _raises(lambda: data.load_records(cfg, "train"),
          rf"train\.csv:3: byte offset {offset}: b'\\xe9' is not valid UTF-8 "
          r"\(in b'.*caf\\xe9 au lait")
  # Every format reads through the same decoder; lone CRs count as line ends.
  path = write(tmp_path, "x.conllu", b"# a\r\r\n1\tx\t_\tX\t_\t_\t0\troot\t_\t_\n\xff\n")
  _raises(lambda: list(conll.read_conllu(str(path))), r"x\.conllu:4: byte offset 29: b'\\xff'")


def test_invalid_utf16_file_gets_a_hint(tmp_path):
  path = write(tmp_path, "t.csv", "text,label\n".encode("utf-16"))
  _raises(lambda: textio.read_text(str(path)), r"t\.csv:1: byte offset 0", "UTF-16 byte-order mark")


def test_invalid_empty_split(tmp_path):
  cfg = _csv(tmp_path, "")
  _raises(lambda: data.check_files(cfg, ("train",)), r"train\.csv is empty")
  cfg = _csv(tmp_path, "text,label\n\n", label_names=("a", "b"))
  _raises(lambda: data.load_records(cfg, "train"), r"train\.csv has no examples\.")
  cfg = _csv(tmp_path, b"\xef\xbb\xbf\r\n", label_names=("a", "b"))
  _raises(lambda: data.load_records(cfg, "train"), r"train\.csv has no examples")
  write(tmp_path, "t.conllu", "# only a comment\n\n")
  cfg = custom_config(tmp_path, format="conllu", kind="tagging", train="t.conllu",
                      validation="t.conllu")
  _raises(lambda: data.resolve_task(cfg), r"t\.conllu has no examples to collect")


def test_invalid_one_class_train_split(tmp_path):
  cfg = _csv(tmp_path, "text,label\na,pos\nb,pos\n", "text,label\nc,pos\n")
  _raises(lambda: data.resolve_task(cfg),
          r"train\.csv: the train split has one class only \('pos'\)")
  cfg.custom.label_names = ("neg", "pos")  # Listed labels: found when the split is read.
  _raises(lambda: data.load_records(cfg, "train"),
          r"train\.csv: the train split has one class only \('pos'\)")
  assert len(data.load_records(cfg, "validation")) == 1  # Other splits may have one.


def test_invalid_headerless_row_width(tmp_path):
  cfg = _csv(tmp_path, "src1,1,,a\nsrc2,0,*,b\nsrc3,1\n", "src,1,,c\n", header=False,
             text_fields=("3",), label_field="1")
  _raises(lambda: data.load_records(cfg, "train"),
          r"train\.csv:3: found 2 comma-separated fields; the first row \(line 1\) has 4")
  write(tmp_path, "t.tsv", "a\t1\nb\t0\tx\n")
  cfg = custom_config(tmp_path, format="tsv", header=False, train="t.tsv", validation="t.tsv",
                      text_fields=("0",), label_field="1")
  _raises(lambda: data.load_records(cfg, "train"),
          r"t\.tsv:2: found 3 tab-separated fields; the first row \(line 1\) has 2")
  cfg.custom.text_fields = ("5",)
  _raises(lambda: data.load_records(cfg, "train"),
          r"t\.tsv:1: text_fields \['5'\] are not column numbers .* has 2 fields \(0\.\.1\)")


def test_invalid_header_row_width(tmp_path):
  cfg = _csv(tmp_path, "text,label\na,x\nb,y,extra\n")
  _raises(lambda: data.load_records(cfg, "train"),
          r"train\.csv:3: found 3 comma-separated fields; the header \(line 1\) has 2")


@pytest.mark.parametrize("value,why", [
    ("high", "is not a number"), ("nan", "is not finite"), ("-inf", "is not finite"),
    ("", "empty label"), ("1e400", "is not finite"), ("infinity", "is not finite"),
    # Python's float() takes these; no data file writes a number so.
    ("1_0", "'1_0' is not a number"), ("\uff11", "is not a number"), ("0x10", "not a number"),
])
def test_invalid_regression_label(tmp_path, value, why):
  cfg = _csv(tmp_path, f"text,label\na,0.5\nb,{value}\n", kind="regression")
  _raises(lambda: data.load_records(cfg, "train"), rf"train\.csv:3: .*{why}")


def test_invalid_csv_quoting_is_strict(tmp_path):
  cfg = _csv(tmp_path, 'text,label\n"a"b,x\nc,y\n')
  _raises(lambda: data.load_records(cfg, "train"), r"train\.csv:2: .*expected after '\"'")
  cfg = _csv(tmp_path, 'text,label\na,x\n"never closed,y\nb,x\nc,y\n', skip_malformed=True)
  cfg.skip_malformed = True  # Even so: the rest of the file would be lost in one record.
  _raises(lambda: data.load_records(cfg, "train"), r"train\.csv:3: unexpected end of data "
          r"\(quoting: rfc4180\); the record runs on to line 5: is a quote left open\?")


@pytest.mark.parametrize("line,why", [
    ("{'t': 'a', 'y': 1}", r"not valid JSON \(Expecting property name"),
    ('["a", 1]', r'\["a", 1\] is not a JSON object'),
    ('{"t": ["a", "b"], "y": 1}', r"text fields must be strings; 't' is \[\"a\", \"b\"\]"),
    ('{"t": 3, "y": 1}', "text fields must be strings; 't' is 3"),
    ('{"t": "a", "y": null}', r"label field 'y' is null"),
    ('{"t": "a", "y": {"v": 1}}', r"label field 'y' is \{\"v\": 1\}"),
    ('{"t": "a", "y": NaN}', r"not valid JSON \(NaN is not a JSON value"),
    ('{"t": "a", "y": 1e400}', r"the number 1e400 is beyond a float's range"),
    ('{"t": "a", "y": 0, "y": 1}', r"an object repeats the names \['y'\]"),
    ('{"t": "a\\ud800", "y": 1}', r"field 't' holds a lone UTF-16 surrogate escape"),
    ('{"t": "a", "y": "\\udfff"}', r"field 'y' holds a lone UTF-16 surrogate escape"),
])
def test_invalid_jsonl_lines(tmp_path, line, why):
  write(tmp_path, "t.jsonl", '{"t": "ok", "y": 0}\n\n' + line + "\n")
  cfg = custom_config(tmp_path, format="jsonl", train="t.jsonl", validation="t.jsonl",
                      text_fields=("t",), label_field="y", label_names=("0", "1"))
  _raises(lambda: data.load_records(cfg, "train"), rf"t\.jsonl:3: {why}")


def test_invalid_empty_text(tmp_path):
  cfg = _csv(tmp_path, "text,label\n  ,x\nb,y\n")
  _raises(lambda: data.load_records(cfg, "train"), r"train\.csv:2: empty text in field 'text'")


def test_invalid_conll_columns(tmp_path):
  write(tmp_path, "t.txt", "-DOCSTART- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ O\n")
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="t.txt",
                      validation="t.txt", label_names=("O", "B-ORG"))
  _raises(lambda: data.load_records(cfg, "train"),
          r"t\.txt:4: found 3 columns; the first token line \(line 3\) has 4")
  write(tmp_path, "t.txt", "EU B-ORG\n")
  cfg.custom.tag_column = 2
  _raises(lambda: data.load_records(cfg, "train"), r"t\.txt:1: tag_column=2 but the first "
          r"token line has 2 columns")


@pytest.mark.parametrize("line,why", [
    ("2\tb\tb\tNOUN\t_\t_\t1\tdep\t_", "found 9 tab-separated fields, CoNLL-U has 10"),
    ("2 b b NOUN _ _ 1 dep _ _", r"found 1 tab-separated fields.*separated by tabs"),
    ("3\tb\tb\tNOUN\t_\t_\t1\tdep\t_\t_", r"word ID '3' where 2 was expected \(IDs run 1\.\.n"),
    ("2\tb\tb\t_\t_\t_\t1\tdep\t_\t_", r"UPOS is '_': this file has no UPOS tag for the word 'b'"),
    ("2\t\tb\tNOUN\t_\t_\t1\tdep\t_\t_", "FORM '' is not a word"),
    ("2\t \tb\tNOUN\t_\t_\t1\tdep\t_\t_", "FORM ' ' is not a word"),
    ("2\tb\tb\t \t_\t_\t1\tdep\t_\t_", "UPOS is ''"),
    ("two\tb\tb\tNOUN\t_\t_\t1\tdep\t_\t_", r"word ID 'two'"),
])
def test_invalid_conllu_lines(tmp_path, line, why):
  write(tmp_path, "t.conllu", f"# sent_id = 1\n1\ta\ta\tDET\t_\t_\t2\tdet\t_\t_\n{line}\n")
  _raises(lambda: data.load_records(_conllu(tmp_path), "train"), rf"t\.conllu:3: {why}")


def _conllu(tmp_path, **custom):
  return custom_config(tmp_path, format="conllu", kind="tagging", train="t.conllu",
                       validation="t.conllu", label_names=("DET", "NOUN", "X"), **custom)


def test_invalid_conllu_xpos_missing_and_text_withheld(tmp_path):
  write(tmp_path, "t.conllu", "1\ta\ta\tDET\t_\t_\t0\troot\t_\t_\n")
  _raises(lambda: data.load_records(_conllu(tmp_path, tag_field="xpos"), "train"),
          r"t\.conllu:1: XPOS is '_'.*try tag_field='upos'")
  write(tmp_path, "t.conllu",
        "1\t_\t_\tDET\t_\t_\t0\troot\t_\t_\n\n1\t_\t_\tX\t_\t_\t0\troot\t_\t_\n")
  _raises(lambda: data.load_records(_conllu(tmp_path), "train"), r"t\.conllu: every FORM is '_'")


def test_invalid_skip_malformed_skips_and_counts(tmp_path, caplog):
  cfg = _csv(tmp_path, 'text,label\na,x\nb\n"c"d,x\n,y\ne,y\nf,z\n', label_names=("x", "y"),
             skip_malformed=True)
  cfg.skip_malformed = True
  with caplog.at_level(logging.WARNING):
    recs = data.load_records(cfg, "train")
  assert [(r["idx"], r["text_a"]) for r in recs] == [(0, "a"), (1, "e")]
  assert "custom/train: skipped 4 malformed examples" in caplog.text
  write(tmp_path, "t.txt", "a O\nb O x\n\nc O\nd\n\ne O\n")
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="t.txt", validation="t.txt")
  cfg.skip_malformed = True
  assert [r["tokens"] for r in data.load_records(cfg, "train")] == [["e"]]
  cfg.skip_malformed = False
  _raises(lambda: data.load_records(cfg, "train"), r"t\.txt:2: found 3 columns")


@pytest.mark.parametrize("content,line,why", [
    (b"text,label\nh,\x00\nw,b\n", 2, r"byte offset 13: a NUL byte.*must be UTF-8 text"),
    ("text,label\nh,a\nw,b\n".encode("utf-16-le"), 1,
     r"byte offset 1: a NUL byte.*looks like UTF-16 \(without a byte-order mark\)"),
])
def test_invalid_nul_byte_names_line_and_offset(tmp_path, content, line, why):
  """A NUL read as text became part of a label (a class of its own) or a text."""
  cfg = _csv(tmp_path, content)
  _raises(lambda: data.load_records(cfg, "train"), rf"train\.csv:{line}: {why}")
  write(tmp_path, "t.txt", b"EU B-ORG\x00\nrejects O\n")
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="t.txt",
                      validation="t.txt")
  _raises(lambda: data.resolve_task(cfg), r"t\.txt:1: byte offset 8: a NUL byte")


def test_invalid_header_repeated_mid_file(tmp_path):
  """Two CSV files joined with `cat`: the second header would be an example of class
  'label'."""
  cfg = _csv(tmp_path, "text,label\nh,a\nw,b\ntext,label\nx,a\n")
  _raises(lambda: data.resolve_task(cfg), r"train\.csv:4: the header again \(line 1\)")
  cfg.skip_malformed = True
  assert data.resolve_task(cfg).label_names == ("a", "b")


def test_tags_are_stripped_like_every_label(tmp_path):
  """`B-ORG ` (a tab-separated CoNLL column, a CoNLL-U UPOS) was a class apart from
  `B-ORG`, and an entity type `ORG ` apart from `ORG`."""
  write(tmp_path, "t.txt", "EU\tB-ORG \nrejects\tO\n\nUN\tB-ORG\n\n")
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="t.txt",
                      validation="t.txt", separator="tab")
  task = data.resolve_task(cfg)
  assert task.label_names == ("B-ORG", "O") and "f1" in task.metrics
  assert [r["tags"] for r in data.load_records(cfg, "train")] == [[0, 1], [0]]
  write(tmp_path, "t.conllu", "1\ta\ta\tDET \t_\t_\t2\tdet\t_\t_\n"
        "2\tb\tb\tNOUN\t_\t_\t0\troot\t_\t_\n\n1\tc\tc\tDET\t_\t_\t0\troot\t_\t_\n")
  cfg = custom_config(tmp_path, format="conllu", kind="tagging", train="t.conllu",
                      validation="t.conllu")
  assert data.resolve_task(cfg).label_names == ("DET", "NOUN")


def test_skip_malformed_never_drops_evaluation_examples_for_their_label(tmp_path):
  """Dropping dev examples of a class the train split lacks scored a different dev set."""
  cfg = _csv(tmp_path, "text,label\na,a\nb,b\nz,c\n", "text,label\nz,a\ny,c\nx,c\n",
             label_names=("a", "b"))
  cfg.skip_malformed = True
  assert [r["text_a"] for r in data.load_records(cfg, "train")] == ["a", "b"]  # Train: skipped.
  _raises(lambda: data.load_records(cfg, "validation"),
          r"dev\.csv:3: label 'c' is not in the custom label set \['a', 'b'\]\. Not skipped "
          r"by skip_malformed.*data\.custom\.label_names")
  write(tmp_path, "t.txt", "EU B-ORG\nrejects O\n\n")
  write(tmp_path, "d.txt", "UN B-ORG\n\nParis B-LOC\n\n")
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="t.txt",
                      validation="d.txt")
  cfg.skip_malformed = True
  _raises(lambda: data.load_records(cfg, "validation"), r"d\.txt:3: label 'B-LOC'.*Not skipped")


def test_a_few_non_iob_tags_are_named_when_they_switch_the_default_metric(tmp_path, caplog):
  write(tmp_path, "t.txt", "EU B-\nrejects O\n\nPeter B-PER\nBlackburn I-PER\n\n")
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="t.txt",
                      validation="t.txt")
  with caplog.at_level(logging.WARNING):
    assert data.resolve_task(cfg).metrics == ("accuracy",)
  assert "its tags are IOB but for ['B-'], so its default metric is token accuracy" in (
      caplog.text)
  caplog.clear()
  write(tmp_path, "t.txt", "EU NNP\nrejects VBZ\n\n")  # POS tags: no warning.
  with caplog.at_level(logging.WARNING):
    data.resolve_task(cfg)
  assert "IOB" not in caplog.text
