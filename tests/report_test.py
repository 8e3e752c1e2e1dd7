"""The PAPA report on two hand-built experiments with known scores."""

import csv
import json
import math
import os

import numpy as np
import pytest

from papa_jax import uncertainty
from papa_jax.report import build as report
from papa_jax.data.tasks import get_task

pytestmark = pytest.mark.unit

MAIN = "Baseline, all heads"
SST2_LABELS = np.array([0, 1] * 5)
# NER: B-PER I-PER | B-LOC, B-ORG | none | B-MISC I-MISC I-MISC, B-PER (5 entities).
NER_LABELS = np.array([[1, 2, 0, -100, -100], [5, 0, 3, -100, -100], [0, 0, 0, 0, -100],
                       [7, 8, 8, 0, 1]])


def _flip(wrong):
  """SST-2 predictions wrong exactly at the indices `wrong`."""
  p = SST2_LABELS.copy()
  p[list(wrong)] = 1 - p[list(wrong)]
  return p


def _ner(drop_org=False, all_o=False):
  p = NER_LABELS.copy()
  if drop_org:
    p[1, 2] = 0  # One missed entity: P = 1, R = 4/5, F1 = 8/9.
  if all_o:
    p[p > 0] = 0  # No entity predicted: F1 = 0.
  return p


def experiments():
  """Model "tiny" on SST-2 (accuracy) and NER (entity F1), 4 heads (2 x 2)."""
  sst2 = report.Experiment(
      model="tiny", task=get_task("sst2"), total_heads=4, labels=SST2_LABELS,
      predictions={("raw", 0): {0: _flip([]), 1: _flip([0, 3])},          # 1.0, 0.8
                   ("raw", 2): {0: _flip([1]), 1: _flip([6])},            # 0.9, 0.9
                   ("raw", 4): {0: _flip([0, 2, 4, 7]), 1: _flip([5, 9])},  # 0.6, 0.8
                   ("effective", 4): {0: _flip([1, 2, 3])}},              # 0.7, one seed
      scores={("raw", 0): {0: 1.0, 1: 0.8}},
      means=np.full((2, 2, 4, 4), 0.25, np.float32), gates=np.array([[0.3, -1.0], [2.0, 0.1]]),
      train_examples=100, eval_examples=10, seeds=(0, 1))
  ner = report.Experiment(
      model="tiny", task=get_task("ner"), total_heads=4, labels=NER_LABELS,
      predictions={("raw", 0): {0: _ner(), 1: _ner(drop_org=True)},          # 1, 8/9
                   ("raw", 4): {0: _ner(all_o=True), 1: _ner(drop_org=True)}},  # 0, 8/9
      scores={("raw", 3): {0: 0.5, 1: 0.6}},  # Logged only: no interval.
      ranking=[[1, 1], [0, 0], [0, 1], [1, 0]], train_examples=50, seeds=(0, 1))
  return [sst2, ner]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("report"))
  paths = report.write_report(experiments(), out, n_boot=200, seed=0)
  with open(paths["json"]) as f:
    js = json.load(f)
  with open(paths["md"]) as f:
    md = f.read()
  return paths, js, md


def _row(md, section, *cells):
  """The row starting with `cells` of the table under the heading `## section...`."""
  part = md.split("\n## " + section, 1)[1].split("\n## ", 1)[0]
  start = "| " + " | ".join(cells) + " |"
  rows = [line for line in part.splitlines() if line.startswith(start)]
  assert len(rows) == 1, (start, rows)
  return [c.strip() for c in rows[0].strip("|").split("|")]


def test_json_table_values(written):
  _, js, _ = written
  sst2, ner = js["experiments"]
  assert sst2["baseline"]["mean"] == pytest.approx(0.9, abs=1e-15)
  assert sst2["baseline"]["std"] == pytest.approx(np.std([1.0, 0.8], ddof=1), abs=1e-15)
  raw, eff = sst2["summary"]
  assert (raw["variant"], eff["variant"]) == ("raw", "effective")
  assert raw["all"]["mean"] == pytest.approx(0.7) and raw["half"]["mean"] == pytest.approx(0.9)
  assert raw["all"]["relative_drop"] == pytest.approx(2 / 9, abs=1e-15)
  assert raw["half"]["relative_drop"] == pytest.approx(0.0, abs=1e-15)
  assert raw["half"]["std"] == 0.0 and raw["half"]["within_noise"]
  assert eff["all"]["mean"] == pytest.approx(0.7) and eff["all"]["std"] is None
  assert eff["all"]["n"] == 1 and eff["half"] is None
  assert ner["baseline"]["mean"] == pytest.approx(17 / 18, abs=1e-15)
  (ner_raw,) = ner["summary"]
  assert ner_raw["all"]["mean"] == pytest.approx(4 / 9, abs=1e-15)
  assert ner_raw["all"]["relative_drop"] == pytest.approx(9 / 17, abs=1e-15)
  assert ner_raw["half"] is None
  assert js["settings"]["n_boot"] == 200 and js["settings"]["method"] == "percentile"
  assert sst2["n_examples"] == 10 and ner["n_examples"] == 4 and sst2["train_examples"] == 100


