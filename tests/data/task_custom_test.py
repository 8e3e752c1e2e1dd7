"""Custom tasks declared in config.data.custom: resolution, label order, equivalence."""

import os

import numpy as np
import pytest

from configs import base
from papa_jax import data
from papa_jax.probing import metrics
from papa_jax.data import readers
from tests.conftest import require_shared
from tests.data.conftest import custom_config, write


@pytest.mark.unit
@pytest.mark.parametrize("labels,want", [
    (["10", "2", "-1", "2", "0"], ("-1", "0", "2", "10")),  # All integers: numeric order.
    (["10", "2", "b", "A"], ("10", "2", "A", "b")),  # Else code-point order of the strings.
    (["1.5", "10", "2"], ("1.5", "10", "2")),
    (["+1", "1", "01"], ("+1", "01", "1")),  # Equal values: ties broken by the text.
])
def test_task_custom_label_order_rule(labels, want):
  assert readers.label_order(labels) == want


@pytest.mark.unit
def test_task_custom_collected_labels_are_exposed_and_used(tmp_path):
  write(tmp_path, "train.csv", "text,stars\na,5\nb,10\nc,1\nd,5\n")
  write(tmp_path, "dev.csv", "text,stars\ne,10\nf,1\n")
  cfg = custom_config(tmp_path, name="reviews", format="csv", train="train.csv",
                      validation="dev.csv", text_fields=("text",), label_field="stars")
  task = data.resolve_task(cfg)
  assert (task.name, task.label_names, task.num_labels) == ("reviews", ("1", "5", "10"), 3)
  assert task.metrics == ("accuracy",) and task.headline_metric == "accuracy"
  assert not task.is_pair and task.eval_split == "validation"
  assert [r["label"] for r in data.load_records(cfg, "train")] == [1, 2, 0, 1]
  assert [r["label"] for r in data.load_records(cfg, "validation")] == [2, 0]
  # Listed label names fix the order (and so the label ids) instead.
  cfg.custom.label_names = ("10", "5", "1")
  assert [r["label"] for r in data.load_records(cfg, "train")] == [1, 0, 2, 1]
  assert data.resolve_task(cfg).label_names == ("10", "5", "1")


@pytest.mark.unit
def test_task_custom_paths_relative_absolute_and_optional_test(tmp_path, monkeypatch):
  write(tmp_path / "d", "train.tsv", "s\tl\na\tx\nb\ty\n")
  dev = write(tmp_path / "elsewhere", "dev.tsv", "s\tl\nc\tx\n")
  cfg = custom_config(tmp_path / "d", format="tsv", train="train.tsv", validation=str(dev),
                      text_fields=("s",), label_field="l")
  data.check_files(cfg, ("train", "validation"))
  assert [r["text_a"] for r in data.load_records(cfg, "validation")] == ["c"]
  with pytest.raises(data.DataError, match="Task custom has no split 'test'"):
    data.check_files(cfg, ("test",))
  cfg.data_dir = ""  # Relative to the working directory.
  monkeypatch.chdir(tmp_path / "d")
  assert len(data.load_records(cfg, "train")) == 2
  assert data.data_dir(cfg) == os.getcwd()


@pytest.mark.unit
def test_task_custom_scores_through_metrics(tmp_path):
  write(tmp_path, "t.jsonl",
        "".join(f'{{"t": "x{i}", "y": "{c}"}}\n' for i, c in enumerate("abcab")))
  cfg = custom_config(tmp_path, format="jsonl", train="t.jsonl", validation="t.jsonl",
                      text_fields=("t",), label_field="y", metrics=("matthews_correlation",
                                                                    "accuracy"))
  task = data.resolve_task(cfg)
  labels = np.array([r["label"] for r in data.load_records(cfg, "validation")])
  scores = metrics.task_scores(task, np.eye(3)[labels], labels)
  assert scores == {"matthews_correlation": 1.0, "accuracy": 1.0}
  write(tmp_path, "n.txt", "Ann B-PER\nLee I-PER\nran O\n\nRome S-LOC\n")
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="n.txt", validation="n.txt")
  task = data.resolve_task(cfg)
  assert task.label_names == ("B-PER", "I-PER", "O", "S-LOC")
  tags = np.full((2, 4), data.IGNORE)
  for i, r in enumerate(data.load_records(cfg, "validation")):
    tags[i, :len(r["tags"])] = r["tags"]
  pred = np.where(tags == data.IGNORE, 0, tags)
  pred[0, 1] = task.label_names.index("O")  # "Lee" missed: one of two entities wrong.
  scores = metrics.task_scores(task, np.eye(4)[pred], tags)
  assert scores["f1"] == pytest.approx(0.5) and scores["accuracy"] == pytest.approx(0.75)


@pytest.mark.integration
def test_task_custom_mrpc_equals_builtin_mrpc(minilm_tokenizer):
  d = require_shared("data", "mrpc")
  builtin = base.get_config().data
  builtin.task, builtin.data_dir, builtin.max_length = "mrpc", str(d), 128
  custom = custom_config(d, name="mrpc_tsv", format="tsv", train="train.tsv",
                         validation="dev.tsv", text_fields=("#1 String", "#2 String"),
                         label_field="Quality", metrics=("f1", "accuracy"))
  custom.max_length = 128
  assert builtin.papa_layout and custom.papa_layout
  assert data.resolve_task(custom).label_names == ("0", "1")  # Same ids as the built-in's.
  for split, n in (("train", 3668), ("validation", 408)):
    a = data.load_split(builtin, split, minilm_tokenizer, 2)
    b = data.load_split(custom, split, minilm_tokenizer, 2)
    assert len(a) == n and a.truncated == b.truncated
    for k, v in a.arrays().items():
      np.testing.assert_array_equal(v, b.arrays()[k], err_msg=k)
    assert a.input_ids[:, 64].tolist() == [minilm_tokenizer.sep_token_id] * n  # PAPA layout.


@pytest.mark.unit
def test_task_custom_base_config_defaults_are_inert():
  c = base.get_config().data
  assert data.check_config(c) == data.get_task("sst2")
  assert isinstance(c.custom.text_fields, tuple) and c.custom.tag_column == -1
