"""Readers of the official file formats (GLUE TSV, CoNLL columns).

Each yields uniform records (`idx`, `text_a`, `text_b`, `label`, or `idx`,
`tokens`, `tags`). A malformed row is an error naming the file and line,
unless `skip_malformed` is set, in which case it is skipped and counted.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from typing import Iterator

from papa_jax.data.tasks import Task

csv.field_size_limit(1 << 24)


class DataError(ValueError):
  """A data file that cannot be read as the task's format."""


@dataclasses.dataclass
class ReadStats:
  skipped: int = 0


def split_path(task: Task, data_dir: str, split: str) -> str:
  if split not in task.files:
    raise DataError(f"Task {task.name} has no split {split!r}; it has {sorted(task.files)}.")
  path = os.path.join(data_dir, task.files[split])
  if not os.path.isfile(path):
    present = sorted(os.listdir(data_dir)) if os.path.isdir(data_dir) else "no such directory"
    raise DataError(
        f"Data dir {data_dir!r} lacks {task.files[split]!r} for task {task.name} "
        f"(expected files {sorted(task.files.values())}; found {present}).")
  if os.path.getsize(path) == 0:
    raise DataError(f"{path} is empty.")
  return path


def _label(task: Task, raw: str, where: str):
  raw = raw.strip()
  if task.kind == "regression":
    try:
      return float(raw)
    except ValueError:
      raise DataError(f"{where}: label {raw!r} is not a number.") from None
  if raw in task.label_names:
    return task.label_names.index(raw)
  if raw.lstrip("-").isdigit() and 0 <= int(raw) < task.num_labels:
    return int(raw)
  raise DataError(f"{where}: label {raw!r} is not in the label set "
                  f"{list(task.label_names)} (or 0..{task.num_labels - 1}).")


def read_glue_tsv(task: Task, path: str, *, skip_malformed: bool = False,
                  stats: ReadStats | None = None) -> Iterator[dict]:
  """GLUE TSV rows as records; columns found by header name (CoLA: fixed)."""
  stats = stats if stats is not None else ReadStats()
  with open(path, encoding="utf-8", newline="") as f:
    rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    if task.text_columns is None:  # CoLA: source, label, mark, sentence.
      header, cols, label_col, width = None, (3,), 1, 4
      start = 1
    else:
      try:
        header = next(rows)
      except StopIteration:
        raise DataError(f"{path} is empty.") from None
      missing = [c for c in (*task.text_columns, task.label_column) if c not in header]
      if missing:
        raise DataError(f"{path}:1: header {header} lacks columns {missing} of task {task.name}.")
      cols = tuple(header.index(c) for c in task.text_columns)
      label_col, width, start = header.index(task.label_column), len(header), 2
    idx = 0
    for line, row in enumerate(rows, start=start):
      where = f"{path}:{line}"
      try:
        if len(row) < width or (header is None and len(row) != width):
          raise DataError(f"{where}: expected {width} tab-separated fields, found {len(row)}.")
        texts = [row[c] for c in cols]
        if not texts[0].strip():
          raise DataError(f"{where}: empty text field.")
        label = _label(task, row[label_col], where)
      except DataError:
        if not skip_malformed:
          raise
        stats.skipped += 1
        continue
      yield dict(idx=idx, text_a=texts[0], text_b=texts[1] if len(texts) > 1 else "",
                 label=label)
      idx += 1
    if idx == 0:
      raise DataError(f"{path} has no data rows.")


def read_conll(task: Task, path: str, *, skip_malformed: bool = False,
               stats: ReadStats | None = None) -> Iterator[dict]:
  """CoNLL-2003 sentences (`token POS chunk NER` lines) as records."""
  stats = stats if stats is not None else ReadStats()
  tokens, tags, idx, bad = [], [], 0, False
  with open(path, encoding="utf-8") as f:
    for line_no, line in enumerate(f, start=1):
      line = line.rstrip("\n")
      if not line.strip() or line.startswith("-DOCSTART-"):
        if tokens and not bad:
          yield dict(idx=idx, tokens=tokens, tags=tags)
          idx += 1
        tokens, tags, bad = [], [], False
        continue
      fields = line.split()
      where = f"{path}:{line_no}"
      try:
        if len(fields) != 4:
          raise DataError(f"{where}: expected 4 space-separated fields "
                          f"(token POS chunk NER), found {len(fields)}.")
        tag = fields[task.tag_column]
        if tag not in task.label_names:
          raise DataError(f"{where}: tag {tag!r} is not in the {task.name} label set.")
      except DataError:
        if not skip_malformed:
          raise
        stats.skipped += 1
        bad = True
        continue
      tokens.append(fields[0])
      tags.append(task.label_names.index(tag))
  if tokens and not bad:
    yield dict(idx=idx, tokens=tokens, tags=tags)
    idx += 1
  if idx == 0:
    raise DataError(f"{path} has no sentences.")


def read_split(task: Task, data_dir: str, split: str, **kwargs) -> Iterator[dict]:
  path = split_path(task, data_dir, split)
  reader = read_conll if task.kind == "tagging" else read_glue_tsv
  return reader(task, path, **kwargs)
