"""The report's claims: undefined drops, uninformative cells, Holm and the correlation."""

import dataclasses
import csv
import json

import numpy as np
import pytest

from papa_jax import significance, uncertainty
from papa_jax.measures import rank_agreement
from papa_jax.report import build as report
from papa_jax.report import caveats as report_caveats
from papa_jax.data.tasks import get_task

pytestmark = pytest.mark.unit

N_BOOT = 400
LABELS = np.array([0, 1] * 100)  # Balanced: the best constant prediction scores 0.5.


def _acc(frac, shift=0):
  """SST-2 predictions right on a `frac` share of LABELS (a block of errors at `shift`)."""
  p = LABELS.copy()
  wrong = (np.arange(200) + shift) % 200 < int(round((1 - frac) * 200))
  p[wrong] = 1 - p[wrong]
  return p


def _cell(model, base, treat, task="sst2"):
  return report.Experiment(
      model=model, task=get_task(task), total_heads=4, labels=LABELS, seeds=(0, 1),
      predictions={("raw", 0): {0: _acc(base, 3), 1: _acc(base + 0.01, 50)},
                   ("raw", 4): {0: _acc(treat, 90), 1: _acc(treat - 0.01, 140)}})


def _md_row(md, start, section="Baseline, all heads"):
  """The row starting with `start` in the table under `## section...`."""
  part = md.split("\n## " + section, 1)[1].split("\n## ", 1)[0] if section else md
  rows = [line for line in part.splitlines() if line.startswith(start)]
  assert len(rows) == 1, (start, rows)
  return [c.strip() for c in rows[0].strip("|").split("|")]


def test_undefined_drops_are_never_within_noise(tmp_path):
  """MCC 0 -> 0: the old rule judged it on the absolute difference, whose interval
  [0, 0] contains 0, and counted it "within noise". Now it is undefined in the JSON,
  the CSV, the table and the counts; so is a drop whose baseline is > 0 on the dev set
  but <= 0 in some resamples."""
  rng = np.random.default_rng(1)
  weak = np.where(rng.random(200) < 0.53, LABELS, 1 - LABELS)  # MCC 0.13, 0 in resamples.
  zero = report.Experiment(model="m", task=get_task("cola"), total_heads=4, labels=LABELS,
                           predictions={("raw", 0): {0: np.zeros(200, int)},
                                        ("raw", 2): {0: np.zeros(200, int)},
                                        ("raw", 4): {0: np.zeros(200, int)}})
  some = report.Experiment(model="w", task=get_task("cola"), total_heads=4, labels=LABELS,
                           predictions={("raw", 0): {0: weak}, ("raw", 4): {0: weak[::-1]}})
  paths = report.write_report([zero, some, _cell("a", 0.9, 0.8)], str(tmp_path), n_boot=N_BOOT)
  js = json.load(open(paths["json"]))
  conds = [c for r in js["experiments"][:2] for c in r["conditions"] if c["static_heads"]]
  assert len(conds) == 3 and all(c["within_noise"] is None for c in conds)
  assert all(c["p_value"] is None and c["holm_p"] is None for c in conds)
  md = open(paths["md"]).read()
  assert _md_row(md, "| m | cola | raw |")[5:] == [
      "undefined (baseline <= 0)", "uninformative", "0.0000 ± –", "undefined (baseline <= 0)",
      "uninformative"]
  row = _md_row(md, "| w | cola | raw |")
  assert "[undefined: baseline <= 0 in" in row[5] and "within noise" not in row[5]
  assert "0 of 1 relative drops in the main table" in md  # Only a/sst2 is counted.
  assert "prints 7 95% intervals: 1 relative drops (main table), 1 per-model averages, 2 " \
      "intervals of the paper's claims (two each), 0 per-task correlations, 3 baseline − " \
      "constant differences" in md
  # (The undefined drops are not intervals.)
  assert "never counted as within noise) for: m/cola; w/cola." in md
  rows = list(csv.DictReader(open(paths["csv"])))
  assert {r["within_noise"] for r in rows if r["task"] == "cola" and r["static_heads"] != "0"} \
      == {""}


