"""Figures of the PAPA report (matplotlib, Agg backend), from `report.analyse`'s dict."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from papa_jax.papa.schedule import ranking_from_lambdas
from papa_jax.plotting import pyplot, save_figure
from papa_jax.report.markdown import fraction_label

_VARIANT_STYLE = {"raw": "-", "effective": "--"}
_MARKERS = "osD^vP*Xh<>"


def curves(report: dict, path: str) -> None:
  """Score vs fraction of constant heads: a panel per task, a line per model and variant.

  Shaded: the bootstrap band of each point (when predictions exist);
  error bars: ± std over seeds (logged scores only).
  """
  plt = pyplot()
  exps = report["experiments"]
  tasks = list(dict.fromkeys(r["task"] for r in exps))
  fracs = {}
  for r in exps:
    for c in r["conditions"]:
      fracs.setdefault(c["fraction_label"], c["fraction"])
  labels = sorted(fracs, key=fracs.get)
  pos = {lb: i for i, lb in enumerate(labels)}
  models = list(dict.fromkeys(r["model"] for r in exps))
  colors = {m: plt.cm.tab10(i % 10) for i, m in enumerate(models)}
  ncol = min(3, len(tasks))
  nrow = math.ceil(len(tasks) / ncol)
  fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.5 * nrow + 0.6), dpi=110,
                           squeeze=False)
  level = f"{100 * report['settings']['level']:.0f}%"
  for ax, task in zip(axes.ravel(), tasks):
    for r in (r for r in exps if r["task"] == task):
      for s in r["summary"]:
        pts = [c for c in r["conditions"] if c["variant"] == s["variant"] and c["static_heads"]]
        pts = sorted(([r["baseline"]] if r["baseline"] else []) + pts, key=lambda c: c["fraction"])
        if not pts:
          continue
        x = np.array([pos[c["fraction_label"]] for c in pts], float)
        y = np.array([c["mean"] for c in pts])
        style = dict(color=colors[r["model"]], ls=_VARIANT_STYLE.get(s["variant"], ":"))
        ax.plot(x, y, marker="o", ms=3.5, label=f"{r['model']} ({s['variant']})", **style)
        ci = np.array([c["score_ci"] or (np.nan, np.nan) for c in pts], float)
        has = np.isfinite(ci[:, 0])
        if has.all():
          ax.fill_between(x, ci[:, 0], ci[:, 1], color=style["color"], alpha=0.15, lw=0)
        else:  # Mixed: the interval as solid bars, ± std (logged scores) dotted.
          ax.errorbar(x[has], y[has], yerr=[y[has] - ci[has, 0], ci[has, 1] - y[has]],
                      fmt="none", capsize=2, color=style["color"])
          std = np.nan_to_num([c["std"] for c, h in zip(pts, has) if not h])
          bars = ax.errorbar(x[~has], y[~has], yerr=std, fmt="none", capsize=2,
                             color=style["color"])
          bars[-1][0].set_linestyle(":")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_title(f"{task} ({next(r['metric'] for r in exps if r['task'] == task)})", fontsize=9)
    ax.set_xlabel("fraction of heads constant", fontsize=8)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, title=f"shaded or solid bars: {level} bootstrap\n"
              "dotted bars: ± std (logged scores only)", title_fontsize=6)
  for ax in axes.ravel()[len(tasks):]:
    ax.axis("off")
  fig.suptitle("PAPA: dev score as heads become constant (mean over probe seeds)", fontsize=10)
  fig.tight_layout()
  save_figure(fig, path, tight=False)


def scatter(report: dict, path: str, variant: str = "raw") -> None:
  """Baseline score vs relative drop (all heads constant), one point per informative
  (model, task) cell (the pairs of the rank correlation)."""
  plt = pyplot()
  corr = report["correlation"].get(variant) or dict(n=0, pairs=[], rho=None, note="no pairs")
  fig, ax = plt.subplots(figsize=(6.2, 4.6), dpi=110)
  tasks = list(dict.fromkeys(p["task"] for p in corr["pairs"]))
  models = list(dict.fromkeys(p["model"] for p in corr["pairs"]))
  for p in corr["pairs"]:
    ci = p.get("relative_drop_ci")
    yerr = None
    if ci and all(map(math.isfinite, ci)):
      d = p["relative_drop"]
      yerr = [[100 * max(d - ci[0], 0)], [100 * max(ci[1] - d, 0)]]
    ax.errorbar([p["baseline"]], [100 * p["relative_drop"]], yerr=yerr, capsize=2,
                color=plt.cm.tab10(tasks.index(p["task"]) % 10),
                marker=_MARKERS[models.index(p["model"]) % len(_MARKERS)], ms=6, ls="none")
  for i, t in enumerate(tasks):
    ax.plot([], [], "s", color=plt.cm.tab10(i % 10), label=t)
  for i, m in enumerate(models):
    ax.plot([], [], _MARKERS[i % len(_MARKERS)], color="gray", label=m)
  ax.axhline(0, color="gray", lw=0.8, ls=":")
  ax.set_xlabel("baseline score (input-dependent attention)", fontsize=8)
  ax.set_ylabel("relative drop, all heads constant (%)", fontsize=8)
  rho = "–" if corr.get("rho") is None else (
      f"{corr['rho']:.2f} [{corr['ci'][0]:.2f}, {corr['ci'][1]:.2f}] ({corr['verdict']})")
  title = f"Better models lose more? Spearman rho = {rho}, n = {corr['n']} informative pairs"
  if corr.get("note"):
    title += f"\n{corr['note']}"
  ax.set_title(title, fontsize=8)
  ax.grid(alpha=0.3)
  ax.tick_params(labelsize=7)
  if corr["pairs"]:
    level = f"{100 * report['settings']['level']:.0f}%"
    ax.legend(fontsize=6, title=f"bars: {level} paired-bootstrap interval", title_fontsize=6)
  fig.tight_layout()
  save_figure(fig, path, tight=False)


def _pool(m: np.ndarray, size: int) -> np.ndarray:
  """Block-averages the last two axes down to at most `size` (keeps figures small)."""
  f = math.ceil(m.shape[-1] / size)
  if f == 1:
    return m
  pad = (-m.shape[-1]) % f
  m = np.pad(m, [(0, 0)] * (m.ndim - 2) + [(0, pad), (0, pad)])
  s = m.shape[-1] // f
  return m.reshape(m.shape[:-2] + (s, f, s, f)).mean((-3, -1))


def means_grid(means: np.ndarray, path: str, title: str, max_cells: int = 64) -> None:
  """Every head's constant matrix as a small heatmap, laid out layer x head.

  One image (a mosaic) rather than one axes per head, so 24 x 16 heads render
  in about a second. Each head is scaled to its own maximum, to show where
  its attention goes rather than how peaked it is.
  """
  plt = pyplot()
  from matplotlib import colors  # pylint: disable=import-outside-toplevel
  layers, heads = means.shape[:2]
  m = _pool(np.asarray(means, np.float64), max_cells)
  peak = m.max((-2, -1), keepdims=True)
  m = np.divide(m, peak, out=np.zeros_like(m), where=peak > 0)
  size, gap = m.shape[-1], max(1, m.shape[-1] // 16)
  cell = size + gap
  mosaic = np.full((layers * cell - gap, heads * cell - gap), np.nan)
  for l in range(layers):
    for h in range(heads):
      mosaic[l * cell:l * cell + size, h * cell:h * cell + size] = m[l, h]
  width = min(16.0, max(5.0, 0.85 * heads + 2.0))
  height = min(24.0, max(3.5, (width - 2.0) * layers / heads + 1.2))
  fig, ax = plt.subplots(figsize=(width, height), dpi=100)
  cmap = plt.get_cmap("viridis").with_extremes(bad="white")
  # Square-root scale: a [CLS] column or a diagonal band and the faint rest
  # stay visible together.
  im = ax.imshow(mosaic, cmap=cmap, norm=colors.PowerNorm(0.5, vmin=0, vmax=1),
                 interpolation="nearest")
  ax.set_xticks(np.arange(heads) * cell + size / 2 - 0.5)
  ax.set_xticklabels(range(heads), fontsize=7)
  ax.set_yticks(np.arange(layers) * cell + size / 2 - 0.5)
  ax.set_yticklabels(range(layers), fontsize=7)
  ax.set_xlabel("head (each cell: query rows x key columns)", fontsize=8)
  ax.set_ylabel("layer", fontsize=8)
  fig.colorbar(im, ax=ax, fraction=0.03, label="attention / head's maximum (sqrt scale)")
  full = means.shape[-1]
  pooled = f", {full}x{full} averaged to {size}x{size}" if size < full else ""
  ax.set_title(f"Constant attention matrices, {title}{pooled}", fontsize=9)
  fig.tight_layout()
  save_figure(fig, path, tight=False)


def constant_from(ranking: Sequence, ks: Sequence[int], layers: int, heads: int) -> np.ndarray:
  """`[layers, heads]`: the smallest k of the schedule at which each head is constant (0: never)."""
  out = np.zeros((layers, heads), int)
  ks = sorted(k for k in ks if k > 0)
  for pos, (l, h) in enumerate(ranking):
    out[l, h] = next((k for k in ks if k > pos), 0)
  return out


def gate_map(gates: np.ndarray | None, ranking: Sequence | None, ks: Sequence[int], total: int,
             path: str, title: str) -> None:
  """Gate logits per layer x head; each cell marked with the fraction that makes it constant."""
  plt = pyplot()
  if ranking is None:
    ranking = ranking_from_lambdas(np.asarray(gates))
  if gates is None:  # No gates: show the rank instead.
    layers, heads = max(l for l, _ in ranking) + 1, max(h for _, h in ranking) + 1
    values, label = np.zeros((layers, heads)), "position in the head order"
    for pos, (l, h) in enumerate(ranking):
      values[l, h] = pos
  else:
    values, label = np.asarray(gates, np.float64), "gate logit (low = constant first)"
  layers, heads = values.shape
  from_k = constant_from(ranking, ks, layers, heads)
  fig, ax = plt.subplots(figsize=(min(16.0, max(5.5, 0.6 * heads + 2)),
                                  min(20.0, max(3.5, 0.42 * layers + 1.6))), dpi=100)
  im = ax.imshow(values, cmap="cividis", aspect="auto")
  mid = np.nanmean(values)
  fs = 7 if heads <= 12 else 5.5
  for l in range(layers):
    for h in range(heads):
      if from_k[l, h]:
        ax.text(h, l, fraction_label(from_k[l, h], total), ha="center", va="center", fontsize=fs,
                color="black" if values[l, h] > mid else "white")
  ax.set_xticks(range(heads))
  ax.set_yticks(range(layers))
  ax.tick_params(labelsize=6)
  ax.set_xlabel("head", fontsize=8)
  ax.set_ylabel("layer", fontsize=8)
  fig.colorbar(im, ax=ax, fraction=0.04, label=label)
  ax.set_title(f"Head order, {title}\ncell text: the smallest fraction of constant heads\n"
               "that includes this head", fontsize=8)
  fig.tight_layout()
  save_figure(fig, path, tight=False)


def control_curves(controls: dict, path: str) -> None:
  """Score vs fraction of constant heads per ordering (raw mean) and per constant (PAPA's
  order): seed bands; the random null curve with its pooled band."""
  plt = pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8), dpi=110)
  level = "bootstrap band"
  for ax, (title, pick) in zip(axes, (
      ("head orderings (constant: raw mean)", lambda x: x["variant"] == "raw"),
      ("constants (PAPA's ordering)", lambda x: x["ordering"] == "lambda"))):
    keys = list(dict.fromkeys((x["ordering"], x["variant"]) for x in controls["curves"]
                              if pick(x)))
    for i, key in enumerate(keys):
      pts = sorted((x for x in controls["curves"] if (x["ordering"], x["variant"]) == key),
                   key=lambda x: x["fraction"])
      label = key[0] if title.startswith("head") else key[1]
      x = np.array([p["fraction"] for p in pts])
      y = np.array([p["mean"] for p in pts])
      ci = np.array([p["ci"] for p in pts], float)
      color = "black" if label in ("random", "uniform") else plt.cm.tab10(i % 10)
      ax.plot(x, y, marker="o", ms=3, color=color, label=label,
              ls="--" if label in ("random", "uniform") else "-")
      if np.isfinite(ci).all():
        ax.fill_between(x, ci[:, 0], ci[:, 1], color=color, alpha=0.12, lw=0)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("fraction of heads constant", fontsize=8)
    ax.set_ylabel(controls["metric"], fontsize=8)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, title=level, title_fontsize=6)
  fig.suptitle(f"{controls['model']} / {controls['task']}: PAPA's controls", fontsize=10)
  fig.tight_layout()
  save_figure(fig, path, tight=False)


def agreement_grid(rows: Sequence[dict], path: str, title: str) -> None:
  """The per-head agreement table (`head_maps.agreement` rows) as a maps x importance-scores
  grid of Spearman rho in [-1, 1], each cell annotated ("n/a": undefined or not compared)."""
  measures = list(dict.fromkeys(r["measure"] for r in rows))
  scores = list(dict.fromkeys(r["score"] for r in rows))
  rho = np.full((len(measures), len(scores)), np.nan)
  for r in rows:
    if r["rho"] is not None:
      rho[measures.index(r["measure"]), scores.index(r["score"])] = r["rho"]
  plt = pyplot()
  fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(scores), 1.4 + 0.32 * len(measures)), dpi=120)
  im = ax.imshow(rho, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
  ax.set_xticks(range(len(scores)), scores, rotation=30, ha="right", fontsize=7)
  ax.set_yticks(range(len(measures)), measures, fontsize=7)
  for (i, j), v in np.ndenumerate(rho):
    ax.text(j, i, "n/a" if not np.isfinite(v) else f"{v:.2f}", ha="center", va="center",
            fontsize=7)
  fig.colorbar(im, ax=ax, fraction=0.046, label="Spearman rho over heads")
  ax.set_title(title, fontsize=8)
  save_figure(fig, path)
