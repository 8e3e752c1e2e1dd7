"""The TFDS catalog path (data.source="tfds") maps catalog features to records."""

import pytest
import tensorflow_datasets as tfds

from configs import base
from papa_jax import data
from papa_jax.data import sources, tasks


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