def _claims_suite():
  """Five informative SST-2 cells whose drop grows with the baseline, and one at chance
  (0.53 vs 0.50) whose large drop would reverse the ranking if it were counted."""
  good = [_cell(f"m{i}", b, b * (1 - d))
          for i, (b, d) in enumerate(zip((0.70, 0.75, 0.80, 0.85, 0.90),
                                         (0.02, 0.05, 0.08, 0.11, 0.14)))]
  return good, _cell("chance", 0.53, 0.30)


def _oracle(exps):
  """Per cell, `uncertainty.paired_bootstrap` with the report's documented seed and streams
  (the same seeds run in both conditions: the same seed stream, seed pairing)."""
  return [uncertainty.paired_bootstrap(
      e.task, e.labels, e.predictions[("raw", 0)], e.predictions[("raw", 4)], n_boot=N_BOOT,
      seed=uncertainty.task_seed(0, e.task.name), streams=(0, 0),
      return_samples=True) for e in exps]


@pytest.fixture(scope="module")
def claims(tmp_path_factory):
  good, chance = _claims_suite()
  paths = report.write_report(good + [chance], str(tmp_path_factory.mktemp("claims")),
                              n_boot=N_BOOT)
  return good, chance, report.analyse(good + [chance], n_boot=N_BOOT), open(paths["md"]).read()


def test_uninformative_cells_are_left_out_of_every_claim(claims):
  good, _, rep, md = claims
  checks = {r["model"]: r["check"] for r in rep["experiments"]}
  assert all(checks[e.model]["informative"] for e in good)
  assert checks["chance"]["informative"] is False
  assert checks["chance"]["constant"] == "negative" and checks["chance"]["constant_score"] == 0.5
  lo, hi = checks["chance"]["diff_ci"]
  assert lo <= 0 < hi and checks["chance"]["diff"] == pytest.approx(0.035)
  assert "chance" not in {a["model"] for a in rep["model_averages"]}
  assert rep["correlation"]["raw"]["n"] == 5
  assert rep["correlation"]["raw"]["left_out"] == ["chance/sst2 (uninformative)"]
  assert rep["multiplicity"]["n_tests"] == 5  # The drops; one-task averages are the same.
  chance = rep["experiments"][-1]["summary"][0]["all"]
  assert chance["holm_p"] is None and np.isfinite(chance["relative_drop"])
  assert _md_row(md, "| chance | sst2 | raw |")[6] == "uninformative"
  assert _md_row(md, "| chance | sst2 | accuracy |", None)[-1] == "no: *uninformative*"
  assert "or not checked: chance/sst2 (baseline 0.5350 vs constant prediction 'negative'" in md
  assert "of 5 relative drops in the main table" in md


def test_holm_and_p_values_are_the_documented_ones(claims):
  good, _, rep, md = claims
  want = _oracle(good)
  rows = [r["summary"][0]["all"] for r in rep["experiments"][:5]]
  for row, w in zip(rows, want):
    assert row["relative_drop_ci"] == w["relative_drop_ci"]
    assert row["p_value"] == significance.bootstrap_p_value(w["samples"]["relative_drop"])
    lo, hi = row["relative_drop_ci"]
    assert row["within_noise"] == (lo <= 0 <= hi)  # The printed interval's verdict.
  adjusted = rank_agreement.holm([m["p_value"] for m in rows])
  assert [m["holm_p"] for m in rows] == adjusted
  averages = rep["model_averages"]  # One task each: the drop's test, not a second one.
  assert [a["holm_p"] for a in averages] == adjusted
  members = rows + averages
  for m in members:
    assert m["within_noise_adjusted"] == (m["holm_p"] >= 0.05)
    assert m["within_noise_adjusted"] or not m["within_noise"]  # Never less cautious.
  assert "one family of 5 tests" in md


