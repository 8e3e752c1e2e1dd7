"""The explorer's panels as figure files, written without a browser (`explore.figures`).

`write_figures(data, page_path, formats)` draws, with matplotlib, from the payload the page
shows (`page.payload`), what the page shows when it opens: the head grid of the first
constant variant, the PAPA curve (if probed), the head ranking (if sorted), the first stored
example's input-dependent, masked-constant and effective attention of layer 0, head 0, and
each per-head map (`data["heads"]["maps"]`) and each per-position map's first example
(`data["tokens"]`). Files go next to the page, in
`<page stem>_figures/<panel>.<format>`. Colours follow the page's maps (draw.js) and its
default square-root scale; layer and head axes have integer ticks
(`papa_jax.analysis.figures`). The page itself exports any panel of any selection as SVG
(one <rect> per matrix cell) or PNG from its buttons (docs/explorer.md).
"""

from __future__ import annotations

import io
import os
import re
import textwrap
from typing import Any, Iterator, Sequence

import numpy as np
from absl import logging

from papa_jax import convert
from papa_jax.workdir import storage
from papa_jax.analysis import figures
from papa_jax.errors import ConfigError
from papa_jax.explorer import pack
from papa_jax.plotting import pyplot

FORMATS = ("svg", "png")
PNG_DPI = 200
# The page's colour maps (draw.js): sequential for non-negative matrices, diverging for
# signed ones (effective attention), viridis for per-head maps.
SEQ = ("#fffff0", "#fde9a9", "#fdbb6c", "#f3844b", "#d94f3d", "#a8233f", "#6b0f3a", "#2d0a2a")
DIV = ("#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b")
GAMMA = 0.5  # The page's default colour scale: square root.
SCALE_NOTE = "square-root colour scale"
# The page's initial selection (explorer.js: `select(0, 0)`, example 0, the first variant).
LAYER, HEAD, EXAMPLE = 0, 0, 0


def figure_formats(value: Any) -> tuple[str, ...]:
  """`explore.figures` checked: a subset of `FORMATS` ('svg,png' works too), without repeats;
  () when empty (no files)."""
  given = (value,) if isinstance(value, str) else tuple(value or ())
  names = tuple(v.strip().lower() for item in given for v in str(item).split(",") if v.strip())
  bad = [v for v in names if v not in FORMATS]
  if bad:
    raise ConfigError(f"explore.figures={given!r}: {bad} unknown; use a subset of {FORMATS} "
                      "(e.g. ('svg', 'png')), or () for none.")
  return tuple(dict.fromkeys(names))


def figures_dir(page_path: str) -> str:
  """Where the figures of the page at `page_path` go: `<page stem>_figures` beside it."""
  stem, _ = os.path.splitext(page_path)
  return f"{stem}_figures"


def _slug(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9.]+", "-", str(text)).strip("-")


def _colormaps():
  from matplotlib import colors  # pylint: disable=import-outside-toplevel
  seq = colors.LinearSegmentedColormap.from_list("papa_seq", SEQ).with_extremes(bad="white")
  div = colors.LinearSegmentedColormap.from_list("papa_div", DIV).with_extremes(bad="white")
  return seq, div


def _norm(peak: float, signed: bool):
  """The page's square-root scale over [0, peak], or a signed one over [-peak, peak]."""
  from matplotlib import colors  # pylint: disable=import-outside-toplevel
  peak = float(peak) or 1.0
  if not signed:
    return colors.PowerNorm(GAMMA, vmin=0.0, vmax=peak)
  return colors.FuncNorm((_signed_root, _signed_square), vmin=-peak, vmax=peak)


def _signed_root(x):
  return np.sign(x) * np.abs(x) ** GAMMA


def _signed_square(y):
  return np.sign(y) * np.abs(y) ** (1 / GAMMA)


def _title(data: dict, text: str) -> str:
  meta = data["meta"]
  return f"{convert.short_name(meta['model'])} · {meta['task']}: {text}"


def _suptitle(fig, text: str) -> None:
  """A title wrapped to the figure's width (about 13 characters per inch at 9 pt)."""
  fig.suptitle("\n".join(textwrap.wrap(text, max(30, int(fig.get_figwidth() * 13)))), fontsize=9)


