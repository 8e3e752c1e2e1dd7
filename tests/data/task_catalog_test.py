"""The TFDS catalog path (data.source="tfds") maps catalog features to records."""

import dataclasses

import pytest
import tensorflow_datasets as tfds

from configs import base
from papa_jax import data
from papa_jax.data import sources, tasks

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name,split", [("sst2", "train"), ("mrpc", "validation"),
                                        ("mnli", "validation"), ("ner", "train")])
def test_task_catalog_records_map_tfds_features(name, split, tmp_path):
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


def test_task_catalog_refuses_tasks_it_does_not_have(tmp_path):
  c = base.get_config().data
  c.task, c.source, c.data_dir = "udpos", "tfds", str(tmp_path)
  with pytest.raises(data.TaskConfigError, match="task udpos is not in the TFDS catalog"):
    data.check_files(c, ("train",))


def test_task_catalog_source_binds_dataset_version_split_and_prepared_files(tmp_path):
  from papa_jax.workdir import input_files  # pylint: disable=import-outside-toplevel
  with tfds.testing.mock_data(num_examples=6, policy=tfds.testing.MockPolicy.USE_CODE):
    mocked = sources.catalog_source(tasks.get_task("sst2"), "validation", str(tmp_path / "m"))
  assert mocked == dict(tfds="glue/sst2/2.0.0", tfds_split="validation", files={})
  tfds.testing.DummyDataset(data_dir=str(tmp_path), file_format="array_record"
                            ).download_and_prepare()  # Offline: a real prepared catalog entry.
  task = dataclasses.replace(tasks.get_task("sst2"), tfds_name="dummy_dataset",
                             tfds_splits={"train": "train"})
  old = sources.catalog_source(task, "train", str(tmp_path))
  [path] = old["files"]
  assert old["tfds"] == "dummy_dataset/1.0.0" and path.startswith(str(tmp_path))
  with open(path, "r+b") as f:
    last = f.read()[-1]
    f.seek(-1, 2)
    f.write(bytes([last ^ 1]))
  new = sources.catalog_source(task, "train", str(tmp_path), old)
  assert input_files.changes(dict(train=old), dict(train=new), ["train"]) == [
      f"train: {path} changed content (same size, {old['files'][path]['size']:,} bytes; "
      f"sha256 {old['files'][path]['sha256'][:12]}... -> {new['files'][path]['sha256'][:12]}...)"]
