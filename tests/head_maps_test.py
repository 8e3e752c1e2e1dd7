"""The per-head record: one writer, one reader, one agreement table (papa_jax/head_maps.py)."""

import json

import numpy as np
import pytest
import scipy.stats

from papa_jax import head_maps, reader
from papa_jax.measures import rank_agreement
from papa_jax.report import heads as report_heads
from papa_jax.report import markdown as report_markdown
from papa_jax.workdir import rules as workdir
from papa_jax.workdir.layout import Layout

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _no_git(monkeypatch):
  """Provenance asks git for the revision (a subprocess, not for the unit tier)."""
  monkeypatch.setattr(workdir, "git_revision", lambda: "test")

RNG = np.random.default_rng(0)
INFOS = dict(js=head_maps.HeadInfo("JS divergence", unit="nats"),
             mass=head_maps.HeadInfo("mass on"),
             drop=head_maps.HeadInfo("score drop", head_maps.MORE, "accuracy"))


def _maps():
  arrays = {"js/all": RNG.random((3, 4)), "mass/all": RNG.random((3, 4, 2)),
            "js/long": RNG.random((3, 4)), "mass/long": RNG.random((3, 4, 2))}
  return head_maps.maps_of("stage_a", INFOS, arrays, examples={"all": 9, "long": 4},
                           split="validation", columns=("cls", "sep"))


def test_head_maps_write_then_read_gives_the_same_records(tmp_path):
  layout = Layout(str(tmp_path))
  maps = _maps()
  head_maps.write(layout, "stage_a", maps, {"split": "validation"}, categories=["cls", "sep"])
  st = json.load(open(layout.stats("stage_a")))
  assert st["js/long"] == maps[2].values.tolist()  # Flat keys, as before the record.
  got = head_maps.read("stage_a", st)
  assert [m.key for m in got] == ["stage_a/js/all", "stage_a/mass/all", "stage_a/js/long",
                                  "stage_a/mass/long"]
  for g, w in zip(got, maps):
    np.testing.assert_array_equal(g.values, w.values)
    assert (g.label, g.subset, g.columns, g.examples, g.split, g.unit, g.higher) == (
        w.label, w.subset, w.columns, w.examples, w.split, w.unit, w.higher)
  assert got[0].title == "JS divergence (all examples)" and got[0].examples == 9
  assert [p.name for p in got[1].planes()] == ["mass_cls", "mass_sep"]
  np.testing.assert_array_equal(got[1].planes()[1].values, maps[1].values[..., 1])


def test_token_maps_write_then_read_gives_the_same_records(tmp_path):
  """A per-position record (per example: word pieces and [rows, tokens] values) goes through
  stats.json to the reader, values to 6 significant digits; a stage may write it alone; a
  shape that does not match its rows and tokens is refused."""
  layout = Layout(str(tmp_path))
  examples = tuple(dict(title=f"pair {i}", tokens=["[CLS]"] + ["x"] * i + ["[SEP]"],
                        values=RNG.normal(size=(3, i + 2))) for i in range(3))
  tm = head_maps.TokenMap("stage_b", "exact_residual_in", "exact change",
                          ("layer 0", "layer 1", "layer 2"), examples, "nats")
  head_maps.write(layout, "stage_b", [], {"pairs": 3}, token_maps=[tm])
  head_maps.write(layout, "stage_a", _maps(), {"split": "validation"})
  json.dump({}, open(tmp_path / "config.json", "w"))
  wd = reader.read_workdir(str(tmp_path), with_means=False)
  assert wd.head_maps and all(m.stage == "stage_a" for m in wd.head_maps)
  (got,) = wd.token_maps
  assert (got.key, got.label, got.rows, got.unit, got.signed) == (
      "stage_b/exact_residual_in", "exact change", tm.rows, "nats", True)
  for g, w in zip(got.examples, examples):
    assert g["title"] == w["title"] and g["tokens"] == w["tokens"]
    np.testing.assert_allclose(g["values"], w["values"], rtol=1e-5)
  with pytest.raises(ValueError, match=r"example 0 has values of shape \(3, 2\) for 2 rows "
                                       "and 2 tokens"):
    head_maps.TokenMap("s", "n", "l", ("a", "b"), examples[:1])


