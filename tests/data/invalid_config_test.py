"""Task declarations that cannot work: each error names the config field."""

import os

import pytest

from configs import base
from papa_jax import data
from tests.data.conftest import custom_config, write

pytestmark = pytest.mark.unit

CSV = dict(format="csv", train="t.csv", validation="t.csv", text_fields=("text",),
           label_field="label")


@pytest.mark.parametrize("fields,pattern", [
    (dict(format="xlsx"), r"data\.custom\.format='xlsx': use one of \['csv', 'tsv', 'jsonl', "
     r"'conll', 'conllu'\]"),
    (dict(format=""), r"data\.custom\.format='': use one of"),
    (dict(kind="ranking"), r"data\.custom\.kind='ranking': use one of"),
    (dict(kind="tagging"), r"data\.custom\.kind='tagging': a csv file holds texts with labels"),
    (dict(format="conllu", kind="classification", text_fields=()),
     r"data\.custom\.kind='classification': a conllu file holds tagged tokens"),
    (dict(validation=""), r"data\.custom\.validation='': name the validation split's file"),
    (dict(text_fields=()), r"data\.custom\.text_fields=\(\): name one text field"),
    (dict(text_fields=("a", "b", "c")), r"data\.custom\.text_fields=\('a', 'b', 'c'\)"),
    (dict(text_fields=("text", "label")), r"data\.custom\.text_fields=.*repeats a field"),
    (dict(label_field=""), r"data\.custom\.label_field='': a csv task needs"),
    (dict(header=False), r"data\.custom\.text_fields=\('text',\): without a header, fields are "
     r"0-based column numbers"),
    (dict(header=False, text_fields=("0",)), r"data\.custom\.label_field='label': without a "
     r"header"),
    (dict(metrics=("bleu",)), r"data\.custom\.metrics=\('bleu',\): \['bleu'\] cannot score a "
     r"classification task; use metrics from \['accuracy', 'f1', 'matthews_correlation'\]"),
    (dict(metrics=("pearson",)), r"\['pearson'\] cannot score a classification task"),
    (dict(kind="regression", metrics=("accuracy",)), r"\['accuracy'\] cannot score a "
     r"regression task"),
    (dict(metrics=("accuracy", "accuracy")), r"data\.custom\.metrics=.*lists a metric twice"),
    (dict(kind="regression", label_names=("a", "b")), r"data\.custom\.label_names=.*a "
     r"regression task has no label names"),
    (dict(label_names=("a", "a")), r"data\.custom\.label_names=.*must be distinct"),
    (dict(label_names=(0, 1)), r"data\.custom\.label_names=\(0, 1\): must be a tuple of strings"),
    (dict(quoting="double"), r"data\.custom\.quoting='double'"),
    (dict(format="jsonl", quoting="none"), r"data\.custom\.quoting='none'"),
    (dict(name="sst2"), r"data\.custom\.name='sst2': is a built-in task's name"),
    (dict(format="conll", kind="tagging", text_fields=()), r"data\.custom\.label_field='label'"
     r": does not apply to conll"),
    (dict(format="conll", kind="tagging", text_fields=(), label_field="", metrics=("precision",)),
     r"data\.custom\.metrics=\('precision',\): entity precision and recall come with entity f1"),
    (dict(format="conll", kind="tagging", text_fields=(), label_field="", separator=","),
     r"data\.custom\.separator=','"),
    (dict(format="conllu", kind="tagging", text_fields=(), label_field="", tag_field="deprel"),
     r"data\.custom\.tag_field='deprel': use one of \['upos', 'xpos'\]"),
])
def test_invalid_config_custom_block(tmp_path, fields, pattern):
  cfg = custom_config(tmp_path, **{**CSV, **fields})
  with pytest.raises(data.TaskConfigError, match=pattern):
    data.check_files(cfg, ("train",))


