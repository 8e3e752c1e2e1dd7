"""Row formats: CSV and TSV (with or without a header) and JSON Lines.

Each reader yields a `TextRow` per example, or a `DataError` for a malformed
row (the caller raises it or, with `skip_malformed`, counts it), and raises at
once for what no row can survive (a header without the declared columns).

Quoting: CSV follows RFC 4180 (quoted fields hold delimiters, doubled quotes
and line breaks), read strictly, so `"a"b` is an error rather than a silently
merged field. TSV has no quoting by default, as GLUE's files (MRPC sentences
contain `"`). Completely blank lines are skipped.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import re
from typing import Iterator, Sequence

from papa_jax.data import textio
from papa_jax.data.errors import DataError

# Long texts (documents) exceed the csv module's default 128 KiB field limit.
csv.field_size_limit(1 << 24)

QUOTING = {"rfc4180": csv.QUOTE_MINIMAL, "none": csv.QUOTE_NONE}
DEFAULT_QUOTING = {"csv": "rfc4180", "tsv": "none"}
DELIMITER = {"csv": ",", "tsv": "\t"}


@dataclasses.dataclass(frozen=True)
class TextRow:
  """One example: its first line in the file, its one or two texts, its raw label."""

  line: int
  texts: tuple[str, ...]
  label: str


def _records(path: str, fmt: str, quoting: str) -> Iterator[tuple[int, list[str] | DataError]]:
  """(first line, fields) of every CSV/TSV record, or a DataError for bad quoting."""
  quoting = quoting or DEFAULT_QUOTING[fmt]
  reader = csv.reader(io.StringIO(textio.read_text(path), newline=""),
                      delimiter=DELIMITER[fmt], quotechar='"', doublequote=True,
                      quoting=QUOTING[quoting], strict=True)
  end = 0  # Lines read so far: a quoted field may span several.
  while True:
    start = end + 1
    try:
      row = next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      end = reader.line_num
      if end > start:  # Later record boundaries cannot be trusted: never skip this one.
        raise DataError(f"{path}:{start}: {e} (quoting: {quoting}); the record runs on to "
                        f"line {end}: is a quote left open?") from None
      yield start, DataError(f"{path}:{start}: {e} (quoting: {quoting}).")
      continue
    end = reader.line_num
    if row:  # [] is a blank line.
      yield start, row


def _columns(where: str, header: list[str] | None, fields: Sequence[str], width: int,
             config_field: str) -> list[int]:
  """Column numbers of the named (header) or numbered (no header) fields."""
  if header is None:
    bad = [f for f in fields if not re.fullmatch(r"[0-9]+", f) or int(f) >= width]
    if bad:
      raise DataError(f"{where}: {config_field} {bad} are not column numbers of this "
                      f"header-less file, whose first row has {width} fields (0..{width - 1}).")
    return [int(f) for f in fields]
  missing = [f for f in fields if f not in header]
  if missing:
    raise DataError(f"{where}: header {header} lacks columns {missing} ({config_field}).")
  repeated = [f for f in fields if header.count(f) > 1]
  if repeated:
    raise DataError(f"{where}: header {header} names columns {repeated} more than once.")
  return [header.index(f) for f in fields]


def read_table(path: str, fmt: str, *, header: bool, quoting: str, text_fields: Sequence[str],
               label_field: str) -> Iterator[TextRow | DataError]:
  """Rows of a CSV or TSV file (`fmt`), fields by header name or column number."""
  records = _records(path, fmt, quoting)
  first = next(records, None)
  if first is None:
    return
  first_line, first_row = first
  if isinstance(first_row, DataError):  # Every later row is measured against it.
    raise first_row
  names = first_row if header else None
  width = len(first_row)
  where = f"{path}:{first_line}"
  text_cols = _columns(where, names, text_fields, width, "text_fields")
  label_col = _columns(where, names, [label_field], width, "label_field")[0]
  rows = records if header else itertools.chain([first], records)
  for line, row in rows:
    if isinstance(row, DataError):
      yield row
    elif header and row == first_row:
      yield DataError(f"{path}:{line}: the header again (line {first_line}): are two files "
                      "joined here?")
    elif len(row) != width:
      what = "header" if header else "first row"
      yield DataError(f"{path}:{line}: found {len(row)} {_sep(fmt)}-separated fields; the "
                      f"{what} (line {first_line}) has {width}.")
    else:
      yield TextRow(line, tuple(row[c] for c in text_cols), row[label_col])


def _sep(fmt: str) -> str:
  return "tab" if fmt == "tsv" else "comma"


def _json_label(value) -> str | None:
  """The label as text: JSON spelling for numbers and booleans; None if not a label."""
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, int):
    return str(value)
  if isinstance(value, float) and math.isfinite(value):
    return repr(value)
  if isinstance(value, str):
    return value
  return None


def _show(value) -> str:
  text = json.dumps(value, ensure_ascii=False)
  return text if len(text) <= 80 else text[:77] + "..."


def _reject_constant(name: str):
  # Python's json accepts NaN and Infinity, which RFC 8259 does not.
  raise ValueError(f"{name} is not a JSON value")  # internal check


class _Unreadable(ValueError):
  """Valid JSON that has no faithful Python reading (the message says why)."""


def _finite_float(text: str) -> float:
  value = float(text)
  if not math.isfinite(value):
    raise _Unreadable(f"the number {text} is beyond a float's range")
  return value


def _unique_names(pairs: list[tuple[str, object]]) -> dict:
  # RFC 8259: names SHOULD be unique; where they are not, readers disagree on the value.
  obj = dict(pairs)
  if len(obj) < len(pairs):
    names = [name for name, _ in pairs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    raise _Unreadable(f"an object repeats the names {repeated}")
  return obj


def _lone_surrogate(value: str) -> bool:
  # A \ud800-style escape without its pair is valid JSON but no character: not UTF-8.
  try:
    value.encode("utf-8")
  except UnicodeEncodeError:
    return True
  return False


def read_jsonl(path: str, *, text_fields: Sequence[str],
               label_field: str) -> Iterator[TextRow | DataError]:
  """Rows of a JSON Lines file: one JSON object per line, blank lines allowed."""
  # JSON Lines separates values by LF only; a CR before it is JSON whitespace.
  for line, raw in enumerate(textio.read_text(path).split("\n"), start=1):
    if not raw.strip():
      continue
    where = f"{path}:{line}"
    try:
      obj = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float,
                       object_pairs_hook=_unique_names)
    except _Unreadable as e:
      yield DataError(f"{where}: {e}.")
      continue
    except ValueError as e:
      detail = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else e
      yield DataError(f"{where}: not valid JSON ({detail}).")
      continue
    if not isinstance(obj, dict):
      yield DataError(f"{where}: {_show(obj)} is not a JSON object.")
      continue
    missing = [f for f in (*text_fields, label_field) if f not in obj]
    if missing:
      yield DataError(f"{where}: object lacks fields {missing}; it has {sorted(obj)}.")
      continue
    bad = [f for f in text_fields if not isinstance(obj[f], str)]
    if bad:
      yield DataError(f"{where}: text fields must be strings; {bad[0]!r} is "
                      f"{_show(obj[bad[0]])}.")
      continue
    lone = [f for f in (*text_fields, label_field)
            if isinstance(obj[f], str) and _lone_surrogate(obj[f])]
    if lone:
      yield DataError(f"{where}: field {lone[0]!r} holds a lone UTF-16 surrogate escape "
                      "(\\ud800 to \\udfff without its pair), which is no character.")
      continue
    label = _json_label(obj[label_field])
    if label is None:
      yield DataError(f"{where}: label field {label_field!r} is {_show(obj[label_field])}; "
                      "use a string, number or boolean.")
      continue
    yield TextRow(line, tuple(obj[f] for f in text_fields), label)
