"""From `config.data` to a Task: the `custom` block, its checks, label collection.

`check_config` is static (no file is opened): a built-in task, or the task the
`data.custom` block declares, each field checked with an error naming it.
`resolve_task` completes it from the data: labels not listed are collected
from the train split (see `readers.label_order`), and what only the labels can
tell is checked (binary F1 needs two classes, entity F1 needs IOB tags).
"""

from __future__ import annotations

import dataclasses
import os
import re

from absl import logging

from papa_jax import shared
from papa_jax.data import formats, readers
from papa_jax.data.errors import TaskConfigError
from papa_jax.data.tasks import (ENTITY_METRICS, KINDS, METRICS, TASKS, TOKEN_METRICS, Task,
                                 get_task)

CUSTOM = "custom"
SOURCES = ("local", "tfds")
SPLITS = ("train", "validation", "test")
# Block fields whose default is an empty value: setting any means a custom task.
_DECLARING = ("name", "format", *SPLITS, "text_fields", "label_field", "label_names", "metrics")
# seqeval's (conlleval) chunk prefixes, as papa_jax/probing/metrics.py splits them.
_IOB = re.compile(r"O|[BIES]-.+")


_fail = formats.field_error
_strings = formats.strings


def default_metrics(kind: str, label_names: tuple[str, ...]) -> tuple[str, ...]:
  """Classification: accuracy. Regression: pearson, spearman. Tagging: entity f1
  (with precision, recall, accuracy) if every tag is IOB-like, else token accuracy."""
  if kind == "classification":
    return ("accuracy",)
  if kind == "regression":
    return METRICS["regression"]
  return ENTITY_METRICS if is_iob(label_names) else TOKEN_METRICS


def _non_iob(tags: tuple[str, ...]) -> list[str]:
  return [t for t in tags if not _IOB.fullmatch(t)]


def is_iob(tags: tuple[str, ...]) -> bool:
  """Tags that chunk into entities: 'O' and B-/I-/E-/S- prefixed types, not all 'O'."""
  return bool(tags) and not _non_iob(tags) and set(tags) != {"O"}


def _check_metrics(c, kind: str) -> tuple[str, ...]:
  metrics = _strings("metrics", c.metrics)
  unknown = [m for m in metrics if m not in METRICS[kind]]
  if unknown:
    raise _fail("metrics", metrics, f"{unknown} cannot score a {kind} task; use metrics "
                f"from {list(METRICS[kind])}.")
  if len(set(metrics)) != len(metrics):
    raise _fail("metrics", metrics, "lists a metric twice.")
  if kind == "tagging" and metrics and "f1" not in metrics and metrics != TOKEN_METRICS:
    raise _fail("metrics", metrics, "entity precision and recall come with entity f1: "
                f"use a subset of {list(ENTITY_METRICS)} with 'f1', or ('accuracy',) "
                "for token accuracy.")
  return metrics


def custom_task(c) -> Task:
  """The Task a `data.custom` block declares (labels may still be empty)."""
  if c.format not in formats.FORMATS:
    raise _fail("format", c.format, f"use one of {list(formats.FORMATS)}.")
  if c.kind not in KINDS:
    raise _fail("kind", c.kind, f"use one of {list(KINDS)}.")
  fmt, kind = c.format, c.kind
  formats.check_kind(fmt, kind)
  name = c.name or CUSTOM
  if name in TASKS:
    raise _fail("name", c.name, "is a built-in task's name; choose another for results.")
  for split in ("train", "validation"):
    if not c[split]:
      raise _fail(split, c[split], f"name the {split} split's file.")
  formats.check_fields(c)
  labels = _strings("label_names", c.label_names)
  if kind == "regression" and labels:
    raise _fail("label_names", labels, "a regression task has no label names.")
  if len(set(labels)) != len(labels) or any(x != x.strip() or not x for x in labels):
    raise _fail("label_names", labels, "must be distinct, non-empty, without surrounding "
                "spaces (labels are compared after stripping).")
  metrics = _check_metrics(c, kind)
  options = {f: tuple(c[f]) if isinstance(c[f], (list, tuple)) else c[f]
             for f in formats.OPTIONS}  # Every format's: a Task holds them all.
  return Task(name=name, kind=kind, label_names=labels, metrics=metrics, format=fmt,
              files={s: c[s] for s in SPLITS if c[s]}, **options)


def _custom_block(data_cfg):
  return data_cfg.get("custom") if hasattr(data_cfg, "get") else None


