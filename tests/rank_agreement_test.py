"""papa_jax/measures/rank_agreement.py against hand values and a calibration check."""

import numpy as np

import pytest

from papa_jax.measures import rank_agreement

pytestmark = pytest.mark.unit


def test_holm_matches_the_step_down_by_hand():
  got = rank_agreement.holm([0.01, 0.04, 0.03, 0.005, None])
  np.testing.assert_allclose(got[:4], [0.03, 0.06, 0.06, 0.02])
  assert got[4] is None


def test_head_rank_agreement_permutes_within_layers():
  """Scores that share only their depth trend: scipy's p-value calls every draw significant,
  the within-layer permutation p-value is calibrated (about 5% of null draws under 0.05);
  scores that agree inside each layer pass both; a constant score is undefined."""
  depth = np.repeat(np.arange(6.0)[:, None], 12, 1)
  null = []
  for seed in range(100):
    rng = np.random.default_rng(seed)
    r = rank_agreement.head_rank_agreement(depth + 0.1 * rng.normal(size=(6, 12)),
                                        depth + 0.01 * rng.normal(size=(6, 12)), n_perm=400,
                                        seed=seed)
    assert r["p_value"] < 1e-10
    null.append(r["p_within_layers"])
  assert 0.01 <= np.mean(np.asarray(null) < 0.05) <= 0.12
  rng = np.random.default_rng(0)
  x = depth + 0.1 * rng.normal(size=(6, 12))
  within = rank_agreement.head_rank_agreement(x, x + 0.01 * rng.normal(size=(6, 12)))
  assert within["rho"] > 0.99 and within["p_within_layers"] < 1e-3
  flat = rank_agreement.head_rank_agreement(x, np.ones((6, 12)))
  assert flat["rho"] is None and flat["heads"] == 72
