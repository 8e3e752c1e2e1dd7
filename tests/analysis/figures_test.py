"""The stages' figures: whole-number ticks on layer and head axes, series that stay visible
when equal, titles with the model's short name."""

import numpy as np
import pytest

from papa_jax import convert
from papa_jax.analysis import figures

pytestmark = pytest.mark.unit


@pytest.fixture
def drawn(monkeypatch):
  """The figures a call draws, kept open instead of saved."""
  kept = []
  monkeypatch.setattr(figures, "save_figure", lambda fig, path: kept.append(fig))
  yield kept
  for fig in kept:
    figures.pyplot().close(fig)


def _ticks(axis) -> np.ndarray:
  """The tick positions drawn inside the axis's range."""
  axis.axes.figure.canvas.draw()
  lo, hi = sorted(axis.get_view_interval())
  t = np.asarray(axis.get_ticklocs())
  return t[(t >= lo) & (t <= hi)]


@pytest.mark.parametrize("layers,heads", [(2, 2), (3, 12), (24, 16)])
def test_figures_head_maps_tick_whole_layers_and_heads(drawn, layers, heads):
  values = np.random.default_rng(0).random((layers, heads))
  figures.head_maps([("a", values), ("b", values)], "unused.png", "title")
  maps = [ax for ax in drawn[0].axes if ax.get_xlabel() == "head"]  # Not the colour bars.
  assert len(maps) == 2
  for ax in maps:
    for axis in (ax.xaxis, ax.yaxis):
      t = _ticks(axis)
      assert len(t) >= 2 and np.all(t == np.round(t)), t


def test_figures_layer_lines_keep_equal_series_visible(drawn):
  same = [0.2, 0.4, 0.5]
  figures.layer_lines([("self", {"alti": same, "norms": same, "value_zeroing": [.1, .2, .3]})],
                      "unused.png", "title")
  ax = drawn[0].axes[0]
  styles = [(line.get_marker(), line.get_linestyle()) for line in ax.get_lines()]
  assert len(styles) == 3 and len(set(styles)) == 3, styles
  t = _ticks(ax.xaxis)
  assert np.all(t == np.round(t)), t
  assert [t.get_text() for t in ax.get_legend().get_texts()] == ["alti", "norms", "value_zeroing"]


@pytest.mark.parametrize("name,short", [
    ("sentence-transformers/all-MiniLM-L6-v2", "minilm"), ("fetch:splade_tiny", "splade_tiny"),
    ("pkg:sre_embedding_model/model_weights", "minilm_sre"), ("/models/my-bert/", "my-bert"),
    ("org/some-model", "some-model")])
def test_figures_model_short_name(name, short):
  assert convert.short_name(name) == short
