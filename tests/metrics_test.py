"""Metrics against reference implementations on random inputs."""

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics as skm

from papa_jax.probing import metrics

pytestmark = pytest.mark.unit

seqeval = pytest.importorskip("seqeval.metrics")


@pytest.mark.parametrize("seed", range(5))
def test_metrics_classification_match_sklearn_and_scipy(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(5, 300))
  k = int(rng.integers(2, 4))
  pred, label = rng.integers(0, k, n), rng.integers(0, k, n)
  assert metrics.accuracy(pred, label) == pytest.approx(skm.accuracy_score(label, pred))
  assert metrics.matthews_corrcoef(pred, label) == pytest.approx(
      skm.matthews_corrcoef(label, pred), abs=1e-12)
  pb, lb = pred % 2, label % 2
  assert metrics.binary_f1(pb, lb) == pytest.approx(skm.f1_score(lb, pb, zero_division=0))
  x, y = rng.normal(size=n), rng.normal(size=n)
  y[: n // 3] = y[0]  # Ties for the rank correlation.
  assert metrics.pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y)[0], abs=1e-12)
  assert metrics.spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y)[0], abs=1e-12)


def test_metrics_mcc_degenerate_is_zero():
  assert metrics.matthews_corrcoef(np.ones(5, int), np.ones(5, int)) == 0.0
  assert skm.matthews_corrcoef(np.ones(5, int), np.ones(5, int)) == 0.0


@pytest.mark.parametrize("seed", range(8))
def test_metrics_entity_scores_match_seqeval(seed):
  rng = np.random.default_rng(seed)
  tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "I-MISC", "B-MISC"]
  def seqs():
    return [[tags[i] for i in rng.integers(0, len(tags), int(rng.integers(1, 20)))]
            for _ in range(30)]
  pred = seqs()
  label = [[tags[i] for i in rng.integers(0, len(tags), len(p))] for p in pred]
  got = metrics.entity_scores(pred, label)
  assert got["f1"] == pytest.approx(seqeval.f1_score(label, pred), abs=1e-12)
  assert got["precision"] == pytest.approx(seqeval.precision_score(label, pred), abs=1e-12)
  assert got["recall"] == pytest.approx(seqeval.recall_score(label, pred), abs=1e-12)
  assert got["accuracy"] == pytest.approx(seqeval.accuracy_score(label, pred), abs=1e-12)
