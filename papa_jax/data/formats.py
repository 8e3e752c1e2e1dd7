"""Every data format, by name: the one list the readers, the declaration checks and the config
read (`FORMATS`).

A format is one `DataFormat` record: how its files are read into examples (`tables`,
`conll`), which task kinds they hold, which `data.custom` fields declare it and how those
are checked before any file is opened. `readers.raw_examples` reads a task's file by its
record, `declare.custom_task` checks a declaration by it, and the config's list
(`config_fields.DATA_FORMATS`) equals its names (tests/data/formats_test.py). Adding a
format is one reader and one entry here (docs/tasks.md, "Adding a format").
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterator

from papa_jax.data import conll, tables
from papa_jax.data.errors import DataError, TaskConfigError
from papa_jax.data.tasks import Task

Example = tables.TextRow | conll.TagSentence


@dataclasses.dataclass(frozen=True)
class DataFormat:
  """One file format.

  Attributes:
    name: `data.custom.format` (and `Task.format`).
    kinds: the task kinds its files hold (`tasks.KINDS`).
    holds: what a file of it holds, for the error when a declared kind is not in `kinds`.
    read: `(task, path)` -> the file's examples with their labels as written (`TextRow`s or
      `TagSentence`s), and a `DataError` in place of each malformed one (`raw_examples`).
    fields: the `data.custom` fields (`Task` attributes of the same names) it reads, beyond
      the splits, labels and metrics every format has.
    needs: of `fields`, those a declaration must set. A field another format needs is
      refused where it does not apply (text_fields for a CoNLL file).
    source: where its examples come from, for that refusal.
    check: `(block, name)`: raises `TaskConfigError` naming the first field of `fields`
      that cannot work (static: no file is opened).
  """

  name: str
  kinds: tuple[str, ...]
  holds: str
  read: Callable[[Task, str], Iterator[Example | DataError]]
  fields: tuple[str, ...]
  needs: tuple[str, ...]
  source: str
  check: Callable[[object, str], None]


def field_error(field: str, value, why: str) -> TaskConfigError:
  """The error of one `data.custom` field: its name, its value, why it cannot work."""
  return TaskConfigError(f"data.custom.{field}={value!r}: {why}")


def strings(field: str, value) -> tuple[str, ...]:
  if isinstance(value, str) or not all(isinstance(v, str) for v in value):
    raise field_error(field, value, "must be a tuple of strings, e.g. ('a', 'b').")
  return tuple(value)


def _check_row_fields(c, fmt: str) -> tuple[str, ...]:
  """text_fields and label_field of a row format (one or two texts, one label)."""
  fields = strings("text_fields", c.text_fields)
  if len(fields) not in (1, 2):
    raise field_error("text_fields", fields, "name one text field (single sentence) or two "
                      "(a pair).")
  if not c.label_field:
    raise field_error("label_field", c.label_field, f"a {fmt} task needs its label's field.")
  if len(set(fields + (c.label_field,))) != len(fields) + 1:
    raise field_error("text_fields", fields, f"repeats a field (label_field={c.label_field!r}).")
  return fields


def _bad_quoting(c) -> TaskConfigError:
  return field_error("quoting", c.quoting, "use '' (the format's default), 'rfc4180' or 'none' "
                     "(csv and tsv only).")


def _check_table(c, fmt: str) -> None:
  fields = _check_row_fields(c, fmt)
  if not c.header:
    for name, values in (("text_fields", fields), ("label_field", (c.label_field,))):
      if not all(re.fullmatch(r"[0-9]+", v) for v in values):
        raise field_error(name, c[name], "without a header, fields are 0-based column "
                          "numbers written as strings, e.g. ('3',).")
  if c.quoting not in ("", *tables.QUOTING):
    raise _bad_quoting(c)


def _check_jsonl(c, fmt: str) -> None:
  _check_row_fields(c, fmt)
  if c.quoting:
    raise _bad_quoting(c)


def _check_conll(c, fmt: str) -> None:
  if c.separator not in conll.SEPARATORS:
    raise field_error("separator", c.separator, f"use one of {list(conll.SEPARATORS)}.")


def _check_conllu(c, fmt: str) -> None:
  if c.tag_field not in conll.CONLLU_TAG_FIELDS:
    raise field_error("tag_field", c.tag_field, f"use one of {list(conll.CONLLU_TAG_FIELDS)}.")


def _read_table(task: Task, path: str) -> Iterator[tables.TextRow | DataError]:
  return tables.read_table(path, task.format, header=task.header, quoting=task.quoting,
                           text_fields=task.text_fields, label_field=task.label_field)


def _read_jsonl(task: Task, path: str) -> Iterator[tables.TextRow | DataError]:
  return tables.read_jsonl(path, text_fields=task.text_fields, label_field=task.label_field)


def _read_conll(task: Task, path: str) -> Iterator[conll.TagSentence | DataError]:
  return conll.read_conll(path, token_column=task.token_column, tag_column=task.tag_column,
                          separator=task.separator)


def _read_conllu(task: Task, path: str) -> Iterator[conll.TagSentence | DataError]:
  return conll.read_conllu(path, tag_field=task.tag_field)


_ROWS = dict(kinds=("classification", "regression"), holds="texts with labels",
             needs=("text_fields", "label_field"),
             source="texts and labels are read from text_fields and label_field")
_TAGS = dict(kinds=("tagging",), holds="tagged tokens", needs=())

FORMATS: dict[str, DataFormat] = {f.name: f for f in (
    DataFormat("csv", read=_read_table, check=_check_table,
               fields=("text_fields", "label_field", "header", "quoting"), **_ROWS),
    DataFormat("tsv", read=_read_table, check=_check_table,
               fields=("text_fields", "label_field", "header", "quoting"), **_ROWS),
    DataFormat("jsonl", read=_read_jsonl, check=_check_jsonl,
               fields=("text_fields", "label_field"), **_ROWS),
    DataFormat("conll", read=_read_conll, check=_check_conll,
               fields=("token_column", "tag_column", "separator"),
               source="tokens and tags are read from token_column and tag_column", **_TAGS),
    DataFormat("conllu", read=_read_conllu, check=_check_conllu, fields=("tag_field",),
               source="tokens and tags are read from FORM and tag_field", **_TAGS),
)}
# Every format's fields: a declared task's `Task` takes them from its `data.custom` block.
OPTIONS = tuple(dict.fromkeys(n for f in FORMATS.values() for n in f.fields))
# The fields some format needs: set for a format that does not read them, they are refused.
NEEDED = tuple(dict.fromkeys(n for f in FORMATS.values() for n in f.needs))


def check_kind(name: str, kind: str) -> None:
  """A declared kind its (registered) format's files can hold."""
  fmt = FORMATS[name]
  if kind not in fmt.kinds:
    raise field_error("kind", kind, f"a {name} file holds {fmt.holds}: use kind="
                      + " or ".join(repr(k) for k in fmt.kinds) + ".")


def check_fields(c) -> None:
  """The format's own fields of a `data.custom` block, and no field it does not read that
  another format needs."""
  fmt = FORMATS[c.format]
  stray = [f for f in NEEDED if f not in fmt.fields and c[f]]
  if stray:
    raise field_error(stray[0], c[stray[0]], f"does not apply to {fmt.name}: {fmt.source}.")
  fmt.check(c, fmt.name)

