"""CoNLL column files: space/tab columns, -DOCSTART-, any tag column."""

import pytest

from papa_jax import data
from papa_jax.data import conll
from tests.data.conftest import custom_config, variants, write

pytestmark = pytest.mark.unit

CONLL = ("-DOCSTART- -X- -X- O\n"
         "\n"
         "EU NNP B-NP B-ORG\n"
         "rejects\tVBZ\tB-VP\tO\n"
         "German  JJ B-NP   B-MISC\n"
         "\n"
         "\n"
         "Peter NNP B-NP B-PER\n"
         "Blackburn NNP I-NP I-PER\n")


@pytest.mark.parametrize("variant", sorted(variants(CONLL)))
def test_format_conll_columns_docstart_bom_line_ends(tmp_path, variant):
  write(tmp_path, "t.txt", variants(CONLL)[variant])
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="t.txt",
                      validation="t.txt")  # tag_column -1: the last column.
  task = data.resolve_task(cfg)
  assert task.label_names == ("B-MISC", "B-ORG", "B-PER", "I-PER", "O")
  assert task.metrics == ("f1", "precision", "recall", "accuracy")  # IOB tags: entities.
  recs = data.load_records(cfg, "train")
  assert [r["tokens"] for r in recs] == [["EU", "rejects", "German"], ["Peter", "Blackburn"]]
  assert [[task.label_names[t] for t in r["tags"]] for r in recs] == [
      ["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"]]


def test_format_conll_any_column_as_tag_and_token(tmp_path):
  write(tmp_path, "t.txt", CONLL)
  cfg = custom_config(tmp_path, format="conll", kind="tagging", train="t.txt",
                      validation="t.txt", tag_column=1)
  task = data.resolve_task(cfg)
  assert task.label_names == ("JJ", "NNP", "VBZ") and task.metrics == ("accuracy",)
  cfg.custom.update(dict(token_column=2, tag_column=0))
  recs = data.load_records(cfg, "train")
  assert recs[0]["tokens"] == ["B-NP", "B-VP", "B-NP"]


def test_format_conll_tab_separator_keeps_spaces_in_tokens(tmp_path):
  path = write(tmp_path, "t.tsv", "New York\tPROPN\n!\tPUNCT\n\nno\u00a0break\tX\n")
  sents = list(conll.read_conll(str(path), token_column=0, tag_column=1, separator="tab"))
  assert [s.tokens for s in sents] == [("New York", "!"), ("no\u00a0break",)]
  assert [s.tag_lines for s in sents] == [(1, 2), (4,)]
  # With the default separator a no-break space is part of the token, not a column break.
  path = write(tmp_path, "u.txt", "no\u00a0break X\n")
  assert [s.tokens for s in conll.read_conll(str(path), token_column=0, tag_column=1)] == [
      ("no\u00a0break",)]
