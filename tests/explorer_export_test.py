"""The explorer's figure files (`explore.figures`, papa_jax/explorer/export.py), no browser.

A tiny synthetic workdir (2 layers x 3 heads, L=8; random means, a ranking, results rows)
through `page.payload`, with one stored example and two per-head maps added as the page's
collector writes them. The page's own SVG/PNG buttons are tested in explorer_test.py.
"""

import json
import logging
import os
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from configs import base
from papa_jax import explorer
from papa_jax.errors import ConfigError
from papa_jax.explorer import ExplorerConfig, export, pack, payload
from papa_jax.workdir.layout import Layout
from papa_jax.papa import means as means_lib
from papa_jax.papa import schedule
from papa_jax.plotting import pyplot

pytestmark = pytest.mark.unit

LAYERS, HEADS, L = 2, 3, 8


def tiny_workdir(wd: str) -> None:
  """Random means and gates, and two probe rows (with a std and a band)."""
  rng = np.random.default_rng(0)
  os.makedirs(os.path.join(wd, "means"))
  logits = rng.normal(size=(LAYERS, HEADS, L, L))
  avgs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  meta = dict(format=means_lib.FORMAT, model="tiny", task="sst2", split="train", max_length=L,
              num_examples=10, attention="raw", papa_layout=True)
  np.savez(os.path.join(wd, "means", "means_raw.npz"), avgs=avgs.astype(np.float32), sums=avgs,
           counts=np.ones((L, L)), metadata=np.asarray(json.dumps(meta)))
  schedule.save_ranking(Layout(wd), rng.normal(size=(LAYERS, HEADS)))
  rows = [dict(variant="raw", static_heads=k, total_heads=6, fraction=k / 6, metric="accuracy",
               score=0.9 - 0.1 * k / 6, score_std=0.01, band_low=0.85, band_high=0.92)
          for k in (0, 3, 6)]
  with open(os.path.join(wd, "results.json"), "w") as f:
    json.dump(dict(rows=rows), f)
  with open(os.path.join(wd, "config.json"), "w") as f:
    json.dump(dict(model=dict(name="sentence-transformers/all-MiniLM-L6-v2"),
                   data=dict(task="sst2", max_length=L), papa=dict(fractions=[0.0, 0.5, 1.0])), f)


def tiny_payload(wd: str) -> dict:
  """The page's payload, plus one example (n=5 <= the head dimension: its effective attention
  is its input-dependent one, stored once) and two per-head maps."""
  tiny_workdir(wd)
  data = payload(wd, examples=(), max_examples=0)
  rng = np.random.default_rng(1)
  pos = [0, 1, 2, 3, L - 1]
  dyn = rng.dirichlet(np.ones(5), size=(LAYERS, HEADS, 5))
  data["examples"] = [dict(index=4, positions=pos, tokens=["[CLS]", "a", "fine", "film", "[SEP]"],
                           text="a fine film", label=1, effective=None, mixing={},
                           dynamic=pack.packed_matrices(dyn, signed=False))]
  maps = [dict(key="effective/js/all", stage="effective", name="js", label="JS divergence",
               subset="all", higher="more input-dependent", unit="nats", examples=16,
               split="validation", values=rng.random((LAYERS, HEADS)).tolist()),
          dict(key="mixing/norm_mass", stage="mixing", name="norm_mass", label="norm mass",
               subset=None, higher=None, unit="", examples=None, split=None,
               values=[[0.5, None, 0.2], [0.1, 0.3, 0.9]])]
  data["heads"] = dict(maps=maps, agreement=[])
  data["tokens"] = [dict(key="patching/exact_residual_in", stage="patching",
                         name="exact_residual_in", label="exact change", unit="nats",
                         signed=True, note="", rows=["layer 0", "layer 1"],
                         examples=[dict(title="pair 0 (good swapped): a good film",
                                        tokens=["[CLS]", "a", "good→bad", "film", "[SEP]"],
                                        values=rng.normal(size=(2, 5)).tolist())])]
  return data


EXPECTED = ["constant_raw", "papa_curve", "ranking", "example4_layer0_head0_dynamic",
            "example4_layer0_head0_constant", "example4_layer0_head0_effective",
            "heads_effective-js-all", "heads_mixing-norm-mass",
            "positions_patching-exact-residual-in_example0"]


