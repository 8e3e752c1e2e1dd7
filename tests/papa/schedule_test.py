"""Static-head counts and the head ranking."""

import json

import numpy as np
import pytest

from papa_jax.workdir.layout import Layout
from papa_jax.papa import schedule

pytestmark = pytest.mark.unit


def test_schedule_counts_for_base_large_and_minilm():
  assert schedule.static_head_counts(144, schedule.PAPER_FRACTIONS) == [0, 72, 126, 135, 144]
  assert schedule.static_head_counts(384, schedule.PAPER_FRACTIONS) == [0, 192, 336, 360, 384]
  assert schedule.static_head_counts(72, schedule.PAPER_FRACTIONS) == [0, 36, 63, 67, 72]
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    schedule.static_head_counts(72, (0.5, 1.5))


def test_schedule_ranking_ascending_lambda_roundtrip(tmp_path):
  lam = np.array([[0.3, -1.0, 0.3], [2.0, -5.0, 0.0]])
  path = schedule.save_ranking(Layout(str(tmp_path)), lam)
  assert path == str(tmp_path / "sort" / "sorted_heads.json")
  assert json.load(open(path)) == [[1, 1], [0, 1], [1, 2], [0, 0], [0, 2], [1, 0]]
  np.testing.assert_allclose(np.load(tmp_path / "sort" / "lambdas.npy"), lam)
  assert schedule.load_ranking(path, 2, 3)[0] == [1, 1]
  with pytest.raises(ValueError, match="not a ranking of this model's 3x3 heads"):
    schedule.load_ranking(path, 3, 3)


def test_head_mask_from_ranking():
  mask = schedule.head_mask_from_ranking([(1, 2), (0, 0), (1, 0)], 2, 2, 3)
  np.testing.assert_array_equal(mask, [[True, False, False], [False, False, True]])
  with pytest.raises(ValueError, match="does not exist"):
    schedule.head_mask_from_ranking([(5, 0)], 1, 2, 3)
  assert schedule.static_heads(None, 6, 2, 3).all()
