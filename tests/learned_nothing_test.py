"""A real run whose probes learned nothing says so in every output.

SPLADE-tiny on 48 SST-2 sentences (32 dev), one sorting epoch and two probe epochs: every
probe predicts one class (0.5000, the best constant prediction), and so does the sorting
probe, whose ranking then picks the half of the heads made constant.
"""

import json
import logging
import os

import pytest

from papa_jax import reader, run, suite
from papa_jax.explorer import page
from tests.testing import require_model, tiny_config

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def chance_run(tmp_path_factory):
  require_model("splade_tiny")
  tmp = tmp_path_factory.mktemp("chance")
  wd = str(tmp / "wd")
  logger = logging.getLogger("absl")
  records = []
  handler = logging.Handler(logging.WARNING)
  handler.emit = records.append
  logger.addHandler(handler)
  try:
    run.run(tiny_config(tmp, **{"model.name": "splade_tiny"}), wd)
  finally:
    logger.removeHandler(handler)
  return tmp, wd, [r.getMessage() for r in records]


def test_results_and_log_say_the_baseline_and_the_sorting_run_learned_nothing(chance_run):
  _, wd, log = chance_run
  res = json.load(open(os.path.join(wd, "results.json"), encoding="utf-8"))
  base = [r for r in res["rows"] if r["static_heads"] == 0]
  assert {r["score"] for r in base} == {res["check"]["constant_score"]} == {0.5}
  assert res["check"]["informative"] is False
  assert res["ranking_check"]["informative"] is False
  sort = json.load(open(os.path.join(wd, "sort", "history.json"), encoding="utf-8"))
  assert sort["check"] == res["ranking_check"]
  md = open(os.path.join(wd, "results.md"), encoding="utf-8").read()
  assert md.count("**Uninformative.**") == 2
  assert sum("The baseline probe learned nothing" in m for m in log) == 1
  assert sum(m.startswith("sort: The sorting run learned nothing") for m in log) == 1


def test_explorer_and_per_head_maps_carry_the_warning(chance_run):
  _, wd, _ = chance_run
  data = page.payload(wd, examples=(), max_examples=0)
  warns = data["meta"]["warnings"]
  assert any(w.startswith("The baseline probe learned nothing") for w in warns)
  assert any(w.startswith("The sorting run learned nothing") for w in warns)
  gates = [m for m in data["heads"]["maps"] if m["key"] == "sort/lambda"]
  assert gates[0]["note"].startswith("the sorting run learned nothing")
  assert "learned nothing" in [m for m in reader.read_workdir(wd).head_maps
                               if m.key == "sort/lambda"][0].title


def test_report_marks_the_cell_uninformative_and_warns_about_its_ranking(chance_run):
  tmp, wd, _ = chance_run
  out = str(tmp / "report")
  suite.report_from_workdirs([wd], out, n_boot=200)
  rep = json.load(open(os.path.join(out, "report.json"), encoding="utf-8"))
  cell = rep["experiments"][0]
  assert cell["check"]["informative"] is False
  assert cell["ranking_check"]["informative"] is False
  assert any("the sorting run learned nothing" in w for w in rep["warnings"])
  md = open(os.path.join(out, "report.md"), encoding="utf-8").read()
  assert "uninformative" in md and "the sorting run learned nothing" in md
