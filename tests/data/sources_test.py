"""TFDS paths: the local builder equals the readers; the catalog path maps features."""

import shutil

import pytest
import tensorflow_datasets as tfds

from papa_jax.data import readers, sources, tasks
from tests.testing import require_shared


def test_local_tfds_records_equal_direct_reading(tmp_path):
  d = require_shared("data", "cola")
  task = tasks.get_task("cola")
  got = sources.local_records(task, str(d), "validation", str(tmp_path))
  want = list(readers.read_split(task, str(d), "validation"))
  assert got == want


def test_local_tfds_reprepares_when_files_change(tmp_path):
  src = require_shared("data", "sst2")
  d = tmp_path / "sst2"
  d.mkdir()
  shutil.copy(src / "dev.tsv", d / "dev.tsv")
  task = tasks.get_task("sst2")
  first = sources.local_records(task, str(d), "validation", str(tmp_path / "tfds"))
  lines = (d / "dev.tsv").read_text().splitlines()
  (d / "dev.tsv").write_text("\n".join(lines[:11]) + "\n")  # Header + 10 rows.
  second = sources.local_records(task, str(d), "validation", str(tmp_path / "tfds"))
  assert len(first) == 872 and len(second) == 10 and second == first[:10]


@pytest.mark.parametrize("name,split", [("sst2", "train"), ("mrpc", "validation"),
                                        ("mnli", "validation"), ("ner", "train")])
def test_catalog_records_map_tfds_features(name, split, tmp_path):
  task = tasks.get_task(name)
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    recs = sources.catalog_records(task, split, str(tmp_path))
  assert len(recs) == 6
  if task.kind == "tagging":
    assert set(recs[0]) == {"idx", "tokens", "tags"}
    assert all(0 <= t < task.num_labels for r in recs for t in r["tags"])
  else:
    assert set(recs[0]) == {"idx", "text_a", "text_b", "label"}
    assert all(isinstance(r["text_a"], str) for r in recs)
    assert all(bool(r["text_b"]) == task.is_pair for r in recs)
