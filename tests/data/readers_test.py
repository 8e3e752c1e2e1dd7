"""Readers of the official formats, on the real shared files and on bad files."""

import pytest

from papa_jax.data import readers, tasks
from tests.testing import require_shared


@pytest.mark.parametrize("task,subdir,split,rows,extra", [
    ("sst2", "sst2", "train", 67349, {0: 29780, 1: 37569}),
    ("sst2", "sst2", "validation", 872, {0: 428, 1: 444}),
    ("cola", "cola", "train", 8551, {0: 2528, 1: 6023}),
    ("cola", "cola", "validation", 1043, {0: 322, 1: 721}),
    ("ner", "conll2003", "train", 14041, 203621),
    ("ner", "conll2003", "validation", 3250, 51362),
    ("pos", "conll2003", "test", 3453, 46435),
])
def test_readers_match_published_counts(task, subdir, split, rows, extra):
  d = require_shared("data", subdir)
  recs = list(readers.read_split(tasks.get_task(task), str(d), split))
  assert len(recs) == rows
  assert [r["idx"] for r in recs] == list(range(rows))
  if isinstance(extra, dict):
    assert {k: sum(r["label"] == k for r in recs) for k in extra} == extra
  else:
    assert sum(len(r["tokens"]) for r in recs) == extra


def test_readers_ner_tag_counts():
  d = require_shared("data", "conll2003")
  task = tasks.get_task("ner")
  recs = list(readers.read_split(task, str(d), "train"))
  counts = {t: 0 for t in task.label_names}
  for r in recs:
    for t in r["tags"]:
      counts[task.label_names[t]] += 1
  assert counts["B-PER"] == 6600 and counts["I-MISC"] == 1155 and counts["O"] == 169578


def _write(tmp_path, name, text):
  p = tmp_path / name
  p.write_text(text)
  return tmp_path


def test_invalid_bad_tsv_row_names_file_and_line(tmp_path):
  d = _write(tmp_path, "train.tsv", "sentence\tlabel\ngood one\t1\nno label here\n")
  with pytest.raises(readers.DataError, match=r"train.tsv:3: expected 2 tab-separated fields"):
    list(readers.read_split(tasks.get_task("sst2"), str(d), "train"))
  stats = readers.ReadStats()
  recs = list(readers.read_split(tasks.get_task("sst2"), str(d), "train",
                                 skip_malformed=True, stats=stats))
  assert len(recs) == 1 and stats.skipped == 1


def test_invalid_label_outside_label_set(tmp_path):
  d = _write(tmp_path, "train.tsv", "sentence\tlabel\nfine\t1\nodd\t7\n")
  with pytest.raises(readers.DataError, match=r"train.tsv:3: label '7' is not in the label set"):
    list(readers.read_split(tasks.get_task("sst2"), str(d), "train"))
  d2 = tmp_path / "c"
  d2.mkdir()
  (d2 / "train.txt").write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP B-VERB\n\n")
  with pytest.raises(readers.DataError, match=r"train.txt:2: tag 'B-VERB'"):
    list(readers.read_split(tasks.get_task("ner"), str(d2), "train"))


def test_invalid_empty_and_missing_files(tmp_path):
  (tmp_path / "train.tsv").write_text("")
  with pytest.raises(readers.DataError, match="is empty"):
    list(readers.read_split(tasks.get_task("sst2"), str(tmp_path), "train"))
  with pytest.raises(readers.DataError, match=r"lacks 'dev.tsv'.*expected files"):
    list(readers.read_split(tasks.get_task("sst2"), str(tmp_path), "validation"))
  (tmp_path / "header_only.tsv").write_text("sentence\tlabel\n")
  task = tasks.Task(**{**tasks.get_task("sst2").__dict__, "files": {"train": "header_only.tsv"}})
  with pytest.raises(readers.DataError, match="no data rows"):
    list(readers.read_split(task, str(tmp_path), "train"))


def test_invalid_conll_wrong_column_count(tmp_path):
  (tmp_path / "train.txt").write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-ORG\n")
  with pytest.raises(readers.DataError, match=r"train.txt:3: expected 4 space-separated"):
    list(readers.read_split(tasks.get_task("ner"), str(tmp_path), "train"))


def test_invalid_unknown_task():
  with pytest.raises(ValueError, match="Unknown task 'sst3'; known tasks"):
    tasks.get_task("sst3")