def test_correlation_is_spearman_over_informative_cells_with_its_interval(claims):
  good, chance, rep, md = claims
  want = _oracle(good)
  x = [w["baseline"] for w in want]
  y = [w["relative_drop"] for w in want]
  oracle = significance.rank_correlation(
      x, y, np.stack([w["samples"]["baseline"] for w in want], 1),
      np.stack([w["samples"]["relative_drop"] for w in want], 1))
  got = rep["correlation"]["raw"]
  assert (got["rho"], got["ci"], got["verdict"]) == (oracle["rho"], oracle["ci"], "positive")
  assert got["rho"] == pytest.approx(1.0)
  with_chance = _oracle([chance])[0]
  assert significance.rank_correlation(
      x + [with_chance["baseline"]], y + [with_chance["relative_drop"]],
      np.zeros((1, 6)), np.zeros((1, 6)))["rho"] < 0.5  # Counting it would change the answer.
  ci = got["ci"]
  assert (f"| raw | 5 | {got['rho']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}] | positive | "
          "chance/sst2 (uninformative) |") in md
  four = report.analyse(good[:4], n_boot=50)["correlation"]["raw"]
  assert four["verdict"] == "not tested" and four["rho"] is None
  assert "Not tested: n = 4 informative (model, task) pairs in tasks with 3 or more models " \
      "< 5." in report.analyse(
      good[:4], n_boot=50)["caveats"][0]


def _claim_cell(drop_all, drop_half, reps_all, reps_half):
  """A minimal informative cell for `report_claims.claims` (4 heads: half is 2)."""
  r = dict(model=f"m{drop_all}", task="sst2", check=dict(informative=True),
           baseline=dict(mean=0.5),
           summary=[dict(variant="raw", all=dict(relative_drop=drop_all, static_heads=4),
                         half=dict(relative_drop=drop_half, static_heads=2))])
  return r, dict(drops={("raw", 4): np.asarray(reps_all), ("raw", 2): np.asarray(reps_half)},
                 baseline=np.full(len(reps_all), 0.5))


@pytest.mark.parametrize("all_reps,half_reps,rho_ci,want", [
    ([0.05, 0.07, 0.09, 0.11], [0.0, 0.005, 0.01, 0.015], (0.1, 0.7),
     ("supported", "supported", "supported")),  # 8% inside, 0 outside; half below 2%.
    ([0.00, 0.01, 0.02, 0.03], [0.02, 0.03, 0.04, 0.05], (-0.7, -0.1),
     ("contradicted", "contradicted", "contradicted")),  # 8% outside; half above 2%.
    ([-0.02, 0.03, 0.07, 0.12], [0.0, 0.01, 0.02, 0.03], (-0.1, 0.7),
     ("within noise", "within noise", "within noise")),  # 0 and 8% inside; 2% inside.
])
def test_paper_claims_verdicts_follow_their_intervals(all_reps, half_reps, rho_ci, want):
  from papa_jax.report import claims as report_claims  # pylint: disable=import-outside-toplevel
  cells = [_claim_cell(float(np.mean(all_reps)), float(np.mean(half_reps)), all_reps,
                       half_reps)]
  corr = {"raw": dict(n=5, rho=0.3, ci=rho_ci, verdict="?", pairs=[])}
  got = report_claims.claims([c for c, _ in cells], [d for _, d in cells], corr, 0.95)
  assert tuple(c["verdict"] for c in got[:2]) == want[:2]
  assert got[2]["across_tasks"]["verdict"] == want[2]  # The secondary, pooled over tasks.
  assert got[2]["verdict"] == "not tested"  # One cell: no task with 3 models.
  assert [c["kind"] for c in got] == [report_claims.DROP] * 2 + [report_claims.CORRELATION]
  for c in got[:2]:  # One cell: resampling cells changes nothing.
    assert c["general"]["ci"] == c["ci"] and c["general"]["verdict"] == c["verdict"]
  lo, hi = uncertainty.percentile_interval(np.asarray(all_reps), 0.95)
  assert got[0]["ci"] == (lo, hi) and got[0]["n"] == 1
  none = report_claims.claims([], [], {"raw": dict(n=3, rho=None, ci=None,
                                                   verdict="not tested", note="n = 3 < 5")},
                              0.95)
  assert [c["verdict"] for c in none] == ["not tested"] * 3


