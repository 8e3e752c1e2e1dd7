"""The built-in Universal Dependencies POS task on a hand-written treebank directory."""

import numpy as np
import pytest

from configs import base
from papa_jax import data
from papa_jax.probing import metrics
from tests.data.conftest import write
from tests.data.format_conllu_test import CONLLU, UPOS, WORDS


def _treebank(tmp_path, files=("train", "dev")):
  for split in files:
    write(tmp_path, f"xx_spec-ud-{split}.conllu", CONLLU.replace("\n", "\r\n"))
  write(tmp_path, "README.md", "# UD_Xx-Spec\n")
  write(tmp_path, "LICENSE.txt", "CC BY-SA 4.0\n")
  c = base.get_config().data
  c.task, c.data_dir, c.max_length = "udpos", str(tmp_path), 16
  return c


@pytest.mark.unit
def test_udpos_reads_a_treebank_directory(tmp_path):
  cfg = _treebank(tmp_path)
  task = data.resolve_task(cfg)
  assert task.label_names == ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM",
                              "PART", "PRON", "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X")
  assert task.kind == "tagging" and task.metrics == ("accuracy",)
  recs = data.load_records(cfg, "validation")
  assert [r["tokens"] for r in recs] == WORDS
  assert [[task.label_names[t] for t in r["tags"]] for r in recs] == UPOS


@pytest.mark.integration
def test_udpos_encodes_first_word_pieces_and_scores_token_accuracy(tmp_path, minilm_tokenizer):
  cfg = _treebank(tmp_path)
  task = data.resolve_task(cfg)
  enc = data.load_split(cfg, "train", minilm_tokenizer, 2)
  labelled = enc.labels != data.IGNORE
  assert labelled.sum(1).tolist() == [6, 6, 2]  # "Hà Nội" is one word with one tag.
  assert enc.truncated == 0
  upos = [task.label_names.index(t) for t in UPOS[2]]
  assert enc.labels[2][labelled[2]].tolist() == upos
  logits = np.eye(17)[np.where(labelled, enc.labels, 0)]
  assert metrics.task_scores(task, logits, enc.labels) == {"accuracy": 1.0}
  cfg.max_length = 6  # [CLS] + 4 word pieces + [SEP]: the 6-word sentences lose words.
  short = data.load_split(cfg, "train", minilm_tokenizer, 2)
  assert short.truncated == 2  # "Vamos" is two word pieces, "Hà Nội" three.
  assert (short.labels != data.IGNORE).sum(1).tolist() == [3, 4, 2]


@pytest.mark.unit
def test_udpos_missing_or_ambiguous_files_list_the_directory(tmp_path):
  cfg = _treebank(tmp_path, files=("train", "test"))
  with pytest.raises(data.DataError, match=r"no file matches '\*-ud-dev.conllu' for the "
                     r"validation split of task udpos; it holds \['LICENSE.txt', 'README.md', "
                     r"'xx_spec-ud-test.conllu', 'xx_spec-ud-train.conllu'\]"):
    data.check_files(cfg, ("train", "validation"))
  write(tmp_path, "yy_other-ud-train.conllu", CONLLU)
  with pytest.raises(data.DataError, match=r"several files match .*xx_spec-ud-train.conllu"
                     r".*yy_other-ud-train.conllu.*for the train split"):
    data.check_files(cfg, ("train",))
  cfg.data_dir = ""
  with pytest.raises(data.TaskConfigError, match="data.data_dir is empty.*udpos"):
    data.check_files(cfg, ("train",))


@pytest.mark.unit
def test_udpos_tag_outside_the_universal_set(tmp_path):
  cfg = _treebank(tmp_path)
  bad = CONLLU.replace("\tNOUN\t_\tNumber=Sing", "\tNOUNX\t_\tNumber=Sing")
  path = write(tmp_path, "xx_spec-ud-dev.conllu", bad)
  with pytest.raises(data.DataError, match=rf"{path}:10: label 'NOUNX' is not in the udpos "
                     r"label set \['ADJ', 'ADP'.*'X'\]"):
    data.load_records(cfg, "validation")
