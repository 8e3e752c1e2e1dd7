"""Regenerates figures of docs/figures/ from recorded workdirs, each naming its commit.

  python docs/make_figures.py [--quickstart WORKDIR] [--stages WORKDIR ...]
      [--report SUITE_OR_CONTROLS_WORKDIR ...] [--out docs/figures]

From a finished quickstart workdir (`configs/quickstart.py`) it writes `explorer.png` (the
explorer page of the workdir, built now and shot full-page in headless Chromium) and
`quickstart_papa_curve.png` (the workdir's own PAPA curve). From each `--stages` workdir it
copies the figures its analysis stages drew that docs/results.md shows (`STAGE_FIGURES`; the
commands that made them are there). From each `--report` workdir (a suite, or a controls run
with its report) it copies its report's figures that the docs show (`REPORT_FIGURES`: the
suite's curves, the controls' curves, the per-head agreement grid). Every figure gets a footer
line naming the papa-jax commit that drew it (the report's or the stage's own) and the
workdir's model, task and size, and the same text as the PNG's "Source" metadata.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from papa_jax import convert  # pylint: disable=wrong-import-position
from papa_jax.explorer import chromium, write_explorer  # pylint: disable=wrong-import-position
from papa_jax.plotting import pyplot  # pylint: disable=wrong-import-position


# (stage, file the stage writes) -> the docs/figures/ name docs/results.md uses.
STAGE_FIGURES = {
    ("effective", "mass_heatmaps.png"): "minilm_sst2_mass_heatmaps.png",
    ("effective", "example_attention.png"): "minilm_sst2_example_attention.png",
    ("finetune", "cosine.png"): "minilm_finetune_cosine.png",
    ("linguistic", "cls_mass.png"): "minilm_conll_cls_mass.png",
    ("ablation", "score_change.png"): "minilm_sst2_ablation.png",
    ("mixing", "layers.png"): "minilm_sst2_mixing_layers.png",
    ("mixing", "heads.png"): "minilm_sst2_mixing_heads.png",
}


# The report's figure -> its docs/figures/ name.
REPORT_FIGURES = {
    "curves.png": "suite_curves.png",
    "controls_minilm_sst2.png": "minilm_sst2_controls.png",
    "controls_minilm_ner.png": "minilm_ner_controls.png",
    "agreement_minilm_sst2.png": "minilm_sst2_mixing_agreement.png",
}


def commit() -> str:
  """The short git revision of this checkout, "-dirty" when it has changes."""
  run = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                                  check=False).stdout.strip()
  rev = run("rev-parse", "--short", "HEAD") or "unknown"
  return rev + ("-dirty" if run("status", "--porcelain", "--untracked-files=no") else "")


def source(workdir: str, rev: str | None = None) -> str:
  """The footer: commit (`rev`, else this checkout's), model, task and train/dev sizes of
  `workdir`."""
  cfg = json.load(open(os.path.join(workdir, "config.json"), encoding="utf-8"))
  d = cfg["data"]
  return (f"papa-jax {rev or commit()} · {convert.short_name(cfg['model']['name'])} · {d['task']} · "
          f"{d['max_train_examples']} train / {d['max_eval_examples']} dev examples (-1: all), "
          f"L = {d['max_length']}")


def stage_figures(workdir: str, out: str) -> list[str]:
  """The `STAGE_FIGURES` that `workdir`'s stages drew, stamped into `out` with the commit that
  drew them (the stage's stats.json `git_revision`)."""
  out_paths = []
  for (stage, name), dst in STAGE_FIGURES.items():
    src = os.path.join(workdir, stage, name)
    if os.path.exists(src):
      stats = json.load(open(os.path.join(workdir, stage, "stats.json"), encoding="utf-8"))
      rev = stats.get("git_revision", "unknown")
      rev = rev[:7] + ("-dirty" if rev.endswith("-dirty") else "")
      out_paths.append(stamp(src, os.path.join(out, dst), source(workdir, rev)))
  return out_paths


def stamp(src: str, dst: str, text: str) -> str:
  """`src` (a PNG) with a footer line `text`, saved as `dst` with `text` as its Source."""
  plt = pyplot()
  img = plt.imread(src)
  h, w = img.shape[:2]
  dpi, foot = 100, 24
  fig = plt.figure(figsize=(w / dpi, (h + foot) / dpi), dpi=dpi)
  ax = fig.add_axes((0, foot / (h + foot), 1, h / (h + foot)))
  ax.imshow(img)
  ax.axis("off")
  fig.text(0.005, 0.5 * foot / (h + foot), text, fontsize=9, va="center", color="#555")
  fig.savefig(dst, dpi=dpi, metadata={"Source": text})
  plt.close(fig)
  return dst


def report_figures(workdir: str, out: str) -> list[str]:
  """The `REPORT_FIGURES` of `workdir`'s report, stamped into `out` with the report's commit
  and what it covers."""
  folder = os.path.join(workdir, "report")
  found = {n: d for n, d in REPORT_FIGURES.items() if os.path.exists(os.path.join(folder, n))}
  if not found:
    return []
  rep = json.load(open(os.path.join(folder, "report.json"), encoding="utf-8"))
  rev = str(rep.get("git_revision", "unknown"))
  rev = rev[:7] + ("-dirty" if rev.endswith("-dirty") else "")
  cells = sorted({f"{e['model']}/{e['task']}" for e in rep["experiments"]})
  if len(cells) == 1:  # One experiment's report (a controls run) is not the suite's curves.
    found.pop("curves.png", None)
  text = (f"papa-jax {rev} · report over {len(cells)} experiment(s): {', '.join(cells[:6])}"
          + (" ..." if len(cells) > 6 else "") + f" · B = {rep['settings']['n_boot']}")
  return [stamp(os.path.join(folder, n), os.path.join(out, d), text) for n, d in found.items()]


def explorer_png(workdir: str, dst: str, text: str, exe: str | None = None,
                 browser=None) -> str:
  """The explorer page of `workdir`, shot full-page at 1400 px in headless Chromium (`browser`,
  a Playwright browser already running, else one started here from `exe` or the PATH)."""
  with tempfile.TemporaryDirectory() as tmp:
    page_path = write_explorer(workdir, path=os.path.join(tmp, "explorer.html"))
    shot = os.path.join(tmp, "shot.png")
    if browser is not None:
      _shoot(browser, page_path, shot)
    else:
      from playwright.sync_api import sync_playwright  # pylint: disable=import-outside-toplevel
      exe = exe or chromium.find_chromium()
      if exe is None:
        raise SystemExit("No Chromium: apt-get install chromium, or set PAPA_CHROMIUM.")
      with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=list(chromium.CHROMIUM_ARGS))
        _shoot(b, page_path, shot)
        b.close()
    return stamp(shot, dst, text)


def _shoot(browser, page_path: str, shot: str) -> None:
  page = browser.new_page(viewport={"width": 1400, "height": 1000})
  page.goto("file://" + page_path)
  page.wait_for_function("document.body.dataset.ready === '1'", timeout=120_000)
  page.screenshot(path=shot, full_page=True)
  page.close()


def main(argv: list[str] | None = None, browser=None) -> list[str]:
  """Writes the figures (see the module docstring); `browser`: a running Playwright browser."""
  p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
  p.add_argument("--quickstart", help="a finished quickstart workdir")
  p.add_argument("--stages", nargs="*", default=[],
                 help="workdirs whose analysis stages drew figures of docs/results.md")
  p.add_argument("--report", nargs="*", default=[],
                 help="suite or controls workdirs whose report/ drew figures the docs show")
  p.add_argument("--out", default=os.path.join(ROOT, "docs", "figures"))
  p.add_argument("--chromium", help="Chromium's path (default: $PAPA_CHROMIUM, the PATH)")
  a = p.parse_args(argv)
  if not (a.quickstart or a.stages or a.report):
    p.error("give --quickstart WORKDIR, --stages WORKDIR ... or --report WORKDIR ...")
  os.makedirs(a.out, exist_ok=True)
  written = []
  if a.quickstart:
    text = source(a.quickstart)
    written += [stamp(os.path.join(a.quickstart, "papa_curve.png"),
                      os.path.join(a.out, "quickstart_papa_curve.png"), text),
                explorer_png(a.quickstart, os.path.join(a.out, "explorer.png"), text,
                             a.chromium, browser)]
  for wd in a.stages:
    found = stage_figures(wd, a.out)
    if not found:
      p.error(f"{wd} holds none of the stage figures docs/results.md shows")
    written += found
  for wd in a.report:
    found = report_figures(wd, a.out)
    if not found:
      p.error(f"{wd}/report holds none of the report figures the docs show")
    written += found
  for path in written:
    print(path)
  return written


if __name__ == "__main__":
  main()