def test_claims_average_informative_cells_like_the_oracle(claims):
  good, _, rep, md = claims
  want = _oracle(good)
  mean = np.mean([w["samples"]["relative_drop"] for w in want], 0)
  first = rep["claims"][0]
  assert first["n"] == 5 and "chance/sst2" not in first["cells"]  # Uninformative: left out.
  assert first["estimate"] == pytest.approx(np.mean([w["relative_drop"] for w in want]))
  assert first["ci"] == uncertainty.percentile_interval(mean, 0.95)
  lo, hi = first["ci"]
  assert first["verdict"] == ("supported" if lo > 0 and lo <= 0.08 <= hi else
                              "contradicted" if not lo <= 0.08 <= hi else "within noise")
  assert rep["claims"][1]["verdict"] == "not tested"  # No half-heads condition was run.
  assert rep["claims"][2]["verdict"] == "supported"  # rho's interval lies above 0.
  row = _md_row(md, "| All heads constant", "The paper's claims, tested")
  glo, ghi = first["general"]["ci"]
  assert row[2:] == ["5", f"{100 * first['estimate']:.2f}%", f"[{100 * lo:.2f}%, {100 * hi:.2f}%]",
                     f"**{first['verdict']}**", f"[{100 * glo:.2f}%, {100 * ghi:.2f}%]",
                     f"**{first['general']['verdict']}**", "–"]


def test_a_drop_undefined_in_some_resamples_is_left_out_of_the_claims_averages():
  """MCC 0.08 whose baseline is <= 0 in some resamples: its relative drop (here 80%) has
  no interval and would swamp a mean over cells; it is named and left out."""
  from papa_jax.report import claims as report_claims  # pylint: disable=import-outside-toplevel
  good = _claim_cell(0.02, 0.0, [0.01, 0.02, 0.03], [0.0, 0.0, 0.0])
  shaky = _claim_cell(0.80, 0.3, [0.5, np.nan, 0.9], [0.1, np.nan, 0.4])
  shaky[0]["model"] = "shaky"
  got = report_claims.claims([good[0], shaky[0]], [good[1], shaky[1]], {}, 0.95)
  for c in got[:2]:
    assert c["n"] == 1 and c["cells"] == ["m0.02/sst2"] and c["ci"] is not None
    assert c["left_out"] == ["shaky/sst2 (relative drop undefined in some resamples)"]
  assert got[0]["estimate"] == pytest.approx(0.02)


def test_per_model_averages_claims_and_correlation_leave_out_the_same_cells():
  """One rule (`report_claims._no_interval`): a task whose drop is undefined in some
  resamples is left out of its model's average as of the claims, and named in both; the
  average keeps its interval (it used to lose it, printing a point mean with no interval)."""
  from papa_jax.report import claims as report_claims  # pylint: disable=import-outside-toplevel
  good = _claim_cell(0.02, 0.0, [0.01, 0.02, 0.03], [0.0, 0.0, 0.0])
  shaky = _claim_cell(0.80, 0.3, [0.5, np.nan, 0.9], [0.1, np.nan, 0.4])
  shaky[0]["task"] = "cola"
  shaky[0]["model"] = good[0]["model"]
  results, reps = [good[0], shaky[0]], [good[1], shaky[1]]
  averages = report_claims.model_averages(results, reps, 0.95)
  assert [a["heads"] for a in averages] == ["all", "half"]
  named = ["m0.02/cola (relative drop undefined in some resamples)"]
  for a in averages:
    assert a["tasks"] == ["sst2"] and a["left_out"] == named and a["ci"] is not None
  assert averages[0]["mean_relative_drop"] == pytest.approx(0.02)
  got = report_claims.claims(results, reps, {}, 0.95)
  assert [c["left_out"] for c in got[:2]] == [named, named]
  assert [c["key"] for c in got] == ["all", "half", "correlation"]
  for r, d in zip(results, reps):
    r.update(baseline=dict(mean=0.5), metric="accuracy")
    d["baseline"] = np.full(3, 0.5)
  corr = report_claims.correlations(results, reps, 0.95)["raw"]
  assert corr["undefined"] == named and corr["left_out"] == named


