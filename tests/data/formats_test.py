"""Every registered data format (`formats.FORMATS`): its sample reads through `raw_examples`
and `load_records`, its declaration checks follow its record, and the config lists it."""

import dataclasses

import pytest

from papa_jax import data
from papa_jax.config import fields as config_fields, schema as config_schema
from papa_jax.data import conll, formats, readers, tables, tasks
from tests.data.conftest import custom_config, write

pytestmark = pytest.mark.unit


@dataclasses.dataclass(frozen=True)
class Sample:
  """A small file of one format, the `data.custom` fields that declare it, and what it holds:
  per example its texts and label, or its tokens and tags, as written."""

  text: str
  custom: dict
  want: list


_CONLLU = "{}\t{}\t_\t{}\t{}\t_\t_\t_\t_\t_\n"
# One per registered format: a format without a sample here fails
# test_formats_every_format_has_a_sample.
SAMPLES = {
    "csv": Sample('text,label\n"fine, witty film",pos\ndull,neg\n',
                  dict(kind="classification", text_fields=("text",), label_field="label"),
                  [(("fine, witty film",), "pos"), (("dull",), "neg")]),
    "tsv": Sample("a\tb\tscore\nfine film\ta \"good\" one\t4.5\ndull\tbad\t1\n",
                  dict(kind="regression", text_fields=("a", "b"), label_field="score"),
                  [(("fine film", 'a "good" one'), "4.5"), (("dull", "bad"), "1")]),
    "jsonl": Sample('{"text": "fine film", "label": 1}\n\n{"text": "dull", "label": 0}\n',
                    dict(kind="classification", text_fields=("text",), label_field="label"),
                    [(("fine film",), "1"), (("dull",), "0")]),
    "conll": Sample("-DOCSTART- O\n\nfine JJ B-X\nfilm NN I-X\n\ndull JJ O\n",
                    dict(kind="tagging", text_fields=(), label_field=""),
                    [(("fine", "film"), ("B-X", "I-X")), (("dull",), ("O",))]),
    "conllu": Sample("# text = fine film\n" + _CONLLU.format(1, "fine", "ADJ", "JJ")
                     + _CONLLU.format(2, "film", "NOUN", "NN") + "\n"
                     + _CONLLU.format(1, "dull", "ADJ", "JJ"),
                     dict(kind="tagging", text_fields=(), label_field="", tag_field="xpos"),
                     [(("fine", "film"), ("JJ", "NN")), (("dull",), ("JJ",))]),
}


def _config(tmp_path, name: str, **fields):
  sample = SAMPLES[name]
  write(tmp_path, f"t.{name}", sample.text)
  return custom_config(tmp_path, format=name, train=f"t.{name}", validation=f"t.{name}",
                       **{**sample.custom, **fields})


def test_formats_config_choice_list_is_the_registry():
  assert config_fields.DATA_FORMATS == config_schema.DATA_FORMATS == tuple(formats.FORMATS)
  kind_doc = config_fields.FIELDS["data"].fields["custom"].fields["kind"].doc
  assert all(name in kind_doc for name in formats.FORMATS), kind_doc
  with pytest.raises(data.TaskConfigError, match=r"use one of \[" + ", ".join(
      f"'{n}'" for n in formats.FORMATS) + r"\]"):
    data.check_config(custom_config(".", format="xlsx", train="t", validation="v"))


def test_formats_every_format_has_a_sample():
  assert set(SAMPLES) == set(formats.FORMATS)


@pytest.mark.parametrize("name", list(formats.FORMATS))
def test_formats_sample_reads_through_raw_examples(tmp_path, name):
  cfg = _config(tmp_path, name)
  task = data.check_config(cfg)
  assert task.format == name and task.kind in formats.FORMATS[name].kinds
  examples = list(readers.raw_examples(task, str(tmp_path / f"t.{name}")))
  got = [(ex.texts, ex.label) if isinstance(ex, tables.TextRow) else (ex.tokens, ex.tags)
         for ex in examples]
  assert got == SAMPLES[name].want
  # Tagged sentences are what the tagging kind reads (and only it); rows are every other kind's.
  tagging = formats.FORMATS[name].kinds == ("tagging",)
  assert "tagging" not in formats.FORMATS[name].kinds or tagging
  assert all(isinstance(ex, conll.TagSentence) == tagging for ex in examples)
  records = data.load_records(cfg, "validation")  # Labels collected, ids given, checked.
  assert len(records) == len(SAMPLES[name].want)


@pytest.mark.parametrize("name", list(formats.FORMATS))
def test_formats_record_fields_are_declaration_fields(name):
  fmt = formats.FORMATS[name]
  block = config_fields.FIELDS["data"].fields["custom"].fields
  task_fields = {f.name for f in dataclasses.fields(tasks.Task)}
  assert fmt.name == name and set(fmt.kinds) <= set(tasks.KINDS) and fmt.kinds
  assert set(fmt.needs) <= set(fmt.fields) <= set(block) & task_fields
  assert set(formats.NEEDED) <= set(formats.OPTIONS) <= set(block) & task_fields


@pytest.mark.parametrize("name", list(formats.FORMATS))
def test_formats_declaration_refuses_a_kind_or_field_it_does_not_read(tmp_path, name):
  fmt = formats.FORMATS[name]
  for kind in sorted(set(tasks.KINDS) - set(fmt.kinds)):
    with pytest.raises(data.TaskConfigError, match=rf"kind='{kind}': a {name} file holds "
                       rf"{fmt.holds}"):
      data.check_config(_config(tmp_path, name, kind=kind))
  for field in sorted(set(formats.NEEDED) - set(fmt.fields)):
    with pytest.raises(data.TaskConfigError, match=rf"data\.custom\.{field}=.*: does not apply "
                       rf"to {name}: {fmt.source}\."):
      data.check_config(_config(tmp_path, name, **{field: ("x",) if field.endswith("s") else "x"}))
  for field in fmt.needs:
    with pytest.raises(data.TaskConfigError, match=rf"data\.custom\.{field}="):
      data.check_config(_config(tmp_path, name, **{field: type(SAMPLES[name].custom[field])()}))


def test_formats_every_builtin_task_has_a_registered_format_and_kind():
  for task in tasks.TASKS.values():
    assert task.kind in formats.FORMATS[task.format].kinds, task.name


def test_formats_unknown_format_of_a_task_is_a_data_error(tmp_path):
  task = dataclasses.replace(tasks.TASKS["sst2"], format="parquet")
  with pytest.raises(data.DataError, match=r"Task sst2: unknown format 'parquet'"):
    readers.raw_examples(task, str(tmp_path / "x"))
