"""Seed statistics and the paired bootstrap against plain numpy loops."""

import numpy as np
import pytest

from papa_jax import uncertainty
from papa_jax.probing import metrics
from papa_jax.data.tasks import get_task

pytestmark = pytest.mark.unit


def _tags(task, rng, n, length, acc):
  """Gold and `acc`-accurate predicted tag ids `[n, length]`, -100 past each end."""
  k = task.num_labels
  gold = np.where(rng.random((n, length)) < 0.6, 0, rng.integers(0, k, (n, length)))
  keep = np.arange(length)[None] < rng.integers(1, length + 1, n)[:, None]
  def pred():
    return np.where(keep, np.where(rng.random((n, length)) < acc, gold,
                                   rng.integers(0, k, (n, length))), -100)
  return np.where(keep, gold, -100), pred


def _data(name, seed=0, n=120, seeds=(3, 2), acc=(0.8, 0.7)):
  """Labels and per-seed baseline/treatment predictions for a task."""
  task, rng = get_task(name), np.random.default_rng(seed)
  if task.kind == "tagging":
    labels, _ = _tags(task, rng, n, 12, 0.0)
    draw = lambda a: np.where(labels != -100, np.where(
        rng.random(labels.shape) < a, labels, rng.integers(0, task.num_labels, labels.shape)), -100)
  elif task.kind == "regression":
    labels = np.round(rng.uniform(0, 5, n), 1)  # Rounded: ties for Spearman.
    draw = lambda a: np.round(labels + rng.normal(0, 2 * (1 - a), n), 1)
  else:
    labels = rng.integers(0, task.num_labels, n)
    draw = lambda a: np.where(rng.random(n) < a, labels, rng.integers(0, task.num_labels, n))
  base = {s: draw(acc[0]) for s in range(seeds[0])}
  treat = {10 + s: draw(acc[1]) for s in range(seeds[1])}
  return task, labels, base, treat


def _reference_score(task, metric, pred, labels):
  """The metric straight from `papa_jax.probing.metrics`, as the pipeline scores."""
  if task.kind == "tagging":
    keep, names = labels != -100, np.asarray(task.label_names)
    if "f1" not in task.metrics:
      return metrics.accuracy(pred[keep], labels[keep])
    p = [list(names[x[k]]) for x, k in zip(pred, keep)]
    t = [list(names[x[k]]) for x, k in zip(labels, keep)]
    return metrics.entity_scores(p, t)[metric]
  return metrics.classification_scores([metric], pred, labels)[metric]


CASES = [("sst2", "accuracy"), ("cola", "matthews_correlation"), ("mnli", "accuracy"),
         ("mrpc", "f1"), ("stsb", "pearson"), ("stsb", "spearman"), ("ner", "f1"),
         ("ner", "precision"), ("ner", "accuracy"), ("pos", "accuracy"), ("chunk", "f1")]


@pytest.mark.parametrize("name,metric", CASES)
def test_metric_score_equals_metrics_on_full_data(name, metric):
  task, labels, base, _ = _data(name)
  for pred in base.values():
    assert uncertainty.metric_score(task, labels, pred, metric) == _reference_score(
        task, metric, pred, labels)


@pytest.mark.parametrize("name,metric", [c for c in CASES if c[0] != "ner" or c[1] == "f1"])
def test_paired_bootstrap_matches_plain_loop(name, metric):
  # Tagging: fewer sentences, as the loop re-chunks every resample in Python.
  task, labels, base, treat = _data(name, n=60 if name in ("ner", "chunk") else 120)
  n_boot, seed, n = 150, 7, len(labels)
  got = uncertainty.paired_bootstrap(task, labels, base, treat, n_boot=n_boot, seed=seed,
                                     metric=metric, return_samples=True)
  ex_rng = np.random.default_rng([seed, 0])
  base_rng, treat_rng = np.random.default_rng([seed, 1, 0]), np.random.default_rng([seed, 1, 1])
  b_preds, t_preds = [base[s] for s in sorted(base)], [treat[s] for s in sorted(treat)]
  rel, diff = [], []
  for _ in range(n_boot):
    idx = ex_rng.integers(0, n, size=n)
    sb = base_rng.integers(0, len(b_preds), size=len(b_preds))
    st = treat_rng.integers(0, len(t_preds), size=len(t_preds))
    b = np.mean([_reference_score(task, metric, b_preds[s][idx], labels[idx]) for s in sb])
    t = np.mean([_reference_score(task, metric, t_preds[s][idx], labels[idx]) for s in st])
    rel.append((b - t) / b)
    diff.append(b - t)
  np.testing.assert_allclose(got["samples"]["relative_drop"], rel, rtol=0, atol=1e-12)
  np.testing.assert_allclose(got["relative_drop_ci"], np.percentile(rel, [2.5, 97.5]),
                             rtol=0, atol=1e-12)
  np.testing.assert_allclose(got["abs_diff_ci"], np.percentile(diff, [2.5, 97.5]),
                             rtol=0, atol=1e-12)
  assert (got["n_boot"], got["n_examples"]) == (n_boot, n)
  assert (got["n_seeds_baseline"], got["n_seeds_treatment"]) == (3, 2)