def test_cells_trained_on_different_subset_sizes_are_named_in_the_caveats():
  """The ladder trains its largest model on fewer examples: averages and the correlation
  then mix recipe with model, and the report says so, per model (only then)."""
  import dataclasses  # pylint: disable=import-outside-toplevel
  good, chance = _claims_suite()
  same = [dataclasses.replace(e, train_examples=2000) for e in good]
  mixed = same[:4] + [dataclasses.replace(good[4], train_examples=500)]
  # An uninformative cell's size does not count: it enters no average.
  text = " ".join(report.analyse(same + [dataclasses.replace(chance, train_examples=10)],
                                 n_boot=50)["caveats"])
  assert "different train subsets" not in text
  text = " ".join(report.analyse(mixed, n_boot=50)["caveats"])
  assert ("different train subsets (m0: 2000 examples; m1: 2000 examples; m2: 2000 examples; "
          "m3: 2000 examples; m4: 500 examples)") in text


def test_a_cell_whose_drop_is_left_out_is_not_marked_in_the_claims():
  """Informative, but its drop has no interval: the tables' "in the claims" column and the
  CSV's in_claims say it stayed out of the claims, and why (it said "yes" before)."""
  from papa_jax.report import claims as report_claims, markdown as report_markdown  # pylint: disable=import-outside-toplevel
  good = _claim_cell(0.02, 0.0, [0.01, 0.02, 0.03], [0.0, 0.0, 0.0])
  shaky = _claim_cell(0.80, 0.3, [0.5, np.nan, 0.9], [0.1, np.nan, 0.4])
  half = _claim_cell(0.10, 0.3, [0.1, 0.1, 0.1], [0.1, np.nan, 0.4])
  shaky[0]["model"], half[0]["model"] = "shaky", "half"
  cells = [good, shaky, half]
  results = [c for c, _ in cells]
  for r in results:
    r["check"].update(constant="0", constant_score=0.0, diff=0.1, diff_ci=(0.05, 0.15))
  report_claims.mark_cells(results, report_claims.claims(results, [d for _, d in cells], {},
                                                         0.95))
  assert [r["in_claims"] for r in results] == [["all", "half"], [], ["all"]]
  why = "relative drop undefined in some resamples"
  assert [report_markdown._check(r)[2] for r in results] == [  # pylint: disable=protected-access
      "yes", f"no: {why}", f"partly (all); {why}"]


def test_leave_one_model_out_drop_claims():
  """A claim decided by one model says so: the 8% average over a cell near 8% and one near
  30% is contradicted, supported without the 30% model, contradicted without the other."""
  from papa_jax.report import claims as report_claims  # pylint: disable=import-outside-toplevel
  near = _claim_cell(0.08, 0.0, [0.06, 0.08, 0.10], [0.0, 0.0, 0.01])
  far = _claim_cell(0.30, 0.0, [0.28, 0.30, 0.32], [0.0, 0.0, 0.01])
  got = report_claims.claims([near[0], far[0]], [near[1], far[1]], {}, 0.95)
  assert got[0]["verdict"] == "contradicted"
  assert {m: w["verdict"] for m, w in got[0]["without"].items()} == {
      "m0.08": "contradicted", "m0.3": "supported"}
  assert got[0]["without"]["m0.3"]["estimate"] == pytest.approx(0.08)
  text = report_caveats._leave_one_model_out(got)[0]  # pylint: disable=protected-access
  assert text.startswith("Leaving one model out: 'All heads constant: about 8% average "
                         "relative drop.' is contradicted with all models; without m0.3, "
                         "supported (1 cells: 8.00% [")
  assert "without m0.08" not in text  # Its verdict did not change.
  assert report_claims.claims([near[0]], [near[1]], {}, 0.95)[0]["without"] == {}  # One model.