def test_intervals_are_the_paired_bootstrap(written):
  """Seeds paired by default (the conditions ran the same seeds: one seed stream); with
  seed_pairing="independent", each condition its own stream."""
  _, js, _ = written
  sst2 = js["experiments"][0]
  exp = experiments()[0]
  assert js["settings"]["seed_pairing"] == "paired"
  want = lambda streams: uncertainty.paired_bootstrap(
      exp.task, exp.labels, exp.predictions[("raw", 0)], exp.predictions[("raw", 4)], n_boot=200,
      seed=uncertainty.task_seed(0, "sst2"), streams=streams)
  paired, apart = want((0, 0)), want((0, report.condition_stream("raw", 4)))
  assert paired["relative_drop_ci"] != apart["relative_drop_ci"]
  assert tuple(sst2["summary"][0]["all"]["relative_drop_ci"]) == paired["relative_drop_ci"]
  assert sst2["summary"][0]["all"]["within_noise"] == paired["within_noise"]
  assert sst2["summary"][0]["all"]["seeds_paired"] is True
  other = report.analyse([exp], n_boot=200, seed_pairing="independent")
  assert tuple(other["experiments"][0]["summary"][0]["all"]["relative_drop_ci"]) == apart[
      "relative_drop_ci"]


def test_markdown_rows(written):
  _, _, md = written
  raw = _row(md, MAIN, "tiny", "sst2", "raw")
  assert raw[3] == "0.9000 ± 0.1414" and raw[4] == "0.7000 ± 0.1414"
  assert raw[5].startswith("22.22% [") and raw[7] == "0.9000 ± 0.0000"
  assert raw[8].startswith("0.00% [") and raw[8].endswith("(within noise)")
  assert raw[9] == "1.000 (within noise)"  # Holm: a drop of exactly 0.
  eff = _row(md, MAIN, "tiny", "sst2", "effective")
  assert eff[4] == "0.7000 ± –" and eff[7:] == ["–"] * 3  # One seed; no half run.
  ner = _row(md, MAIN, "tiny", "ner", "raw")
  assert ner[3] == "0.9444 ± 0.0786" and ner[4] == "0.4444 ± 0.6285"
  assert ner[5].startswith("52.94% [") and ner[7:] == ["–"] * 3
  assert "| model | task | constant attention | 0 | 1/2 | 7/8 | 1 |" in md
  sched = _row(md, "Score at each", "tiny", "ner", "raw")
  assert sched[3:] == ["0.9444 ± 0.0786", "–", "0.5500 ± 0.0707", "0.4444 ± 0.6285"]
  avg = _row(md, "Average", "tiny", "raw", "all")
  assert avg[3] == "2" and avg[4].startswith(f"{100 * (2 / 9 + 9 / 17) / 2:.2f}% [")
  for text in ("B = 200", "percentile 95%", "paired bootstrap", "8% average relative drop",
               "What these numbers do not show", "| raw | 2 | – | not tested: n = 2 < 5 pairs |",
               "| tiny | ner | f1 | 4 | 50 | 0, 1 | B-PER: 0.1000 | +0.8444 [",
               "| tiny | sst2 | accuracy | 10 | 100 | 0, 1 | negative: 0.5000 | +0.4000 [",
               "report.md prints 13 95% intervals: 4 relative drops (main table), 3 per-model "
               "averages, 4 intervals of the paper's claims (two each), 0 per-task "
               "correlations, 2 baseline − constant differences", "one family of 5 tests",
               "As few as 2 seeds", "Some conditions have one seed", "held fixed"):
    assert text in md, text


def test_csv_rows(written):
  paths, _, _ = written
  with open(paths["csv"]) as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 7  # SST-2: 0, 2, 4 raw + 4 effective; NER: 0, 3, 4.
  key = lambda r: (r["task"], r["variant"], r["static_heads"])
  row = next(r for r in rows if key(r) == ("sst2", "raw", "4"))
  assert float(row["relative_drop"]) == pytest.approx(2 / 9) and row["n_seeds"] == "2"
  assert float(row["relative_drop_ci_lo"]) <= float(row["relative_drop_ci_hi"])
  logged = next(r for r in rows if r["static_heads"] == "3")
  assert logged["source"] == "logged" and logged["relative_drop_ci_lo"] == ""
  one = next(r for r in rows if r["variant"] == "effective")
  assert one["std"] == "" and one["n_seeds"] == "1"


