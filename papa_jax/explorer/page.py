"""Writes the explorer: one self-contained HTML file per finished workdir."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.resources
import json
import os
import re
from typing import Any, Sequence

import jax
import ml_collections
from absl import logging

from papa_jax import convert, reader, results as results_lib
from papa_jax.config import schema as config_schema
from papa_jax.workdir import storage
from papa_jax.explorer import collect, export, pack
from papa_jax.papa import means as means_lib
from papa_jax.papa import schedule
from papa_jax.errors import IncompleteWorkdir, ResultFileError

STATIC_FILES = ("explorer.html", "explorer.css", "draw.js", "explorer.js")
QUANTIZATION = (
    "Matrices are stored as 8-bit codes with one scale per matrix (each head's constant "
    "matrix, each example's attention of one head): a shown value is within max/510 of the "
    "computed one for non-negative matrices (constant matrices, input-dependent attention) "
    "and within max|a|/254 for signed ones (effective attention), max being that matrix's "
    "largest entry. The constant matrix masked to an example is renormalised from these codes: "
    "an entry r of a row whose kept mass is S, over n tokens, is within e(1 + n r)/(S - n e), "
    "e the matrix's bound. An example with no more real tokens than the head dimension has "
    "effective = input-dependent attention (within 1e-5); it is stored once. Context-mixing "
    "maps (one matrix per example and layer, non-negative) are within max/510 too.")


@dataclasses.dataclass(frozen=True)
class ExplorerConfig:
  """What the page stores besides the workdir's files.

  Attributes:
    examples: dev-split indices (file order, the whole split) shown first.
    max_examples: examples stored in all: `examples`, then the following dev
      indices (for the search box); <= 0: exactly `examples`. Each costs about
      2 x layers x heads x n^2 bytes before compression (n real tokens).
    output: file name under the workdir, or an absolute path or URI elsewhere (where a
      read-only workdir's page goes; `output_path`).
    mixing: per-layer context-mixing maps stored per example (`collect.MIXING_LABELS`,
      by `papa_jax.context_mixing`); () = none. Value zeroing is the costly one.
    figures: also write the page's panels as figure files in these formats
      (`export.FORMATS`: svg, png) into `<page stem>_figures/`; () = none.
  """

  examples: tuple[int, ...] = (0, 1, 2)
  max_examples: int = 8
  output: str = "explorer.html"
  mixing: tuple[str, ...] = ("attention_rollout", "attnresln", "globenc", "alti", "alti_rollout",
                             "value_zeroing")
  figures: tuple[str, ...] = ()

  @classmethod
  def from_config(cls, explore: Any) -> ExplorerConfig:
    """From `config.explore` (a ConfigDict or dict); missing fields keep defaults."""
    d = dict(explore) if explore is not None else {}
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in d.items() if k in fields}
    if "examples" in kw:
      kw["examples"] = tuple(int(i) for i in kw["examples"])
    if "mixing" in kw:
      kw["mixing"] = config_schema.explore_mixing(d)
    if "figures" in kw:
      kw["figures"] = export.figure_formats(kw["figures"])
    return cls(**kw)


def run(config, workdir: str) -> str:
  """The launcher's entry point: `write_explorer` with `config.explore`."""
  c = ExplorerConfig.from_config(config.get("explore"))
  used = reader.read_config(workdir).get("model", {}).get("name", "")  # The rest: payload.
  logging.info("explorer: %s", model_note(config.get("model", {}).get("name", ""), used))
  return write_explorer(workdir, examples=c.examples, max_examples=c.max_examples,
                        path=output_path(workdir, c.output), mixing=c.mixing,
                        figures=c.figures)


def output_path(workdir: str, output: str) -> str:
  """Where the page of `workdir` goes: `output` under it, or `output` itself if that is an
  absolute path or a URI (`gs://...`)."""
  if not storage.is_local(output) or os.path.isabs(output):
    return output
  return os.path.join(workdir, output)


def model_note(asked: str, used: str) -> str:
  """What the log says of the model: the page always runs the workdir's own."""
  note = f"examples run through the workdir's model {convert.short_name(used)!r} ({used})"
  if asked and asked != used:
    note += f"; the command line's model.name={asked!r} is not used"
  return note + "."


def _static(name: str) -> str:
  return importlib.resources.files("papa_jax.explorer").joinpath("static", name).read_text("utf-8")


def _check_model(model: convert.Pretrained, means: means_lib.Means, warnings: list[str]) -> None:
  layers, heads, L, _ = means.avgs.shape
  mc = model.config
  if (mc.num_layers, mc.num_heads) != (layers, heads):
    raise ResultFileError(f"The model has {mc.num_layers}x{mc.num_heads} heads but the means "
                     f"have {layers}x{heads}.")
  if L > mc.max_length:
    raise ResultFileError(f"The means have length {L}, over the model's {mc.max_length} positions.")
  want = means.metadata.get("model_fingerprint")
  if want and model.fingerprint != want:
    warnings.append("The model used for the examples is not the one the means were computed "
                    "with (its parameters, precision or tokenizer differ): example attention "
                    "is from another model.")


def _mixing_names(model: convert.Pretrained, mixing: Sequence[str],
                  warnings: list[str]) -> tuple[str, ...]:
  """The maps to compute: `mixing` checked, or none (with a warning) for a model not in
  float32 (the measures decompose the layers exactly)."""
  names = config_schema.explore_mixing(dict(mixing=tuple(mixing)))
  if names and model.config.compute_dtype != "float32":
    warnings.append(f"No context-mixing maps: they need a float32 model, this one computes "
                    f"in {model.config.compute_dtype} (set model.dtype=float32).")
    logging.warning("explorer: %s", warnings[-1])
    return ()
  return names


def payload(workdir: str, *, examples: Sequence[int] = ExplorerConfig.examples,
            max_examples: int = ExplorerConfig.max_examples, model=None,
            mixing: Sequence[str] = ExplorerConfig.mixing) -> dict[str, Any]:
  """Everything the page shows, as a JSON-ready dict (matrices packed)."""
  wd = reader.read_workdir(workdir)
  cfg, means = wd.config, wd.means
  if not means:
    raise IncompleteWorkdir(f"No means file under {workdir}/means: run the 'means' stage first.")
  first = next(iter(means.values()))
  layers, heads, L, _ = first.avgs.shape
  meta_first = first.metadata
  layout = bool(meta_first.get("papa_layout", cfg.get("data", {}).get("papa_layout", True)))
  fractions = [float(f) for f in cfg.get("papa", {}).get("fractions", schedule.PAPER_FRACTIONS)]
  warnings: list[str] = []
  records, names = [], ()
  if examples or max_examples > 0:
    if model is None:  # The workdir's model, at the precision its run used.
      model = convert.load_pretrained(cfg["model"]["name"], compute_dtype=(
          config_schema.compute_dtype(ml_collections.ConfigDict(cfg), jax.default_backend())))
    _check_model(model, first, warnings)
    data_cfg = ml_collections.ConfigDict(cfg["data"])
    data_cfg.max_length = L
    names = _mixing_names(model, mixing, warnings)
    records = collect.example_records(model, data_cfg, examples, max_examples, names)
  ranking = collect.ranking_view(wd)
  if ranking is None:
    warnings.append("No head ranking (sort/sorted_heads.json): the schedule cannot be shown.")
  warnings += results_lib.warnings(dict(check=(wd.results or {}).get("check"),
                                        ranking_check=wd.sort_check))
  meta = dict(
      model=cfg.get("model", {}).get("name", meta_first.get("model", "?")),
      task=cfg.get("data", {}).get("task", meta_first.get("task", "?")),
      layers=layers, heads=heads, max_length=L, papa_layout=layout,
      fractions=fractions, counts=schedule.static_head_counts(layers * heads, fractions),
      mixing_maps=[[n, collect.MIXING_LABELS[n]] for n in names],
      quantization=QUANTIZATION, warnings=warnings, workdir=storage.display(workdir),
      created=datetime.datetime.now().isoformat(timespec="seconds"))
  meta["short_model"] = convert.short_name(meta["model"])  # Titles and export file names.
  means_out = {}
  for variant, m in means.items():
    rec = pack.packed_matrices(m.avgs)
    rec["meta"] = {k: m.metadata.get(k) for k in ("num_examples", "split", "attention", "task")}
    means_out[variant] = rec
  return dict(meta=meta, means=means_out, ranking=ranking, orderings=collect.orderings_view(wd),
              results=collect.results_view(wd),
              heads=collect.heads_view(wd), tokens=collect.token_maps_view(wd),
              examples=records)


def render(data: dict[str, Any]) -> str:
  """The HTML page with `data`, the CSS and the JS inlined."""
  text = json.dumps(data, separators=(",", ":"), allow_nan=False)
  # JSON has '<' only inside strings, where \u003c reads the same: no '</script>'.
  text = text.replace("<", "\\u003c")
  js = "\n".join(_static(n) for n in ("draw.js", "explorer.js"))
  if "</script" in js.lower():
    raise ValueError("The explorer's JS must not contain '</script'.")  # internal check
  parts = dict(CSS=_static("explorer.css"), JS=js, DATA=text,
               TITLE=f"PAPA explorer: {data['meta']['model']} / {data['meta']['task']}"
               .replace("&", "&amp;").replace("<", "&lt;"))
  # One pass, so that nothing inserted is scanned for placeholders again.
  return re.sub(r"\{\{(CSS|JS|DATA|TITLE)\}\}", lambda m: parts[m.group(1)],
                _static("explorer.html"))


def write_explorer(workdir: str, *, examples: Sequence[int] = ExplorerConfig.examples,
                   max_examples: int = ExplorerConfig.max_examples, path: str | None = None,
                   model=None, mixing: Sequence[str] = ExplorerConfig.mixing,
                   figures: Sequence[str] = ExplorerConfig.figures) -> str:
  """Writes a self-contained `explorer.html` of a finished workdir.

  The page opens from the file system (no server, no network) and shows the
  constant matrices, the head ranking with the schedule, the PAPA curves, a
  few dev examples' attention of the selected head (input-dependent, constant
  masked, effective), their per-layer context-mixing maps (`mixing`), and the
  effective and mixing stages' per-head statistics when the workdir has them.
  Matrices are 8-bit with a per-matrix scale: a decoded value is within max/510
  (non-negative matrices) or max|a|/254 (effective attention) of the stored
  one, max being its matrix's largest magnitude.

  Args:
    workdir: a workdir with at least `config.json` and `means/means_raw.npz`.
    examples: dev indices (the whole validation split, file order) to show.
    max_examples: examples stored in all; `examples` are padded with the
      following dev indices up to this many; <= 0: just `examples`. With
      `examples=()` and `max_examples <= 0` the model is not loaded.
    path: output file; default `workdir/explorer.html`.
    model: a `convert.Pretrained` to run on the examples instead of loading
      the workdir's `model.name`.
    mixing: per-layer context-mixing maps of the examples (`ExplorerConfig.mixing`);
      () = none; skipped with a warning unless the model computes in float32.
    figures: formats (`export.FORMATS`) of the panels written as files beside the page
      (`export.write_figures`, `<page stem>_figures/`); () = none.

  Returns:
    The path written.
  """
  path = path or os.path.join(workdir, ExplorerConfig.output)
  figures = export.figure_formats(figures)  # A bad value fails before any work.
  data = payload(workdir, examples=examples, max_examples=max_examples, model=model,
                 mixing=mixing)
  html = render(data)
  with storage.atomic_write(path, "w", encoding="utf-8") as f:
    f.write(html)
  logging.info("explorer: wrote %s (%.2f MB).", path, len(html.encode()) / 1e6)
  if figures:
    export.write_figures(data, path, figures)
  return path
