"""docs/make_figures.py: the analysis stages' figures that docs/results.md shows."""

import importlib.util
import json
import os
import shutil

import pytest

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script():
  spec = importlib.util.spec_from_file_location(
      "make_figures", os.path.join(ROOT, "docs", "make_figures.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_stage_figures_are_stamped_under_their_docs_names(tmp_path, monkeypatch):
  """A workdir's mixing figures become minilm_sst2_mixing_{layers,heads}.png with the commit
  that drew them (the stage's), model, task and sizes as footer and Source metadata; a
  workdir with none is refused."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  from papa_jax.plotting import pyplot  # pylint: disable=import-outside-toplevel
  make_figures = _script()
  monkeypatch.setattr(make_figures, "commit", lambda: "abc1234")
  wd = tmp_path / "wd"
  (wd / "mixing").mkdir(parents=True)
  (wd / "mixing" / "stats.json").write_text(json.dumps(dict(git_revision="fedcba9876-dirty")))
  (wd / "config.json").write_text(json.dumps(dict(
      model=dict(name="sentence-transformers/all-MiniLM-L6-v2"),
      data=dict(task="sst2", max_train_examples=4000, max_eval_examples=-1, max_length=64))))
  plt = pyplot()
  for name in ("layers.png", "heads.png"):
    fig, ax = plt.subplots(figsize=(2, 1), dpi=50)
    ax.plot([0, 1])
    fig.savefig(wd / "mixing" / name)
    plt.close(fig)
  out = tmp_path / "figs"
  written = make_figures.main(["--stages", str(wd), "--out", str(out)])
  assert sorted(os.path.basename(p) for p in written) == [
      "minilm_sst2_mixing_heads.png", "minilm_sst2_mixing_layers.png"]
  with Image.open(written[0]) as im:
    assert im.info["Source"] == ("papa-jax fedcba9-dirty · minilm · sst2 · 4000 train / -1 dev "
                                 "examples (-1: all), L = 64")
  with pytest.raises(SystemExit):
    make_figures.main(["--stages", str(tmp_path / "figs"), "--out", str(out)])


def test_report_figures_are_stamped_with_the_reports_commit_and_cells(tmp_path, monkeypatch):
  from PIL import Image  # pylint: disable=import-outside-toplevel
  from papa_jax.plotting import pyplot  # pylint: disable=import-outside-toplevel
  make_figures = _script()
  monkeypatch.setattr(make_figures, "commit", lambda: "abc1234")
  folder = tmp_path / "suite" / "report"
  folder.mkdir(parents=True)
  (folder / "report.json").write_text(json.dumps(dict(
      git_revision="0123456789abcdef", settings=dict(n_boot=10000),
      experiments=[dict(model="minilm", task="sst2"), dict(model="mpnet", task="cola")])))
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(2, 1), dpi=50)
  ax.plot([0, 1])
  fig.savefig(folder / "curves.png")
  plt.close(fig)
  written = make_figures.main(["--report", str(tmp_path / "suite"), "--out", str(tmp_path)])
  assert [os.path.basename(p) for p in written] == ["suite_curves.png"]
  with Image.open(written[0]) as im:
    assert im.info["Source"] == ("papa-jax 0123456 · report over 2 experiment(s): minilm/sst2, "
                                 "mpnet/cola · B = 10000")
  # A controls run's report (one experiment) also draws curves.png: not the suite's figure.
  one = tmp_path / "controls" / "report"
  one.mkdir(parents=True)
  (one / "report.json").write_text(json.dumps(dict(
      git_revision="0123456789abcdef", settings=dict(n_boot=10000),
      experiments=[dict(model="minilm", task="sst2")])))
  shutil.copy(folder / "curves.png", one / "curves.png")
  with pytest.raises(SystemExit):  # "holds none of the report figures the docs show"
    make_figures.main(["--report", str(tmp_path / "controls"), "--out", str(tmp_path / "o")])
  assert not os.path.exists(tmp_path / "o" / "suite_curves.png")