def test_figures_are_valid_pngs(written):
  import matplotlib.image  # pylint: disable=import-outside-toplevel
  paths, _, md = written
  pngs = [p for p in paths.values() if p.endswith(".png")]
  assert {"curves", "scatter", "means/tiny/sst2", "gates/tiny/sst2", "gates/tiny/ner"} <= set(paths)
  assert len(pngs) == 5
  for p in pngs:
    with open(p, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(p).ndim == 3 and os.path.getsize(p) < 5 << 20
    assert f"]({os.path.basename(p)})" in md


def test_gate_map_marks_first_fraction():
  from papa_jax.report import figures as report_figures  # pylint: disable=import-outside-toplevel
  got = report_figures.constant_from([[1, 1], [0, 0], [0, 1], [1, 0]], [2, 3, 4], 2, 2)
  np.testing.assert_array_equal(got, [[2, 3], [4, 2]])


def test_partial_experiments_render_dashes(tmp_path):
  sst2, ner = experiments()
  only_base = report.Experiment(model="base-only", task=sst2.task, total_heads=4,
                                labels=sst2.labels,
                                predictions={("raw", 0): sst2.predictions[("raw", 0)]})
  no_base = report.Experiment(model="no-base", task=ner.task, total_heads=4, labels=ner.labels,
                              predictions={("raw", 4): ner.predictions[("raw", 4)]})
  scores_only = report.Experiment(model="logged", task=sst2.task, total_heads=4,
                                  scores={("raw", 0): {0: 0.9}, ("raw", 4): {0: 0.8}})
  zero = report.Experiment(model="mcc-zero", task=get_task("cola"), total_heads=4,
                           labels=SST2_LABELS,
                           predictions={("raw", 0): {0: np.zeros(10, int)},  # MCC 0.
                                        ("raw", 4): {0: SST2_LABELS}})
  paths = report.write_report([only_base, no_base, scores_only, zero], str(tmp_path), n_boot=50)
  with open(paths["md"]) as f:
    md = f.read()
  base = _row(md, MAIN, "base-only", "sst2", "raw")
  assert base[3:] == ["0.9000 ± 0.1414"] + ["–"] * 6
  assert _row(md, MAIN, "no-base", "ner", "raw")[3:5] == ["–", "0.4444 ± 0.6285"]
  logged = _row(md, MAIN, "logged", "sst2", "raw")
  assert logged[3:7] == ["0.9000 ± –", "0.8000 ± –", "11.11%", "not checked"]  # No interval.
  zero = _row(md, MAIN, "mcc-zero", "cola", "raw")
  assert zero[5:7] == ["undefined (baseline <= 0)", "uninformative"]
  assert "Not run" in md and "No predictions, so no interval" in md
  assert "Relative drop undefined (baseline <= 0, on the dev set or in some resamples; never " \
      "counted as within noise) for: mcc-zero/cola." in md


def test_logged_scores_that_disagree_are_flagged(tmp_path):
  sst2 = experiments()[0]
  sst2.scores = {("raw", 0): {0: 1.0, 1: 0.75}}
  got = report.analyse([sst2], n_boot=20)
  assert len(got["warnings"]) == 1 and "seeds [1]" in got["warnings"][0]
  with pytest.raises(ValueError, match="Duplicate"):
    report.analyse([sst2, sst2], n_boot=20)


def test_json_has_no_nan(written):
  paths, _, _ = written
  with open(paths["json"]) as f:
    text = f.read()
  assert "NaN" not in text and "Infinity" not in text
  assert math.isclose(json.loads(text)["model_averages"][0]["mean_relative_drop"],
                      (2 / 9 + 9 / 17) / 2)


def test_results_relative_drop_is_the_reports_and_undefined_for_a_non_positive_baseline():
  """results.md and report.md use one `relative_drop`: NaN (shown as a dash) when the
  baseline is <= 0, e.g. an MCC of 0 for a probe stuck on the majority class."""
  from papa_jax import results
  rows = [dict(model="m", task="cola", variant="raw", static_heads=k, total_heads=4,
               fraction=k / 4, seed=42, metric="matthews_correlation", score=s, best_score=s,
               seconds=1.0) for k, s in ((0, 0.0), (2, 0.1), (4, -0.05))]
  summary = results.summary_rows(rows)[0]
  assert np.isnan(summary["relative_drop"])
  md = results.markdown(rows)
  assert "| matthews_correlation | 0.0000 | -0.0500 | undefined (baseline <= 0) |" in md
  assert "%" not in md.split("\n")[2]  # Never a percentage (100%, -150%) for it.
  rows[0]["score"] = 0.5
  assert results.summary_rows(rows)[0]["relative_drop"] == pytest.approx(
      uncertainty.relative_drop(0.5, -0.05)) == pytest.approx(1.1)


def _controls_experiment():
  """SST-2 on 200 examples, 4 heads: PAPA's order keeps 95% right at 2 heads, random draws
  70% (their draws differ), the entropy order 71%, uniform constants 60%."""
  labels = np.array([0, 1] * 100)

  def acc(frac, shift=0):
    p = labels.copy()
    wrong = (np.arange(200) + shift) % 200 < int(round((1 - frac) * 200))
    p[wrong] = 1 - p[wrong]
    return p
  preds = {("raw", 0): {0: acc(0.96), 1: acc(0.96, 3)}, ("raw", 2): {0: acc(0.95), 1: acc(0.95, 7)},
           ("raw", 4): {0: acc(0.9), 1: acc(0.9, 5)},
           ("raw/random_0", 2): {0: acc(0.72, 11), 1: acc(0.70, 13)},
           ("raw/random_1", 2): {0: acc(0.68, 17), 1: acc(0.70, 19)},
           ("raw/entropy", 2): {0: acc(0.71, 23), 1: acc(0.71, 29)},
           ("uniform", 2): {0: acc(0.6, 31), 1: acc(0.6, 37)},
           ("uniform", 4): {0: acc(0.6, 41), 1: acc(0.6, 43)}}
  order = [[0, 0], [0, 1], [1, 0], [1, 1]]
  return report.Experiment(
      model="tiny", task=get_task("sst2"), total_heads=4, labels=labels, predictions=preds,
      seeds=(0, 1), orderings={"lambda": order, "entropy": order[::-1], "random_0": order,
                               "random_1": order[1:] + order[:1]})


def test_report_controls_say_whether_lambda_beats_random_and_the_mean_beats_uniform(tmp_path):
  from papa_jax.report import controls as report_controls
  exp = _controls_experiment()
  c = report_controls.analyse(exp, rng_seed=uncertainty.task_seed(0, "sst2"), n_boot=300)
  pooled = next(x for x in c["curves"] if (x["ordering"], x["static_heads"]) == ("random", 2))
  assert pooled["n"] == 4 and pooled["mean"] == pytest.approx(0.70)  # 2 draws x 2 seeds.
  assert pooled["draw_std"] == pytest.approx(np.std([0.71, 0.69], ddof=1))
  lam = next(x for x in c["vs_random"] if x["ordering"] == "lambda")
  assert lam["diff"] == pytest.approx(0.95 - 0.70) and lam["ci"][0] > 0.15
  assert lam["verdict"] == "lambda beats random"
  ent = next(x for x in c["vs_random"] if x["ordering"] == "entropy")
  assert ent["diff"] == pytest.approx(0.01) and ent["within_noise"]
  assert [(x["variant"], x["static_heads"], x["verdict"]) for x in c["vs_uniform"]] == [
      ("raw", 2, "raw beats uniform"), ("raw", 4, "raw beats uniform")]
  rho = {(x["a"], x["b"]): x["rho"] for x in c["spearman"]}
  assert rho[("lambda", "entropy")] == pytest.approx(-1.0)
  assert rho[("lambda", "random_0")] == pytest.approx(1.0)
  assert any(s.startswith("lambda vs random: lambda is better at 1,") for s in c["sentences"])
  assert any("entropy vs random" in s and "within noise at 1 of 1" in s for s in c["sentences"])
  paths = report.write_report([exp], str(tmp_path), n_boot=200)
  md = open(paths["md"]).read()
  assert "## Controls: which heads, and which constant" in md and "lambda beats random" in md
  assert os.path.exists(paths["controls/tiny/sst2"])
  assert "raw/entropy" not in md.split("## Controls")[0]  # Other orders stay out of the main tables.
  from papa_jax import significance
  from papa_jax.measures import rank_agreement
  rows = [x for c in report.analyse([exp], n_boot=200)["controls"] for x in c["vs_random"]
          + c["vs_uniform"]]  # A second Holm family: every control comparison.
  assert [x["verdict_adjusted"] for x in rows] == [
      "lambda beats random", "within noise", "raw beats uniform", "raw beats uniform"]
  assert "| entropy | 1/2 | +0.0100 [" in md and significance.format_p(rows[1]["holm_p"], 200) \
      + " (within noise) |" in md
  labels = exp.labels
  exp.predictions[("row_mean", 2)] = {0: np.where(np.arange(200) < 76, 1 - labels, labels)}
  rows = [x for c in report.analyse([exp], n_boot=200)["controls"] for x in c["vs_random"]
          + c["vs_uniform"]]  # row_mean 0.62 vs uniform 0.60: a second p-value above 0.
  assert [x["holm_p"] for x in rows] == rank_agreement.holm([x["p_value"] for x in rows])
  assert sum(x["holm_p"] > x["p_value"] for x in rows) >= 1
  assert all((x["p_value"] >= 0.05) == x["within_noise"] for x in rows)