def test_leave_one_model_out_correlation_equals_the_report_without_that_model():
  """Oracle: the report of the other cells alone (each cell's replicates depend on its task
  and condition only, so dropping a model leaves the others' replicates as they were)."""
  good, _ = _claims_suite()
  cells = good + [_cell("m5", 0.95, 0.95 * 0.83)]
  rep = report.analyse(cells, n_boot=N_BOOT)
  corr = rep["correlation"]["raw"]
  assert corr["n"] == 6 and set(corr["without"]) == {e.model for e in cells}
  for e in cells:
    alone = report.analyse([c for c in cells if c is not e], n_boot=N_BOOT)
    want = alone["correlation"]["raw"]
    got = corr["without"][e.model]
    assert (got["n"], got["rho"], got["ci"], got["verdict"]) == (
        want["n"], want["rho"], want["ci"], want["verdict"])
  claim = rep["claims"][2]
  assert claim["without"]["m0"]["verdict"] == {"positive": "supported"}.get(
      corr["without"]["m0"]["verdict"], corr["without"]["m0"]["verdict"])
  text = next(c for c in rep["caveats"] if c.startswith("Leaving one model out"))
  changed = [m for m, w in claim["without"].items() if w["verdict"] != claim["verdict"]]
  assert all(f"without {m}, " in text for m in changed)
  assert changed or text == "Leaving one model out, no claim's verdict changes."


def _cells_over_tasks(sizes, n_boot=300, seed=5):
  """Informative cells with all-heads drops on tasks of `sizes` models each: baselines and
  drops per replicate drawn at random (a drop rising with the baseline, plus noise)."""
  rng = np.random.default_rng(seed)
  results, reps = [], []
  for t, n in enumerate(sizes):
    for m in range(n):
      x = 0.5 + 0.1 * m + rng.normal(0, 0.03, n_boot)
      y = 0.02 * m + 0.01 * t + rng.normal(0, 0.02, n_boot)
      results.append(dict(model=f"m{m}", task=f"t{t}", check=dict(informative=True),
                          baseline=dict(mean=float(x.mean())),
                          summary=[dict(variant="raw", half=None,
                                        all=dict(relative_drop=float(y.mean()),
                                                 static_heads=4))]))
      reps.append(dict(drops={("raw", 4): y}, baseline=x))
  return results, reps


def test_claim_interval_over_cells_equals_a_two_level_bootstrap_loop():
  """Over cells: replicate b draws the cells with replacement (rng([seed, 2]), one (B, C)
  draw), then takes each drawn cell's b-th replicate of examples and seeds; the mean of
  those, and its percentile interval."""
  from papa_jax.report import claims as report_claims  # pylint: disable=import-outside-toplevel
  results, reps = _cells_over_tasks([4, 3])
  got = report_claims.claims(results, reps, {}, 0.95, seed=11)[0]
  y = np.stack([d["drops"][("raw", 4)] for d in reps], 1)  # [B, C]
  n_boot, c = y.shape
  draw = np.random.default_rng([11, 2]).integers(0, c, size=(n_boot, c))
  means = [np.mean([y[b, j] for j in draw[b]]) for b in range(n_boot)]
  assert got["general"]["ci"] == pytest.approx(np.percentile(means, [2.5, 97.5]), abs=1e-12)
  assert got["ci"] == pytest.approx(np.percentile(y.mean(1), [2.5, 97.5]), abs=1e-12)
  glo, ghi = got["general"]["ci"]
  assert glo < got["ci"][0] and ghi > got["ci"][1]  # Cells differ: wider over cells.
  assert got["general"]["verdict"] == report_claims.verdict("about", 0.08, got["general"]["ci"])