def _grid(data: dict, variant: str):
  """Every head's constant matrix, each over its own max (as the page's grid), as one image
  with a white gap between heads; integer layer and head ticks."""
  plt = pyplot()
  avgs = pack.unpack_matrices(data["means"][variant]).astype(np.float64)  # [layers, heads, L, L]
  layers, heads, L, _ = avgs.shape
  signed = bool(avgs.min() < 0)
  peak = np.abs(avgs).max(axis=(-2, -1), keepdims=True)
  scaled = avgs / np.where(peak > 0, peak, 1.0)
  gap = max(1, L // 8)
  step = L + gap
  mosaic = np.full((layers * step - gap, heads * step - gap), np.nan)
  for l in range(layers):
    for h in range(heads):
      mosaic[l * step:l * step + L, h * step:h * step + L] = scaled[l, h]
  seq, div = _colormaps()
  fig, ax = plt.subplots(figsize=(min(16.0, 1.6 + 0.62 * heads), min(20.0, 1.4 + 0.62 * layers)),
                         dpi=120)
  im = ax.imshow(mosaic, cmap=div if signed else seq, norm=_norm(1.0, signed),
                 interpolation="nearest")
  # Integer ticks at each head's centre (the mosaic's own axes are pixels).
  ax.set_xticks([h * step + (L - 1) / 2 for h in range(heads)], [str(h) for h in range(heads)],
                fontsize=7)
  ax.set_yticks([l * step + (L - 1) / 2 for l in range(layers)],
                [str(l) for l in range(layers)], fontsize=7)
  ax.tick_params(length=0)
  ax.xaxis.set_ticks_position("top")
  ax.xaxis.set_label_position("top")
  ax.set_xlabel("head", fontsize=8)
  ax.set_ylabel("layer", fontsize=8)
  for side in ax.spines.values():
    side.set_visible(False)
  bar = fig.colorbar(im, ax=ax, fraction=0.025, shrink=0.7)
  bar.ax.tick_params(labelsize=7)
  bar.set_label(f"fraction of each matrix's max\n({SCALE_NOTE})", fontsize=7)
  meta = data["means"][variant]["meta"]
  _suptitle(fig, _title(data, f"mean {variant} attention over {meta.get('num_examples')} "
                              f"{meta.get('split')} examples; each head: query × key position"))
  return fig


def _curve(data: dict):
  """Probe score vs fraction of constant heads, one line per variant (raw first), with the
  rows' error bars and bands."""
  plt = pyplot()
  rows = data["results"]["rows"]
  variants = sorted({r["variant"] for r in rows}, key=lambda v: (v != "raw", v))
  fig, ax = plt.subplots(figsize=(5.0, 3.4), dpi=120)
  for k, variant in enumerate(variants):
    pts = sorted((r for r in rows if r["variant"] == variant or r["static_heads"] == 0),
                 key=lambda r: r["fraction"])
    pts = [r for i, r in enumerate(pts) if i == 0 or r["fraction"] != pts[i - 1]["fraction"]]
    x = [r["fraction"] for r in pts]
    y = [np.nan if r["score"] is None else r["score"] for r in pts]
    err = [r.get("score_std") or 0.0 for r in pts]
    line = ax.errorbar(x, y, yerr=err if any(err) else None, marker="os^D"[k % 4], ms=4,
                       capsize=3, label=f"constant = mean {variant} attention")
    band = [r for r in pts if r.get("band_low") is not None and r.get("band_high") is not None]
    if len(band) > 1:
      ax.fill_between([r["fraction"] for r in band], [r["band_low"] for r in band],
                      [r["band_high"] for r in band], alpha=0.18, color=line[0].get_color(),
                      lw=0)
  ax.set_xlabel("fraction of heads with constant attention", fontsize=8)
  ax.set_ylabel(rows[0]["metric"], fontsize=8)
  ax.tick_params(labelsize=7)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  _suptitle(fig, _title(data, "PAPA curve"))
  return fig


def _head_map(data: dict, values, title: str, label: str = "", text=None):
  """A layer x head map (figures' heatmap helper: integer ticks, colour bar), `text(l, h)`
  written in each cell if given."""
  plt = pyplot()
  values = np.asarray([[np.nan if v is None else v for v in row] for row in values], float)
  layers, heads = values.shape
  fig, ax = plt.subplots(figsize=(min(14.0, 1.8 + 0.42 * heads), min(12.0, 1.5 + 0.3 * layers)),
                         dpi=120)
  figures._heatmap(fig, ax, values, "", cmap="viridis")  # pylint: disable=protected-access
  if heads <= 16:  # Every head numbered (the helper's integer ticks skip some).
    ax.set_xticks(range(heads))
  if layers <= 24:
    ax.set_yticks(range(layers))
  fig.axes[-1].tick_params(labelsize=7)
  if label:
    fig.axes[-1].set_ylabel(label, fontsize=7)
  if text is not None and layers * heads <= 200:
    for (l, h), v in np.ndenumerate(values):
      ax.text(h, l, text(l, h), ha="center", va="center", fontsize=6,
              color="white" if not np.isfinite(v) or v < np.nanmean(values) else "black")
  _suptitle(fig, _title(data, title))
  return fig


def _ranking(data: dict):
  ranking = data["ranking"]
  layers, heads = data["meta"]["layers"], data["meta"]["heads"]
  rank = np.zeros((layers, heads), int)
  for i, (l, h) in enumerate(ranking["order"]):
    rank[l, h] = i + 1
  if ranking.get("lambdas") is not None:
    return _head_map(data, ranking["lambdas"], "head ranking, gate logit λ per head (numbers: "
                     "rank, 1 = made constant first)", "gate logit λ",
                     text=lambda l, h: str(rank[l, h]))
  return _head_map(data, rank.tolist(), "head ranking (1 = made constant first)", "rank")


def _example_panels(data: dict) -> Iterator[tuple[str, Any]]:
  """The first stored example's panels at the page's initial layer and head. Effective
  attention equal to the input-dependent one (no block stored) shares its colour scale."""
  if not data["examples"]:
    return
  plt = pyplot()
  rec = data["examples"][EXAMPLE]
  variant = next(iter(data["means"]))
  pos = np.asarray(rec["positions"])
  dyn = pack.unpack_matrices(rec["dynamic"])[LAYER, HEAD].astype(np.float64)
  const = pack.unpack_matrices(data["means"][variant])[LAYER, HEAD].astype(np.float64)
  const = const[np.ix_(pos, pos)]
  const /= np.maximum(np.abs(const).sum(-1, keepdims=True), 1e-12)  # As constant_probs.
  same = rec["effective"] is None
  eff = dyn if same else pack.unpack_matrices(rec["effective"])[LAYER, HEAD].astype(np.float64)
  panels = [("dynamic", dyn, "input-dependent attention", False),
            ("constant", const, f"constant (mean {variant}), masked to the example",
             bool(const.min() < 0)),
            ("effective", eff, "effective attention (= input-dependent: no more tokens than the "
             "head dimension)" if same else "effective attention (blue < 0)", not same)]
  peaks = {k: float(np.abs(m).max()) for k, m, _, _ in panels}
  if same:  # One scale for the two panels said to be equal.
    peaks["dynamic"] = peaks["effective"] = max(peaks["dynamic"], peaks["effective"])
  seq, div = _colormaps()
  tokens, n = rec["tokens"], len(rec["tokens"])
  size = max(3.6, 0.16 * n + 1.6)
  for kind, m, what, signed in panels:
    fig, ax = plt.subplots(figsize=(size + 0.9, size), dpi=120)
    im = ax.imshow(m, cmap=div if signed else seq, norm=_norm(peaks[kind], signed),
                   interpolation="nearest")
    ax.set_xticks(range(n), tokens, rotation=90, fontsize=max(3, 7 - n // 20))
    ax.set_yticks(range(n), tokens, fontsize=max(3, 7 - n // 20))
    ax.set_xlabel("key token", fontsize=7)
    ax.set_ylabel("query token", fontsize=7)
    bar = fig.colorbar(im, ax=ax, fraction=0.046)
    bar.ax.tick_params(labelsize=7)
    bar.set_label(SCALE_NOTE, fontsize=7)
    _suptitle(fig, _title(data, f"dev example #{rec['index']}, layer {LAYER}, head {HEAD}: "
                                f"{what}"))
    yield f"example{rec['index']}_layer{LAYER}_head{HEAD}_{kind}", fig


def _token_map(data: dict, m: dict, ex: dict):
  """One example of a per-position map: rows (layers) x its word pieces, linear colours over
  the example's largest |value| (centred at 0 when signed), as the page draws it."""
  plt = pyplot()
  values = np.asarray([[np.nan if v is None else v for v in row] for row in ex["values"]], float)
  rows, n = values.shape
  peak = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 1.0
  seq, div = _colormaps()
  fig, ax = plt.subplots(figsize=(min(16.0, 2.0 + 0.26 * n), 1.6 + 0.3 * rows), dpi=120)
  im = ax.imshow(values, cmap=div if m["signed"] else seq, vmin=-peak if m["signed"] else 0.0,
                 vmax=peak or 1.0, interpolation="nearest", aspect="auto")
  ax.set_xticks(range(n), ex["tokens"], rotation=90, fontsize=max(4, 8 - n // 16))
  ax.set_yticks(range(rows), m["rows"], fontsize=7)
  bar = fig.colorbar(im, ax=ax, fraction=0.03)
  bar.ax.tick_params(labelsize=7)
  bar.set_label(f"linear colour scale{'; ' + m['unit'] if m.get('unit') else ''}", fontsize=7)
  _suptitle(fig, _title(data, f"{m['label']}; {ex['title']}"))
  return fig


def panel_figures(data: dict) -> Iterator[tuple[str, Any]]:
  """(file name without extension, matplotlib figure) of every panel, one at a time."""
  variant = next(iter(data["means"]))
  yield f"constant_{_slug(variant)}", _grid(data, variant)
  if data.get("results") and data["results"].get("rows"):
    yield "papa_curve", _curve(data)
  if data.get("ranking"):
    yield "ranking", _ranking(data)
  yield from _example_panels(data)
  for m in (data.get("heads") or {}).get("maps", []):
    where = m.get("stage", "") + (f", {m['subset']} examples" if m.get("subset") else "")
    if m.get("examples") is not None:
      where += f", {m['examples']} {m.get('split') or ''} examples".rstrip()
    higher = f"; higher = {m['higher']}" if m.get("higher") else ""
    yield f"heads_{_slug(m['key'])}", _head_map(data, m["values"], f"{m['label']} per head "
                                                f"({where}){higher}", m.get("unit") or "")
  for m in data.get("tokens") or ():  # Each per-position map's first example.
    if m["examples"]:
      yield f"positions_{_slug(m['key'])}_example0", _token_map(data, m, m["examples"][0])


def write_figures(data: dict[str, Any], page_path: str, formats: Sequence[str]) -> list[str]:
  """Writes every panel of `data` (`page.payload`) in `formats` next to the page.

  Args:
    data: the page's payload.
    page_path: the page's path (local, or a URI): files go to `figures_dir(page_path)`.
    formats: a subset of `FORMATS` (`explore.figures`); () writes nothing.

  Returns:
    The paths written.
  """
  formats = figure_formats(formats)
  if not formats:
    return []
  import matplotlib  # pylint: disable=import-outside-toplevel
  plt = pyplot()
  folder, written = figures_dir(page_path), []
  # Text stays text in SVG; no date or random ids, so a file changes only with its figure.
  style = {"svg.fonttype": "none", "svg.hashsalt": "papa-explorer"}
  with matplotlib.rc_context(style):
    for name, fig in panel_figures(data):
      fig.tight_layout()
      for fmt in formats:
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=PNG_DPI if fmt == "png" else None,
                    metadata={"Date": None} if fmt == "svg" else None)
        path = os.path.join(folder, f"{name}.{fmt}")
        with storage.atomic_write(path, "wb") as f:
          f.write(buf.getvalue())
        written.append(path)
      plt.close(fig)
  logging.info("explorer: wrote %d figures (%s) to %s.", len(written), ", ".join(formats),
               folder)
  return written
