"""A task's split as records: find the file, read its format, map the labels.

Records are uniform: `idx`, `text_a`, `text_b`, `label` (classification and
regression) or `idx`, `tokens`, `tags` (tagging), in file order. A malformed
example is an error naming the file and line, unless `skip_malformed` is set,
in which case it is skipped and counted in `ReadStats`.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
from typing import Iterable, Iterator

from papa_jax import shared
from papa_jax.data import conll, formats, tables
from papa_jax.data.errors import DataError
from papa_jax.data.tasks import TASKS, Task

__all__ = ["DataError", "ReadStats", "collect_labels", "label_order", "one_class_error",
           "raw_examples", "read_split", "split_path"]

_INTEGER = re.compile(r"[+-]?[0-9]+")
# A decimal number as CSV, TSV and JSON write one; Python's float() would also take
# `1_000`, non-ASCII digits (`١`) and `infinity`.
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


@dataclasses.dataclass
class ReadStats:
  skipped: int = 0


def _listing(directory: str) -> str:
  if not os.path.isdir(directory):
    return "no such directory"
  return str(sorted(os.listdir(directory)))


def _shared_hint(where: str) -> str:
  """How to point a built-in task's default folder (under `$PAPA_SHARED/data`) elsewhere."""
  root = os.path.abspath(shared.data_dir())
  if os.path.commonpath([os.path.abspath(where), root]) != root:
    return ""
  return (f" It is the task's default under ${shared.ENV} ({shared.shared_dir()}, "
          f"{'set' if os.environ.get(shared.ENV) else 'unset'}): point {shared.ENV} at the "
          "folder that holds data/, or set data.data_dir to the task's files.")


def split_path(task: Task, data_dir: str, split: str) -> str:
  """The file of `split`: named, or the one match of a pattern; DataError if none."""
  if split not in task.files:
    raise DataError(f"Task {task.name} has no split {split!r}; it has {sorted(task.files)}.")
  name = task.files[split]
  path = os.path.join(data_dir, name)  # An absolute `name` stays as it is.
  if task.file_patterns:
    matches = sorted(glob.glob(glob.escape(data_dir) + os.sep + name)) if data_dir else []
    if len(matches) != 1:
      found = "no file matches" if not matches else f"several files match ({matches})"
      raise DataError(f"Data dir {data_dir!r}: {found} {name!r} for the {split} split of "
                      f"task {task.name}; it holds {_listing(data_dir)}.")
    path = matches[0]
    if os.path.isdir(path):
      raise DataError(f"{path} matches {name!r} for the {split} split of task {task.name} "
                      "but is a directory, not a file.")
  elif os.path.isdir(path):
    raise DataError(f"{path} is a directory, not the {split} split's file of task {task.name}: "
                    f"point data.data_dir (or data.custom.{split}) at the file's folder.")
  elif not os.path.isfile(path):
    where = os.path.dirname(path) or "."
    field = "" if task.name in TASKS else f", data.custom.{split}={name!r}"
    raise DataError(f"Data dir {where!r} lacks {os.path.basename(path)!r} for the {split} "
                    f"split of task {task.name} (expected files "
                    f"{sorted(os.path.basename(f) for f in task.files.values())}; "
                    f"found {_listing(where)}{field}).{_shared_hint(where)}")
  if os.path.getsize(path) == 0:
    raise DataError(f"{path} is empty.")
  return path


def raw_examples(task: Task, path: str) -> Iterator[tables.TextRow | conll.TagSentence | DataError]:
  """The file's examples with their labels as written, by its format's reader
  (`formats.FORMATS`; see `tables`, `conll`)."""
  if task.format not in formats.FORMATS:
    raise DataError(f"Task {task.name}: unknown format {task.format!r}.")
  return formats.FORMATS[task.format].read(task, path)


class UnknownLabel(DataError):
  """A label outside the task's label set: in an evaluation split never skipped, since
  dropping examples for their label would score a different dev set."""


def _unknown(task: Task, raw: str, where: str) -> DataError:
  ids = f" (or its id 0..{task.num_labels - 1})" if task.label_ids_in_file else ""
  return UnknownLabel(f"{where}: label {raw!r} is not in the {task.name} label set "
                   f"{list(task.label_names)}{ids}.")


def _class_id(task: Task, ids: dict[str, int], raw: str, where: str) -> int:
  if raw in ids:
    return ids[raw]
  if task.label_ids_in_file and _INTEGER.fullmatch(raw) and 0 <= int(raw) < task.num_labels:
    return int(raw)
  raise _unknown(task, raw, where)


