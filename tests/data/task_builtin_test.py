"""Built-in tasks: entries of the one Task dataclass, read from the shared files."""

import numpy as np
import pytest

from configs import base
from papa_jax import data
from papa_jax.probing import metrics
from papa_jax.data import readers, tasks
from tests.conftest import require_shared

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("task,subdir,split,rows,extra", [
    ("sst2", "sst2", "train", 67349, {0: 29780, 1: 37569}),
    ("sst2", "sst2", "validation", 872, {0: 428, 1: 444}),
    ("cola", "cola", "train", 8551, {0: 2528, 1: 6023}),
    ("cola", "cola", "validation", 1043, {0: 322, 1: 721}),
    ("mrpc", "mrpc", "train", 3668, {0: 1194, 1: 2474}),
    ("mrpc", "mrpc", "validation", 408, {0: 129, 1: 279}),
    ("ner", "conll2003", "train", 14041, 203621),
    ("ner", "conll2003", "validation", 3250, 51362),
    ("pos", "conll2003", "test", 3453, 46435),
])
def test_task_builtin_published_counts(task, subdir, split, rows, extra):
  d = require_shared("data", subdir)
  recs = list(readers.read_split(tasks.get_task(task), str(d), split))
  assert len(recs) == rows
  assert [r["idx"] for r in recs] == list(range(rows))
  if isinstance(extra, dict):
    assert {k: sum(r["label"] == k for r in recs) for k in extra} == extra
  else:
    assert sum(len(r["tokens"]) for r in recs) == extra


def test_task_builtin_ner_tag_counts():
  d = require_shared("data", "conll2003")
  task = tasks.get_task("ner")
  counts = {t: 0 for t in task.label_names}
  for r in readers.read_split(task, str(d), "train"):
    for t in r["tags"]:
      counts[task.label_names[t]] += 1
  assert counts["B-PER"] == 6600 and counts["I-MISC"] == 1155 and counts["O"] == 169578


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_task_builtin_resolves_from_config_as_itself(name, tmp_path):
  c = base.get_config().data
  c.task, c.data_dir = name, str(tmp_path)  # Built-ins have their labels: no file is read.
  task = data.resolve_task(c)
  assert task == tasks.get_task(name) and task.name == name
  assert set(task.metrics) <= set(tasks.METRICS[task.kind]) and task.eval_split == "validation"
  assert task.is_pair == (name in ("mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"))
  assert task.num_labels == (1 if task.kind == "regression" else len(task.label_names))


def test_task_builtin_metrics_keep_their_names():
  # task_scores returns exactly the task's metrics, which the orchestrator reports.
  assert tasks.get_task("cola").headline_metric == "matthews_correlation"
  assert tasks.get_task("mrpc").metrics == ("f1", "accuracy")
  assert tasks.get_task("ner").metrics == ("f1", "precision", "recall", "accuracy")
  assert tasks.get_task("pos").metrics == tasks.get_task("udpos").metrics == ("accuracy",)
  task = tasks.get_task("chunk")
  labels = [[task.label_names.index(t) for t in ("B-NP", "I-NP", "O")]]

  logits = np.eye(task.num_labels)[np.array(labels)]
  assert set(metrics.task_scores(task, logits, np.array(labels))) == set(task.metrics)


def test_task_builtin_unknown_name():
  with pytest.raises(ValueError, match="Unknown task 'sst3'; known tasks: .*'udpos'"):
    tasks.get_task("sst3")
  with pytest.raises(data.TaskConfigError, match="Unknown task 'custom'.*resolve_task"):
    tasks.get_task("custom")