def _named_task(data_cfg) -> Task:
  block = _custom_block(data_cfg)
  if data_cfg.task == CUSTOM:
    if block is None:
      raise TaskConfigError("data.task='custom' needs a data.custom block (docs/tasks.md; "
                            "its fields: docs/config.md).")
    return custom_task(block)
  task = get_task(data_cfg.task)
  if block is not None:
    set_ = [f for f in _DECLARING if f in block and block[f]]
    if set_:
      raise TaskConfigError(f"data.custom.{set_[0]} is set but data.task={data_cfg.task!r}: "
                            "set data.task='custom' to use the custom block.")
  return task


def check_config(data_cfg) -> Task:
  """The task `config.data` names or declares, checked without opening a data file.

  Its labels may still be empty (to be collected): use `resolve_task` for the
  task itself.
  """
  task = _named_task(data_cfg)
  if data_cfg.source not in SOURCES:
    raise TaskConfigError(f"data.source={data_cfg.source!r}: use one of {list(SOURCES)}.")
  if data_cfg.source == "tfds" and not task.tfds_name:
    raise TaskConfigError(f"data.source='tfds' but task {task.name} is not in the TFDS "
                          "catalog: use data.source='local'.")
  return task


def data_dir(data_cfg, task: Task | None = None) -> str:
  """Where the task's relative file names point (`data.data_dir` or its default)."""
  task = task or check_config(data_cfg)
  if data_cfg.data_dir:
    return data_cfg.data_dir
  if task.local_subdir:
    return str(shared.data_dir(task.local_subdir))
  if data_cfg.task == CUSTOM:
    return os.getcwd()
  raise TaskConfigError(f"data.data_dir is empty: task {task.name} has no default data "
                        "directory; set data.data_dir (for udpos: a UD treebank directory "
                        "with <lang>_<treebank>-ud-{train,dev,test}.conllu).")


def _check_labels(task: Task, collected: bool) -> None:
  source = " (collected from the train split)" if collected else ""
  if task.kind == "classification" and len(task.label_names) < 2:
    raise TaskConfigError(f"Task {task.name}: a classification task needs two classes or "
                          f"more; data.custom.label_names{source} is {list(task.label_names)}.")
  if task.kind == "classification" and "f1" in task.metrics and len(task.label_names) != 2:
    raise TaskConfigError(f"Task {task.name}: metric 'f1' is binary F1 (of the second label) "
                          f"but there are {len(task.label_names)} labels{source}: "
                          f"{list(task.label_names)}; use accuracy or matthews_correlation.")
  if task.kind == "tagging" and "f1" in task.metrics and not is_iob(task.label_names):
    bad = _non_iob(task.label_names)[:10]
    found = f"include {bad}" if bad else "are all 'O'"
    raise TaskConfigError(f"Task {task.name}: entity f1 chunks IOB/IOBES tags ('O', 'B-X', "
                          f"'I-X', 'E-X', 'S-X') but its tags{source} {found}; use "
                          "data.custom.metrics=('accuracy',) (token accuracy).")


def _warn_near_iob(task: Task) -> None:
  """Says so when a tag set is IOB but for a few tags, which switch its default metric
  from entity F1 to token accuracy (a typo such as `B-` or `o` would do it)."""
  if task.kind != "tagging" or is_iob(task.label_names):
    return
  odd = _non_iob(task.label_names)
  if len(odd) * 2 < len(task.label_names) and any(t[:2] in ("B-", "I-") for t in task.label_names):
    logging.warning("Task %s: its tags are IOB but for %s, so its default metric is token "
                    "accuracy, not entity F1; fix those tags, or declare "
                    "data.custom.metrics.", task.name, odd)


def resolve_task(data_cfg) -> Task:
  """The full task of `config.data`: collected labels, default metrics, all checked."""
  task = check_config(data_cfg)
  collected = task.kind != "regression" and not task.label_names
  if collected:
    directory = data_dir(data_cfg, task)
    labels = readers.collect_labels(task, directory, "train",
                                    skip_malformed=data_cfg.skip_malformed)
    if task.kind == "classification" and len(labels) == 1:
      raise readers.one_class_error(readers.split_path(task, directory, "train"), labels[0])
    task = dataclasses.replace(task, label_names=labels)
  if not task.metrics:
    task = dataclasses.replace(task, metrics=default_metrics(task.kind, task.label_names))
    _warn_near_iob(task)
  _check_labels(task, collected)
  return task