def test_within_task_correlation_equals_scipy_per_task_pooled_by_pairs():
  """Per task scipy's Spearman; pooled, the mean weighted by pairs; given the cells, per
  replicate; over tasks, tasks drawn with replacement (rng([seed, 3])) and their b-th
  replicates pooled with their weights; a task of 2 models is left out."""
  import scipy.stats  # pylint: disable=import-outside-toplevel
  from papa_jax.report import claims as report_claims  # pylint: disable=import-outside-toplevel
  results, reps = _cells_over_tasks([4, 3, 2, 5])
  got = report_claims.claims(results, reps, {}, 0.95, seed=3)[2]
  tasks = {}
  for r, d in zip(results, reps):
    tasks.setdefault(r["task"], []).append((r["baseline"]["mean"], r["summary"][0]["all"][
        "relative_drop"], d["baseline"], d["drops"][("raw", 4)]))
  used = {t: v for t, v in tasks.items() if len(v) >= 3}
  assert got["small_tasks"] == {"t2": ["m0/t2", "m1/t2"]}
  w = np.array([len(v) for v in used.values()], float)
  rho = [scipy.stats.spearmanr([p[0] for p in v], [p[1] for p in v])[0] for v in used.values()]
  n_boot = len(reps[0]["baseline"])
  per = np.array([[scipy.stats.spearmanr([p[2][b] for p in v], [p[3][b] for p in v])[0]
                   for v in used.values()] for b in range(n_boot)])  # [B, T]
  assert [t["rho"] for t in got["per_task"]] == pytest.approx(rho, abs=1e-12)
  for t, col in zip(got["per_task"], per.T):
    assert t["ci"] == pytest.approx(np.percentile(col, [2.5, 97.5]), abs=1e-12)
  assert got["estimate"] == pytest.approx(np.dot(w, rho) / w.sum(), abs=1e-12)
  assert got["ci"] == pytest.approx(np.percentile(per @ w / w.sum(), [2.5, 97.5]), abs=1e-12)
  draw = np.random.default_rng([3, 3]).integers(0, len(w), size=(n_boot, len(w)))
  over = [sum(per[b, j] * w[j] for j in draw[b]) / sum(w[j] for j in draw[b])
          for b in range(n_boot)]
  assert got["general"]["ci"] == pytest.approx(np.percentile(over, [2.5, 97.5]), abs=1e-12)
  assert got["n"] == 12 and got["n_tasks"] == 3 and got["general"]["resampled"] == "tasks"
  assert got["verdict"] == "supported"  # The drop rises with the baseline in every task.
  assert set(got["without"]) == {"m0", "m1", "m2", "m3", "m4"}


def test_no_number_prints_as_negative_zero():
  """A bound of -0.00001 is "0.00%", not "-0.00%" (which reads as a sign without a value)."""
  from papa_jax import results  # pylint: disable=import-outside-toplevel
  from papa_jax.report.markdown import number  # pylint: disable=import-outside-toplevel
  assert [number(-1e-7, True), number(-1e-9), number(-0.012, True), number(-0.5)] == [
      "0.00%", "0.0000", "-1.20%", "-0.5000"]
  assert results._fmt(-1e-5, pct=True) == "0.0%"  # pylint: disable=protected-access


def test_a_task_free_fit_is_no_lower_bound_in_the_claims_or_the_controls(tmp_path):
  """The optimal variant's claim ("the lower bound") reads only cells whose constants were
  fitted to the task (`optimal.objective=task`); a task-free fit is named and left out, and
  the experiment keeps its objective."""
  cells = []
  for model, objective in (("fit_task", "task"), ("fit_free", "hidden")):
    e = _cell(model, 0.8, 0.7)
    e.predictions[("optimal", 4)] = {0: _acc(0.75, 7), 1: _acc(0.74, 60)}
    cells.append(dataclasses.replace(e, optimal_objective=objective))
  rep = report.analyse(cells, n_boot=N_BOOT)
  (lower,) = [c for c in rep["claims"] if c["key"] == "all_optimal"]
  assert lower["cells"] == ["fit_task/sst2"] and lower["n"] == 1
  assert lower["left_out"] == ["fit_free/sst2 (optimal.objective=hidden: a task-free fit, not "
                               "the loss-optimal constant for this task, so no lower bound)"]
  raw = next(c for c in rep["claims"] if c["key"] == "all")
  assert raw["n"] == 2
  assert [r["optimal_objective"] for r in rep["experiments"]] == ["task", "hidden"]