def test_invalid_config_missing_split_file_names_the_field(tmp_path):
  write(tmp_path, "t.csv", "text,label\na,x\nb,y\n")
  cfg = custom_config(tmp_path, **{**CSV, "validation": "dev.csv"})
  with pytest.raises(data.DataError, match=rf"Data dir '{tmp_path}' lacks 'dev.csv' for the "
                     r"validation split of task custom \(expected files \['dev.csv', 't.csv'\]; "
                     r"found \['t.csv'\], data\.custom\.validation='dev.csv'\)"):
    data.check_files(cfg, ("train", "validation"))


def test_invalid_config_split_file_that_is_a_directory_is_named(tmp_path):
  """A folder where the split's file should be: not "lacks X ... found X"."""
  write(tmp_path, "t.csv", "text,label\na,x\nb,y\n")
  os.mkdir(tmp_path / "dev.csv")
  cfg = custom_config(tmp_path, **{**CSV, "validation": "dev.csv"})
  with pytest.raises(data.DataError, match=rf"^{tmp_path}/dev\.csv is a directory, not the "
                     r"validation split's file of task custom: point data\.data_dir \(or "
                     r"data\.custom\.validation\) at the file's folder\.$"):
    data.check_files(cfg, ("train", "validation"))


def test_invalid_config_missing_default_data_names_papa_shared(tmp_path, monkeypatch):
  """A built-in task's default folder is under $PAPA_SHARED/data: the error says how to point
  it elsewhere; a folder the user set does not get that hint."""
  monkeypatch.setenv("PAPA_SHARED", str(tmp_path / "nowhere"))
  c = base.get_config().data
  with pytest.raises(data.DataError, match=r"lacks 'train\.tsv'.* It is the task's default "
                     r"under \$PAPA_SHARED \(.*nowhere, set\): point PAPA_SHARED at the folder "
                     r"that holds data/, or set data\.data_dir to the task's files\."):
    data.check_files(c, ("train",))
  c.data_dir = str(tmp_path)
  with pytest.raises(data.DataError) as e:
    data.check_files(c, ("train",))
  assert "PAPA_SHARED" not in str(e.value)


def test_invalid_config_custom_block_without_task_custom(tmp_path):
  c = base.get_config().data
  c.custom.format = "csv"
  with pytest.raises(data.TaskConfigError, match=r"data\.custom\.format is set but "
                     r"data\.task='sst2': set data\.task='custom'"):
    data.check_files(c, ("train",))


def test_invalid_config_source_and_task(tmp_path):
  cfg = custom_config(tmp_path, **CSV)
  cfg.source = "tfds"
  with pytest.raises(data.TaskConfigError, match=r"data.source='tfds' but task custom is not in "
                     "the TFDS catalog"):
    data.check_files(cfg, ("train",))
  cfg.source = "hub"
  with pytest.raises(data.TaskConfigError, match=r"data\.source='hub': use one of"):
    data.check_files(cfg, ("train",))
  c = base.get_config().data
  c.task = "sst5"
  with pytest.raises(data.TaskConfigError, match=r"Unknown task 'sst5'.*data\.task='custom'"):
    data.check_files(c, ("train",))


def test_invalid_config_metrics_the_labels_cannot_support(tmp_path):
  write(tmp_path, "t.csv", "text,label\na,x\nb,y\nc,z\n")
  cfg = custom_config(tmp_path, **{**CSV, "metrics": ("f1",)})
  with pytest.raises(data.TaskConfigError, match=r"metric 'f1' is binary F1 \(of the second "
                     r"label\) but there are 3 labels \(collected from the train split\)"):
    data.resolve_task(cfg)
  cfg.custom.update(dict(metrics=(), label_names=("x",)))
  with pytest.raises(data.TaskConfigError, match=r"needs two classes or more; "
                     r"data\.custom\.label_names is \['x'\]"):
    data.resolve_task(cfg)
  write(tmp_path, "t.txt", "a NOUN\nb VERB\n")
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="t.txt", validation="t.txt",
                      metrics=("f1", "accuracy"))
  with pytest.raises(data.TaskConfigError, match=r"entity f1 chunks IOB/IOBES tags.*include "
                     r"\['NOUN', 'VERB'\]; use data\.custom\.metrics=\('accuracy',\)"):
    data.resolve_task(cfg)
