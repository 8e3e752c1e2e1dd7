"""Figures of the raw-vs-effective analysis (matplotlib, Agg backend)."""

from __future__ import annotations

import textwrap

import numpy as np

from papa_jax.plotting import pyplot, save_figure


def _integer_ticks(*axes) -> None:
  """Ticks at whole numbers only (layers and heads have no halves)."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=import-outside-toplevel
  for axis in axes:
    axis.set_major_locator(MaxNLocator(integer=True))


def _heatmap(fig, ax, values: np.ndarray, title: str, **imshow) -> None:
  """A layer x head heatmap with its colour bar."""
  im = ax.imshow(values, aspect="auto", **imshow)
  ax.set_title(title, fontsize=8)
  ax.set_xlabel("head", fontsize=7)
  ax.set_ylabel("layer", fontsize=7)
  ax.tick_params(labelsize=6)
  _integer_ticks(ax.xaxis, ax.yaxis)
  fig.colorbar(im, ax=ax, fraction=0.046)


def _save(fig, path: str, title: str) -> None:
  """A title wrapped to the figure's width (about 7 characters per inch at 9 pt)."""
  width = max(30, int(fig.get_figwidth() * 13))
  fig.suptitle("\n".join(textwrap.wrap(title, width)), fontsize=9)
  save_figure(fig, path)


def mass_heatmaps(mass_raw: np.ndarray, mass_eff: np.ndarray, categories: tuple[str, ...],
                  path: str, title: str) -> None:
  """Layer x head heatmaps of attention mass per token category, raw beside effective."""
  plt = pyplot()
  cats = len(categories)
  fig, axes = plt.subplots(2, cats, figsize=(3.1 * cats, 5.6), dpi=120, squeeze=False)
  for c, name in enumerate(categories):
    lo = min(mass_raw[..., c].min(), mass_eff[..., c].min(), 0.0)
    hi = max(mass_raw[..., c].max(), mass_eff[..., c].max())
    for r, (label, m) in enumerate((("raw", mass_raw), ("effective", mass_eff))):
      _heatmap(fig, axes[r, c], m[..., c], f"{label}: mass on {name.upper()}",
               vmin=lo, vmax=hi, cmap="viridis")
  _save(fig, path, title)


def agreement_heatmaps(stats: dict, path: str, title: str) -> None:
  """JS divergence, correlation and relative null norm per (layer, head)."""
  plt = pyplot()
  panels = (("js", "JS(raw, clipped effective)"), ("corr", "corr(A, A_eff)"),
            ("null_ratio", "||A_null|| / ||A||"))
  fig, axes = plt.subplots(1, 3, figsize=(10, 3.2), dpi=120)
  for ax, (key, label) in zip(axes, panels):
    _heatmap(fig, ax, stats[key], label, cmap="magma")
  _save(fig, path, title)


def attention_maps(raw: np.ndarray, eff: np.ndarray, tokens: list[str], path: str,
                   title: str) -> None:
  """One example's attention map, raw beside effective (same signed colour scale)."""
  plt = pyplot()
  n = len(tokens)
  size = max(5.0, 0.16 * n)
  fig, axes = plt.subplots(1, 3, figsize=(3 * size * 0.75, size * 0.8), dpi=110)
  lim = max(np.abs(raw).max(), np.abs(eff).max())
  for ax, (label, m) in zip(axes, (("raw A", raw), ("effective A_eff", eff),
                                   ("null A - A_eff", raw - eff))):
    im = ax.imshow(m, cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set_title(label, fontsize=8)
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(tokens, rotation=90, fontsize=max(3, 7 - n // 20))
    ax.set_yticklabels(tokens, fontsize=max(3, 7 - n // 20))
    fig.colorbar(im, ax=ax, fraction=0.046)
  _save(fig, path, title)


def head_maps(panels: list[tuple[str, np.ndarray]], path: str, title: str, *, ncols: int = 0,
              shared_scale: bool = True, cmap: str = "viridis", center: bool = False) -> None:
  """Layer x head heatmaps, one per panel (e.g. raw beside effective), one colour scale."""
  plt = pyplot()
  n = len(panels)
  ncols = ncols or n
  nrows = -(-n // ncols)
  fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.9 * nrows), dpi=120,
                           squeeze=False)
  vals = np.concatenate([np.ravel(p) for _, p in panels])
  vals = vals[np.isfinite(vals)]
  lo, hi = (float(vals.min()), float(vals.max())) if len(vals) else (0.0, 1.0)
  if center:
    lim = max(abs(lo), abs(hi))
    lo, hi = -lim, lim
  for ax, (name, values) in zip(axes.ravel(), panels):
    kw = dict(vmin=lo, vmax=hi) if shared_scale else {}
    _heatmap(fig, ax, values, name, cmap=cmap, **kw)
  for ax in axes.ravel()[n:]:
    ax.axis("off")
  _save(fig, path, title)


_MARKERS = ("o", "s", "^", "D", "v", "x")
_DASHES = ("-", "--", ":", "-.")


def layer_lines(panels: list[tuple[str, dict[str, list[float]]]], path: str, title: str) -> None:
  """One panel per group of per-layer series (e.g. each method's self-contribution)."""
  plt = pyplot()
  fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), dpi=120,
                           squeeze=False)
  for ax, (name, series) in zip(axes[0], panels):
    for k, (label, values) in enumerate(series.items()):
      # Its own marker and dash: a series equal to another stays visible beneath it.
      ax.plot(range(len(values)), values, marker=_MARKERS[k % len(_MARKERS)],
              ls=_DASHES[k % len(_DASHES)], ms=4 + 2 * (k % 2), mfc="none", label=label)
    ax.set_title(name, fontsize=8)
    ax.set_xlabel("layer", fontsize=7)
    _integer_ticks(ax.xaxis)
    ax.set_ylim(0, 1)
    ax.tick_params(labelsize=6)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
  _save(fig, path, title)