@pytest.mark.parametrize("name,metric", [("cola", "matthews_correlation"), ("ner", "f1"),
                                         ("stsb", "spearman")])
def test_point_estimate_is_mean_of_full_data_metric(name, metric):
  task, labels, base, treat = _data(name, seed=1)
  got = uncertainty.paired_bootstrap(task, labels, base, treat, n_boot=20, metric=metric)
  want_b = [_reference_score(task, metric, base[s], labels) for s in sorted(base)]
  want_t = [_reference_score(task, metric, treat[s], labels) for s in sorted(treat)]
  assert got["baseline_seeds"] == want_b and got["treatment_seeds"] == want_t
  assert got["baseline"] == np.mean(want_b) and got["treatment"] == np.mean(want_t)
  assert got["relative_drop"] == pytest.approx((np.mean(want_b) - np.mean(want_t))
                                               / np.mean(want_b), abs=1e-15)


def test_chunked_resampling_equals_one_block(monkeypatch):
  task, labels, base, _ = _data("cola")
  _, whole = uncertainty.seed_scores(task, labels, base, n_boot=50, seed=3)
  monkeypatch.setattr(uncertainty, "_CHUNK_ELEMENTS", 7 * len(labels))  # 7 rows a block.
  _, chunked = uncertainty.seed_scores(task, labels, base, n_boot=50, seed=3)
  np.testing.assert_array_equal(chunked, whole)


@pytest.mark.parametrize("name", ["cola", "stsb"])
def test_many_conditions_equal_one_at_a_time(name):
  task, labels, base, treat = _data(name)
  many = uncertainty.seed_scores_many(task, labels, [base, treat], n_boot=40, seed=5)
  for preds, (full, boot) in zip((base, treat), many):
    one_full, one_boot = uncertainty.seed_scores(task, labels, preds, n_boot=40, seed=5)
    np.testing.assert_array_equal(full, one_full)
    np.testing.assert_array_equal(boot, one_boot)
  point = uncertainty.curve(task, labels, {0: base, 9: treat}, n_boot=40, seed=5)[1]
  band = uncertainty.score_band(task, labels, treat, n_boot=40, seed=5, stream=9)
  assert point["ci"] == band["ci"] and point["mean"] == band["mean"]


@pytest.mark.parametrize("name", ["sst2", "ner", "stsb"])
def test_identical_conditions_drop_zero(name):
  task, labels, base, _ = _data(name)
  one = {0: base[0]}  # One seed: nothing for the seed bootstrap to vary.
  got = uncertainty.paired_bootstrap(task, labels, one, one, n_boot=100)
  assert got["relative_drop"] == 0.0 and got["abs_diff"] == 0.0
  assert got["relative_drop_ci"] == (0.0, 0.0) and got["abs_diff_ci"] == (0.0, 0.0)
  assert got["within_noise"]
  same = {s: base[0] for s in range(3)}  # A deterministic probe: seeds agree.
  got = uncertainty.paired_bootstrap(task, labels, same, same, n_boot=100)
  assert got["relative_drop_ci"] == (0.0, 0.0)


def test_identical_conditions_with_seed_noise_are_within_noise():
  task, labels, base, _ = _data("sst2", n=400)
  got = uncertainty.paired_bootstrap(task, labels, base, base, n_boot=300)
  assert got["relative_drop"] == 0.0
  assert got["relative_drop_ci"][0] < 0.0 < got["relative_drop_ci"][1]
  assert got["within_noise"]


@pytest.mark.parametrize("name", ["sst2", "cola", "mrpc", "stsb", "ner", "pos"])
def test_clearly_worse_treatment_excludes_zero(name):
  task, labels, base, treat = _data(name, n=300, acc=(0.9, 0.5))
  got = uncertainty.paired_bootstrap(task, labels, base, treat, n_boot=200)
  lo, hi = got["relative_drop_ci"]
  assert 0.0 < lo <= got["relative_drop"] <= hi
  assert not got["within_noise"]