def _score(raw: str, where: str) -> float:
  try:
    value = float(raw)
  except ValueError:
    value = None
  if value is not None and not math.isfinite(value):
    raise DataError(f"{where}: regression label {raw!r} is not finite.")
  if value is None or not _NUMBER.fullmatch(raw):
    raise DataError(f"{where}: regression label {raw!r} is not a number (decimal digits, "
                    "an optional point and exponent: 3, -0.5, 1e-3).")
  return value


def _check(task: Task, ex: tables.TextRow | conll.TagSentence, path: str) -> None:
  """DataError if a text or a label is empty (what no label set can make valid)."""
  if isinstance(ex, conll.TagSentence):
    return  # The CoNLL readers refuse empty tokens and tags.
  where = f"{path}:{ex.line}"
  empty = [f for f, t in zip(task.text_fields, ex.texts) if not t.strip()]
  if empty:
    raise DataError(f"{where}: empty text in field {empty[0]!r}.")
  if not ex.label.strip():
    raise DataError(f"{where}: empty label in field {task.label_field!r}.")


def _record(task: Task, ids: dict[str, int], ex: tables.TextRow | conll.TagSentence, path: str,
            idx: int) -> dict:
  """One checked example as a record; DataError if a label is not in the label set."""
  if isinstance(ex, conll.TagSentence):
    for tag, line in zip(ex.tags, ex.tag_lines):
      if tag not in ids:
        raise _unknown(task, tag, f"{path}:{line}")
    return dict(idx=idx, tokens=list(ex.tokens), tags=[ids[t] for t in ex.tags])
  where, raw = f"{path}:{ex.line}", ex.label.strip()
  label = _score(raw, where) if task.kind == "regression" else _class_id(task, ids, raw, where)
  return dict(idx=idx, text_a=ex.texts[0], text_b=ex.texts[1] if task.is_pair else "",
              label=label)


def _examples(task: Task, path: str, skip_malformed: bool,
              stats: ReadStats) -> Iterator[tables.TextRow | conll.TagSentence]:
  """The well-formed examples of a file (malformed ones raise, or are counted)."""
  for ex in raw_examples(task, path):
    try:
      if isinstance(ex, DataError):
        raise ex
      _check(task, ex, path)
    except DataError:
      if not skip_malformed:
        raise
      stats.skipped += 1
      continue
    yield ex


def read_split(task: Task, data_dir: str, split: str, *, skip_malformed: bool = False,
               stats: ReadStats | None = None) -> Iterator[dict]:
  """Records of one split of a task whose labels are known (see module doc)."""
  if task.kind != "regression" and not task.label_names:
    raise DataError(f"Task {task.name} has no label names yet: use resolve_task(config.data).")
  stats = stats if stats is not None else ReadStats()
  path = split_path(task, data_dir, split)
  ids = {name: i for i, name in enumerate(task.label_names)}
  idx = 0
  for ex in _examples(task, path, skip_malformed, stats):
    try:
      rec = _record(task, ids, ex, path, idx)
    except UnknownLabel as e:
      if not skip_malformed:
        raise
      if split != "train":
        raise _not_skipped(e, task) from None
      stats.skipped += 1
      continue
    except DataError:
      if not skip_malformed:
        raise
      stats.skipped += 1
      continue
    yield rec
    idx += 1
  if idx == 0:
    skipped = f" ({stats.skipped} malformed skipped)" if stats.skipped else ""
    raise DataError(f"{path} has no examples{skipped}.")


def _not_skipped(error: UnknownLabel, task: Task) -> UnknownLabel:
  field = "" if task.name in TASKS else " (list it in data.custom.label_names to score it)"
  return UnknownLabel(f"{error} Not skipped by skip_malformed: an evaluation split keeps "
                      f"every example a probe cannot predict, as an error{field}.")


def one_class_error(path: str, label) -> DataError:
  return DataError(f"{path}: the train split has one class only ({label!r}); a classifier "
                   "needs examples of two classes or more.")


def label_order(labels: Iterable[str]) -> tuple[str, ...]:
  """Distinct labels, sorted: numerically if every one is an integer, else as strings."""
  labels = set(labels)
  if labels and all(_INTEGER.fullmatch(x) for x in labels):
    return tuple(sorted(labels, key=lambda x: (int(x), x)))
  return tuple(sorted(labels))


def collect_labels(task: Task, data_dir: str, split: str = "train", *,
                   skip_malformed: bool = False) -> tuple[str, ...]:
  """The labels (or tags) written in a split, in `label_order`."""
  path = split_path(task, data_dir, split)
  seen: set[str] = set()
  for ex in _examples(task, path, skip_malformed, ReadStats()):
    if isinstance(ex, conll.TagSentence):
      seen.update(ex.tags)
    else:
      seen.add(ex.label.strip())
  if not seen:
    raise DataError(f"{path} has no examples to collect {task.name} labels from.")
  return label_order(seen)