def test_head_maps_csv_has_a_row_per_subset_and_head(tmp_path):
  layout = Layout(str(tmp_path))
  m = head_maps.maps_of("s", {}, {"a/x": np.array([[1.0, 2.0]]), "b/x": np.array(
      [[[3.0, 4.0], [5.0, 6.0]]]), "a/y": np.array([[7.0, 8.0]]),
                                   "b/y": np.zeros((1, 2, 2))}, columns=("p", "q"))
  head_maps.write(layout, "s", m, {})
  assert open(layout.stats_csv("s")).read().splitlines() == [
      "subset,layer,head,a,b_p,b_q", "x,0,0,1,3,4", "x,0,1,2,5,6", "y,0,0,7,0,0",
      "y,0,1,8,0,0"]
  head_maps.write(layout, "t", head_maps.maps_of("t", {}, {"a": np.array([[0.5, 0.25]])}), {})
  assert open(layout.stats_csv("t")).read().splitlines() == ["layer,head,a", "0,0,0.5",
                                                             "0,1,0.25"]


def test_head_maps_read_a_stats_file_written_before_the_record():
  """An effective stats.json of an older workdir: its arrays by key, counts per subset."""
  st = {"summary": {"split": "validation"}, "categories": ["cls", "sep"],
        "count/all": 5.0, "count/long": 2.0, "js/all": [[0.1, 0.2]],
        "mass_raw/all": [[[0.5, 0.5], [0.2, 0.8]]], "git_revision": "abc"}
  got = head_maps.read("effective", st)
  assert [(m.name, m.subset, m.columns, m.examples, m.split) for m in got] == [
      ("js", "all", (), 5, "validation"), ("mass_raw", "all", ("cls", "sep"), 5, "validation")]


def test_head_maps_agreement_is_one_table_with_holm_over_it():
  base = RNG.random((4, 6))
  a = head_maps.HeadMap("x", "a", base + 0.1 * RNG.random((4, 6)))
  b = head_maps.HeadMap("x", "b", RNG.random((4, 6)))
  gate = head_maps.HeadMap("sort", "lambda", base, higher=head_maps.MORE)
  drop = head_maps.HeadMap("ablation", "change", -base, higher=head_maps.LESS)
  cols = head_maps.HeadMap("x", "c", RNG.random((4, 6, 2)), columns=("p", "q"))
  rows = head_maps.workdir_agreement([a, b, cols, gate, drop], n_perm=500)
  pairs = [(r["measure"], r["score"]) for r in rows]
  # Every map against every score, a pair once, no self-pairs, no map with columns.
  assert pairs == [("x/a", "sort/lambda"), ("x/a", "ablation/change"), ("x/b", "sort/lambda"),
                   ("x/b", "ablation/change"), ("sort/lambda", "ablation/change")]
  want = scipy.stats.spearmanr(a.values.ravel(), base.ravel()).statistic
  assert rows[0]["rho"] == pytest.approx(want) and rows[1]["rho"] == pytest.approx(-want)
  assert rows[4]["rho"] == pytest.approx(-1.0) and rows[4]["score_higher"] == head_maps.LESS
  one = rank_agreement.head_rank_agreement(a.values, base, n_perm=500)
  assert rows[0]["p_within_layers"] == one["p_within_layers"]
  assert [r["p_holm"] for r in rows] == rank_agreement.holm(
      [r["p_within_layers"] for r in rows])


def test_head_maps_reader_adds_the_gates_and_scored_orderings(tmp_path):
  layout = Layout(str(tmp_path))
  gates = RNG.random((3, 4))
  wd = reader.FinishedWorkdir(layout, {}, lambdas=gates, orderings={
      "entropy": {"direction": "descending", "scores": RNG.random((3, 4)).tolist()},
      "gradient": {"direction": "ascending", "scores": RNG.random((3, 4)).tolist()},
      "random_0": {"direction": "random", "scores": None}},
      stats={"stage_a": {"summary": {}, "js": [[0.0] * 4] * 3}})
  got = {m.key: m for m in wd.head_maps}
  assert list(got) == ["stage_a/js", "sort/lambda", "orderings/entropy", "orderings/gradient"]
  np.testing.assert_array_equal(got["sort/lambda"].values, gates)
  # Entropy ranks high-entropy heads constant first: higher = less important.
  assert [got[k].higher for k in ("stage_a/js", "sort/lambda", "orderings/entropy",
                                  "orderings/gradient")] == ["", head_maps.MORE, head_maps.LESS,
                                                             head_maps.MORE]


def test_head_maps_report_section_lists_every_map_and_the_agreement():
  maps = _maps() + [head_maps.HeadMap("sort", "lambda", RNG.random((3, 4)),
                                      "PAPA gate", higher=head_maps.MORE)]
  section = report_heads.analyse("MiniLM", "sst2", maps)
  text = "\n".join(report_markdown.per_head_lines([section]))
  for m in maps:
    assert f"`{m.key}`: {m.title}" in text
  assert "| `stage_a/js/all` | `sort/lambda` (higher = more important) |" in text
  assert report_markdown.per_head_lines([report_heads.analyse("m", "t", [])]) == []
