"""Batching: fixed shapes, padding rows invalid, seeded order."""

import numpy as np

import pytest

from papa_jax.data import pipeline
from papa_jax.data.preprocess import IGNORE, Encoded

pytestmark = pytest.mark.unit


def _data(n, L=5, tagging=False):
  ids = np.arange(n * L).reshape(n, L).astype(np.int32) + 1
  labels = np.full((n, L), 3, np.int32) if tagging else np.arange(n, dtype=np.int32)
  return Encoded(ids, np.ones_like(ids), np.zeros_like(ids), labels)


def test_batches_pad_last_and_mark_invalid():
  bs = list(pipeline.batches(_data(10), 4))
  assert [len(b["valid"]) for b in bs] == [4, 4, 4]
  assert bs[-1]["valid"].tolist() == [True, True, False, False]
  assert np.all(bs[-1]["attention_mask"][2:] == 0) and np.all(bs[-1]["input_ids"][2:] == 0)
  assert sorted(np.concatenate([b["labels"][b["valid"]] for b in bs]).tolist()) == list(range(10))
  tags = list(pipeline.batches(_data(3, tagging=True), 2))[-1]
  assert np.all(tags["labels"][1] == IGNORE)


def test_batches_order_is_seeded_and_resumable():
  a = [b["labels"].tolist() for b in pipeline.batches(_data(12), 4, shuffle=True, seed=1, epoch=2)]
  b = [b["labels"].tolist() for b in pipeline.batches(_data(12), 4, shuffle=True, seed=1, epoch=2)]
  c = [b["labels"].tolist() for b in pipeline.batches(_data(12), 4, shuffle=True, seed=1, epoch=3)]
  tail = [b["labels"].tolist() for b in pipeline.batches(_data(12), 4, shuffle=True, seed=1,
                                                         epoch=2, start=1)]
  assert a == b and a != c and tail == a[1:]
