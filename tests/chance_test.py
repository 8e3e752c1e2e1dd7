"""Whether a probe learned anything: the check against the best constant prediction."""

import json

import numpy as np
import pytest

from papa_jax import chance, head_maps, results
from papa_jax.data.tasks import get_task
from papa_jax.workdir import rules as workdir
from papa_jax.workdir.layout import Layout

pytestmark = pytest.mark.unit

B = 500


def _oracle_diff_ci(task, labels, preds, constant, seed, level=0.95):
  """The documented streams in a plain loop: examples from rng([seed, 0]) (B rows of N),
  seeds from rng([seed, 1, 0]); each replicate's probe mean minus the constant's score."""
  from papa_jax.probing import metrics  # pylint: disable=import-outside-toplevel
  n, s = len(labels), len(preds)
  idx = np.random.default_rng([seed, 0]).integers(0, n, size=(B, n))
  pick = np.random.default_rng([seed, 1, 0]).integers(0, s, size=(B, s))
  score = lambda p, i: metrics.classification_scores([task.headline_metric], p[i].astype(
      np.float64), labels[i].astype(np.float64))[task.headline_metric]
  diffs = [np.mean([score(preds[j], idx[b]) for j in pick[b]]) - score(constant, idx[b])
           for b in range(B)]
  return tuple(np.percentile(diffs, [2.5, 97.5]))


@pytest.mark.parametrize("task_name", ["sst2", "cola"])
def test_probe_check_interval_equals_a_plain_bootstrap_loop(task_name):
  task = get_task(task_name)
  rng = np.random.default_rng(0)
  labels = rng.permutation(np.array([1] * 210 + [0] * 90))
  preds = [np.where(rng.random(300) < q, labels, 1 - labels) for q in (0.8, 0.75, 0.85)]
  c = chance.probe_check(task, labels, preds, n_boot=B, seed=7)
  name, score, const = chance.constant_prediction(task, labels)
  assert (name, score) == ((task.label_names[1], 0.7) if task_name == "sst2" else
                           (task.label_names[0], 0.0))
  np.testing.assert_allclose(c["diff_ci"], _oracle_diff_ci(task, labels, preds, const, 7),
                             rtol=0, atol=1e-12)
  assert c["informative"] is True and c["reason"] == ""


def test_majority_class_probe_is_uninformative_and_says_why():
  task, labels = get_task("sst2"), np.array([1] * 120 + [0] * 80)
  c = chance.probe_check(task, labels, {42: np.ones(200, int), 43: np.ones(200, int)}, n_boot=B)
  assert c["informative"] is False and c["constant"] == "positive" and c["diff"] == 0.0
  assert "'positive' 0.6000" in c["reason"] and "does not lie above 0" in c["reason"]
  assert chance.warning("The baseline probe", c).startswith(
      "The baseline probe learned nothing (uninformative): baseline 0.6000 vs constant")
  assert chance.warning("x", dict(c, informative=None)) == chance.warning("x", None) == ""


def test_sort_check_flags_gates_that_barely_moved_even_under_a_good_probe():
  task, labels = get_task("sst2"), np.array([0, 1] * 100)
  good = chance.sort_check(task, labels, labels.copy(), np.array([[-2.0, 1.0], [0.5, 3.0]]),
                           n_boot=B)
  assert good["informative"] is True and good["gate_spread"] > 0.5
  still = chance.sort_check(task, labels, labels.copy(), np.full((2, 2), 0.0008) *
                            np.array([[1, -1], [1, -1]]), n_boot=B)
  assert still["informative"] is False and still["gate_spread"] < chance.GATE_SPREAD_MIN
  assert "gates barely moved (sigmoid spread 0.0004" in still["reason"]
  both = chance.sort_check(task, labels, np.zeros(200, int), np.zeros((2, 2)), n_boot=B)
  assert both["informative"] is False and both["reason"].count(";") == 1
  assert both["reason"].startswith("sorting probe 0.5000 vs constant prediction")


def test_results_files_open_with_the_warning_and_keep_the_checks(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir, "git_revision", lambda: "test")
  row = dict(model="m", task="sst2", variant="raw", ordering="lambda", static_heads=0,
             total_heads=4, fraction=0.0, seed=42, metric="accuracy", score=0.6,
             best_score=0.6, examples=10, eval_examples=200, epochs=1, seconds=1.0, run="r")
  rows = [row, dict(row, static_heads=4, fraction=1.0)]
  labels = np.array([1] * 120 + [0] * 80)
  bad = chance.probe_check(get_task("sst2"), labels, [np.ones(200, int)], n_boot=B)
  meta = dict(check=bad, ranking_check=dict(bad, reason="its gates barely moved"))
  results.write_all(Layout(str(tmp_path)), rows, meta)
  md = (tmp_path / "results.md").read_text()
  assert md.split("\n")[2].startswith("**Uninformative.** The baseline probe learned nothing")
  assert "**Uninformative.** The sorting run learned nothing (uninformative): its gates" in md
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["check"]["informative"] is False and saved["check"]["constant"] == "positive"
  results.write_all(Layout(str(tmp_path)), rows, dict(check=dict(bad, informative=True)))
  assert "Uninformative" not in (tmp_path / "results.md").read_text()


def test_head_map_note_survives_the_file_and_reaches_its_title(tmp_path, monkeypatch):
  monkeypatch.setattr(workdir, "git_revision", lambda: "test")
  m = head_maps.HeadMap("sort", "lambda", np.zeros((2, 2)), "gate", note="learned nothing")
  head_maps.write(Layout(str(tmp_path)), "sort", [m], {})
  back = head_maps.read("sort", json.loads((tmp_path / "sort" / "stats.json").read_text()))
  assert back[0].note == "learned nothing" and back[0].title == "gate [learned nothing]"