def _refuse_subprocess(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError(f"the figure export started a subprocess: {args[1:2]}")
  monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)


def test_figures_are_written_beside_the_page(tmp_path, monkeypatch, caplog):
  data = tiny_payload(str(tmp_path / "wd"))
  _refuse_subprocess(monkeypatch)
  page = str(tmp_path / "out" / "page.html")
  with caplog.at_level(logging.INFO):
    paths = export.write_figures(data, page, ("svg", "png"))
  folder = str(tmp_path / "out" / "page_figures")
  assert export.figures_dir(page) == folder
  assert sorted(paths) == sorted(os.path.join(folder, f"{n}.{f}") for n in EXPECTED
                                 for f in ("svg", "png"))
  assert sorted(os.listdir(folder)) == sorted(os.path.basename(p) for p in paths)
  assert f"wrote 18 figures (svg, png) to {folder}" in caplog.text
  plt = pyplot()
  for name in EXPECTED:
    root = ET.parse(os.path.join(folder, f"{name}.svg")).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = "".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "minilm" in texts and "sst2" in texts  # Text stays text, titled with the short name.
    with open(os.path.join(folder, f"{name}.png"), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    image = plt.imread(os.path.join(folder, f"{name}.png"))
    assert image.ndim == 3 and min(image.shape[:2]) > 200 and image.std() > 0


def test_figure_axes_have_integer_layers_and_heads_and_equal_panels_one_scale(tmp_path,
                                                                               monkeypatch):
  data = tiny_payload(str(tmp_path / "wd"))
  _refuse_subprocess(monkeypatch)
  plt = pyplot()
  names, norms = [], {}
  for name, fig in export.panel_figures(data):
    names.append(name)
    fig.canvas.draw()  # Tick labels are set at drawing.
    for ax in fig.axes:
      for label, axis in ((ax.get_xlabel(), ax.xaxis), (ax.get_ylabel(), ax.yaxis)):
        if label not in ("layer", "head"):
          continue
        ticks = [t.get_text() for t in axis.get_ticklabels() if t.get_text()]
        assert ticks and all(t.lstrip("−-").isdigit() for t in ticks), (name, label, ticks)
        n = LAYERS if label == "layer" else HEADS
        assert {int(t) for t in ticks} <= set(range(n)), (name, label, ticks)
        if name != "constant_raw":  # Every head and layer numbered on a head map.
          assert [int(t) for t in ticks] == list(range(n)), (name, label, ticks)
    if name.startswith("example"):
      norms[name.rsplit("_", 1)[1]] = fig.axes[0].images[0].norm
    plt.close(fig)
  assert names == EXPECTED
  # Effective = input-dependent here (no block stored): both drawn on one colour scale.
  assert (norms["dynamic"].vmin, norms["dynamic"].vmax) == (norms["effective"].vmin,
                                                            norms["effective"].vmax)
  dyn = pack.unpack_matrices(data["examples"][0]["dynamic"])[0, 0]
  assert norms["dynamic"].vmax == pytest.approx(float(dyn.max()))


def test_figures_flag_is_checked_and_wired_into_the_explore_command(tmp_path, monkeypatch):
  assert ExplorerConfig().figures == ()
  assert ExplorerConfig.from_config(base.get_config().explore).figures == ()
  assert ExplorerConfig.from_config(dict(figures="svg, png,svg")).figures == ("svg", "png")
  with pytest.raises(ConfigError, match=r"explore.figures=.*\['pdf'\] unknown"):
    ExplorerConfig.from_config(dict(figures=("svg", "pdf")))
  wd = str(tmp_path / "wd")
  tiny_workdir(wd)
  _refuse_subprocess(monkeypatch)
  c = base.get_config()
  c.explore.examples, c.explore.max_examples, c.explore.output = (), 0, "ex.html"
  assert not os.path.exists(os.path.join(wd, "ex_figures"))
  c.explore.figures = ("svg",)
  page = explorer.run(c, wd)
  assert page == os.path.join(wd, "ex.html") and os.path.exists(page)
  assert sorted(os.listdir(os.path.join(wd, "ex_figures"))) == [
      "constant_raw.svg", "heads_sort-lambda.svg", "papa_curve.svg", "ranking.svg"]
  c.explore.figures = ("svg", "eps")
  with pytest.raises(ConfigError, match="explore.figures"):
    explorer.run(c, wd)