def test_relative_drop_undefined_for_nonpositive_baseline():
  task = get_task("cola")
  labels = np.array([0, 1] * 20)
  base = {0: np.zeros(40, int)}  # MCC 0: the drop relative to it is undefined.
  treat = {0: 1 - labels}
  got = uncertainty.paired_bootstrap(task, labels, base, treat, n_boot=50)
  assert np.isnan(got["relative_drop"]) and np.all(np.isnan(got["relative_drop_ci"]))
  assert got["undefined_resamples"] == 50 and got["abs_diff"] == 1.0
  assert got["within_noise"] is None and np.isnan(got["p_value"])  # Undefined, not noise.
  got = uncertainty.paired_bootstrap(task, labels, treat, base, n_boot=50)  # MCC -1 -> 0.
  assert np.isnan(got["relative_drop"]) and got["undefined_resamples"] == 50
  assert got["within_noise"] is None
  same = uncertainty.paired_bootstrap(task, labels, base, base, n_boot=50)  # 0 -> 0.
  assert same["within_noise"] is None and same["abs_diff_ci"] == (0.0, 0.0)


def test_drop_undefined_in_some_resamples_is_undefined_not_noise():
  """A baseline MCC just above 0 whose resamples reach 0 or below: the point drop is
  defined, its interval is not, so neither is the verdict."""
  task = get_task("cola")
  rng = np.random.default_rng(1)
  labels = rng.integers(0, 2, 200)
  weak = np.where(rng.random(200) < 0.53, labels, 1 - labels)  # MCC 0.13.
  got = uncertainty.paired_bootstrap(task, labels, {0: weak}, {0: 1 - labels}, n_boot=300)
  assert np.isfinite(got["relative_drop"]) and 0 < got["undefined_resamples"] < 300
  assert np.all(np.isnan(got["relative_drop_ci"])) and got["within_noise"] is None


@pytest.mark.parametrize("acc", [(0.8, 0.8), (0.8, 0.75), (0.9, 0.5)])
def test_within_noise_is_the_printed_interval_and_the_p_value_agrees(acc):
  task, labels, base, treat = _data("sst2", n=200, acc=acc)
  for level in (0.9, 0.95):
    got = uncertainty.paired_bootstrap(task, labels, base, treat, n_boot=400, level=level)
    lo, hi = got["relative_drop_ci"]
    assert got["within_noise"] == (lo <= 0 <= hi) == (got["p_value"] >= 1 - level)


def test_seed_summary_against_numpy():
  x = [0.81, 0.79, 0.84, 0.80]
  got = uncertainty.seed_summary(x)
  assert got == dict(mean=np.mean(x), std=np.std(x, ddof=1), n=4)
  one = uncertainty.seed_summary([0.8])
  assert one["mean"] == 0.8 and one["n"] == 1 and np.isnan(one["std"])
  with pytest.raises(ValueError):
    uncertainty.seed_summary([])


def test_curve_points_and_bands():
  task, labels, base, treat = _data("sst2", n=300, acc=(0.9, 0.5))
  got = uncertainty.curve(task, labels, {72: treat, 0: base}, n_boot=200)
  assert [p["k"] for p in got] == [0, 72]
  for p, preds in zip(got, (base, treat)):
    scores = [metrics.accuracy(preds[s], labels) for s in sorted(preds)]
    assert p["mean"] == np.mean(scores) and p["std"] == np.std(scores, ddof=1)
    assert p["n"] == len(preds) and p["ci"][0] < p["mean"] < p["ci"][1]
  assert got[0]["ci"][0] > got[1]["ci"][1]  # 95% vs 75% accurate: bands apart.


def test_every_report_path_draws_ten_thousand_resamples_by_default():
  import inspect
  from papa_jax import suite
  from papa_jax.config import schema as config_schema
  from papa_jax.report import build as report, controls as report_controls
  assert uncertainty.N_BOOT == 10_000
  assert config_schema.get_config().report.n_boot == uncertainty.N_BOOT
  for fn in (report.analyse, report.write_report, report_controls.analyse,
             suite.report_from_workdirs, uncertainty.paired_bootstrap, uncertainty.curve,
             uncertainty.score_band, uncertainty.seed_scores, uncertainty.seed_scores_many):
    assert inspect.signature(fn).parameters["n_boot"].default == uncertainty.N_BOOT, fn
