"""One record for every per-head result, one writer, and one agreement table.

A `HeadMap` is a `[layers, heads]` (or `[layers, heads, columns]`) array a stage computed over
some examples of a split, with what a reader needs to show it: a label, the subset of examples
it averages over, a unit, and what a higher value says of the head (`higher`: "more important",
"less important", or "" when the value is no importance score). Every per-head stage writes its
maps with `write` (`<stage>/stats.json` and `stats.csv`); `reader.FinishedWorkdir.head_maps`
returns every map in a workdir, PAPA's gates and the scored head orderings included, and the
explorer, the report and `agreement` iterate over them: a new per-head analysis needs no code of
its own there.

`stats.json` keeps each array under a flat key (`name`, or `name/subset`) and lists the maps
under `head_maps` (the array's key, label, subset, columns, unit, higher, examples, split).

A `TokenMap` is the per-position sibling: for each of some examples, a `[rows, tokens]` array
(rows: layers, usually) with the example's word pieces, e.g. a patching effect per layer and
position of each pair. A stage passes them to `write` (`token_maps` in its stats.json); the
reader returns them (`FinishedWorkdir.token_maps`) and the explorer lists them by themselves.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Any, Mapping, Sequence

import numpy as np

from papa_jax.measures import rank_agreement
from papa_jax.workdir import rules as workdir
from papa_jax.workdir.layout import Layout

MORE, LESS = "more important", "less important"
HIGHER = (MORE, LESS, "")


@dataclasses.dataclass(frozen=True)
class HeadInfo:
  """How to show one statistic: declared by the stage that computes it."""

  label: str
  higher: str = ""  # MORE, LESS or "" (a description, not an importance score).
  unit: str = ""


@dataclasses.dataclass(frozen=True, eq=False)
class HeadMap:
  """A per-head result (see the module docstring)."""

  stage: str
  name: str
  values: np.ndarray  # [layers, heads] or [layers, heads, len(columns)].
  label: str = ""
  subset: str = ""  # The examples it averages over within the split ("" : all of them).
  columns: tuple[str, ...] = ()
  higher: str = ""
  unit: str = ""
  examples: int | None = None
  split: str = ""
  note: str = ""  # A caveat every reader shows with it (e.g. from a run that learned nothing).

  def __post_init__(self):
    if self.higher not in HIGHER:
      # internal check
      raise ValueError(f"HeadMap {self.key}: higher={self.higher!r}; use one of {HIGHER}.")

  @property
  def array_key(self) -> str:
    """The flat key of its array in the stage's stats.json."""
    return f"{self.name}/{self.subset}" if self.subset else self.name

  @property
  def key(self) -> str:
    """Unique within a workdir: `stage/name[/subset]`."""
    return f"{self.stage}/{self.array_key}"

  @property
  def title(self) -> str:
    """The label, with the subset when there is one, and the note."""
    label = self.label or self.name
    label = f"{label} ({self.subset} examples)" if self.subset else label
    return f"{label} [{self.note}]" if self.note else label

  def index(self) -> dict[str, Any]:
    """Its JSON description (everything but the values)."""
    return dict(array=self.array_key, name=self.name, label=self.label, subset=self.subset,
                columns=list(self.columns), higher=self.higher, unit=self.unit,
                examples=self.examples, split=self.split, note=self.note)

  def planes(self) -> list[HeadMap]:
    """Itself if `[layers, heads]`; else one `[layers, heads]` map per column."""
    if not self.columns:
      return [self]
    return [dataclasses.replace(self, name=f"{self.name}_{c}", values=self.values[..., i],
                                label=f"{self.label or self.name}: {c}", columns=())
            for i, c in enumerate(self.columns)]


@dataclasses.dataclass(frozen=True, eq=False)
class TokenMap:
  """A per-example, per-position result (see the module docstring): `examples[i]` holds its
  `title`, `tokens` (n word pieces) and `values` (`[len(rows), n]`)."""

  stage: str
  name: str
  label: str
  rows: tuple[str, ...]
  examples: tuple[dict, ...]
  unit: str = ""
  signed: bool = True  # Values of either sign around 0 (a diverging colour scale).
  note: str = ""

  def __post_init__(self):
    for i, ex in enumerate(self.examples):
      shape = np.shape(ex["values"])
      if shape != (len(self.rows), len(ex["tokens"])):
        # internal check
        raise ValueError(f"TokenMap {self.key}: example {i} has values of shape {shape} for "
                         f"{len(self.rows)} rows and {len(ex['tokens'])} tokens.")

  @property
  def key(self) -> str:
    return f"{self.stage}/{self.name}"

  def index(self) -> dict[str, Any]:
    """Its JSON form (values to 6 significant digits)."""
    return dict(name=self.name, label=self.label, rows=list(self.rows), unit=self.unit,
                signed=self.signed, note=self.note,
                examples=[dict(title=ex["title"], tokens=list(ex["tokens"]),
                               values=[[float(f"{v:.6g}") for v in row] for row in
                                       np.asarray(ex["values"], np.float64)])
                          for ex in self.examples])


def read_token_maps(stage: str, stats: Mapping[str, Any]) -> list[TokenMap]:
  """The `TokenMap`s of a stage's stats.json (none where it wrote none)."""
  return [TokenMap(stage, d["name"], d["label"], tuple(d["rows"]), tuple(
      dict(title=ex["title"], tokens=list(ex["tokens"]), values=np.asarray(ex["values"],
                                                                           np.float64))
      for ex in d["examples"]), d.get("unit", ""), bool(d.get("signed", True)),
      d.get("note", "")) for d in stats.get("token_maps", ())]


def maps_of(stage: str, infos: Mapping[str, HeadInfo], arrays: Mapping[str, Any], *,
            examples: Mapping[str, int | None] | int | None = None, split: str = "",
            columns: Sequence[str] = ()) -> list[HeadMap]:
  """`HeadMap`s of a stage's arrays (flat keys `name` or `name/subset`), labelled by `infos`
  (a name without an entry is labelled by itself); 3-D arrays get `columns`."""
  out = []
  for key, value in arrays.items():
    v = np.asarray(value, np.float64)
    if v.ndim < 2:
      continue
    name, _, subset = key.partition("/")
    info = infos.get(name, HeadInfo(name))
    n = examples.get(subset) if isinstance(examples, Mapping) else examples
    out.append(HeadMap(stage, name, v, info.label, subset,
                       tuple(columns) if v.ndim == 3 else (), info.higher, info.unit,
                       None if n is None else int(n), split))
  return out


def write(layout: Layout, stage: str, maps: Sequence[HeadMap], summary: dict, *,
          token_maps: Sequence[TokenMap] = (), **extra: Any) -> dict[str, str]:
  """A stage's `stats.json` (summary, provenance, `head_maps`, each array under its flat key,
  `token_maps` where given, and `extra`) and `stats.csv` (a row per head, and per subset when
  the maps have subsets)."""
  paths = dict(json=layout.stats(stage), csv=layout.stats_csv(stage))
  tokens = dict(token_maps=[m.index() for m in token_maps]) if token_maps else {}
  workdir.write_json(paths["json"], dict(
      summary=summary, **extra, **workdir.provenance(), head_maps=[m.index() for m in maps],
      **{m.array_key: m.values.tolist() for m in maps}, **tokens))
  with workdir.atomic_write(paths["csv"], newline="") as f:
    f.write(_csv(maps))
  return paths


def _csv(maps: Sequence[HeadMap]) -> str:
  if not maps:  # A stage with per-position results only.
    return ""
  subsets = list(dict.fromkeys(m.subset for m in maps))
  by_subset = [[m for m in maps if m.subset == s] for s in subsets]
  header = ["subset"] if subsets != [""] else []
  header += ["layer", "head"]
  for m in by_subset[0]:
    header += [f"{m.name}_{c}" for c in m.columns] if m.columns else [m.name]
  buf = io.StringIO()
  w = csv.writer(buf)
  w.writerow(header)
  layers = maps[0].values.shape[0]
  heads = max(m.values.shape[1] for m in maps)  # A per-layer map (one "head") leaves the rest
  for s, group in zip(subsets, by_subset):    # of its rows empty.
    for l in range(layers):
      for h in range(heads):
        row = ([s] if header[0] == "subset" else []) + [l, h]
        for m in group:
          row += ([f"{x:.6g}" for x in np.atleast_1d(m.values[l, h])]
                  if h < m.values.shape[1] else [""] * max(len(m.columns), 1))
        w.writerow(row)
  return buf.getvalue()


def read(stage: str, stats: Mapping[str, Any]) -> list[HeadMap]:
  """The maps of a stage's stats.json (one written before `head_maps`: every array of two or
  more dimensions, labelled by its key)."""
  if "head_maps" in stats:
    return [HeadMap(stage, d["name"], np.asarray(stats[d["array"]], np.float64), d["label"],
                    d["subset"], tuple(d["columns"]), d["higher"], d["unit"], d["examples"],
                    d["split"], d.get("note", "")) for d in stats["head_maps"]]
  summary = stats.get("summary", {})
  counts = {k.partition("/")[2]: v for k, v in stats.items() if k.startswith("count")}
  arrays = {k: v for k, v in stats.items() if isinstance(v, list) and k not in (
      "columns", "categories")}
  return maps_of(stage, {}, arrays, examples=counts or summary.get("examples"),
                 split=summary.get("split", ""),
                 columns=stats.get("categories") or stats.get("columns") or ())


def scores(maps: Sequence[HeadMap]) -> list[HeadMap]:
  """The maps that score heads' importance (`higher` set), `[layers, heads]` only."""
  return [m for m in maps if m.higher and not m.columns]


def agreement(measures: Sequence[HeadMap], others: Sequence[HeadMap], *, n_perm: int = 2000,
              seed: int = 0) -> list[dict]:
  """Spearman agreement of each `[layers, heads]` measure with each other map (importance
  scores, usually): rho, scipy's p-value, a permutation p-value shuffling heads within layers
  (depth alone drives most head scores) and Holm's adjustment of that over the whole table.
  Rows name both maps by key and title; a map is not compared with itself (nor a pair twice),
  and maps with columns (one value per class, say) are left out. rho > 0: heads high on the
  measure are high on the other map (`score_higher` says whether that means more important)."""
  rows, seen = [], set()
  for m in measures:
    for o in others:
      pair = frozenset((m.key, o.key))
      if (o.key == m.key or pair in seen or m.columns or o.columns
          or o.values.shape != m.values.shape):
        continue
      seen.add(pair)
      r = rank_agreement.head_rank_agreement(m.values, o.values, n_perm=n_perm, seed=seed)
      rows.append(dict(measure=m.key, measure_label=m.title, score=o.key, score_label=o.title,
                       score_higher=o.higher, **r))
  for row, p in zip(rows, rank_agreement.holm([r["p_within_layers"] for r in rows])):
    row["p_holm"] = p
  return rows


def workdir_agreement(maps: Sequence[HeadMap], **kwargs: Any) -> list[dict]:
  """The agreement table of a workdir: every map against every importance score."""
  return agreement(maps, scores(maps), **kwargs)


def _fmt(v) -> str:
  return "" if v is None else f"{v:.4g}"


def agreement_markdown(rows: Sequence[dict]) -> str:
  """The agreement rows as a markdown table (undefined cells empty)."""
  lines = ["| measure | head score | Spearman rho | p | p (within layers) | p (Holm) | heads |",
           "|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['measure']} | {r['score']} | {_fmt(r['rho'])} | {_fmt(r['p_value'])} | "
                 f"{_fmt(r['p_within_layers'])} | {_fmt(r['p_holm'])} | {r['heads']} |")
  return "\n".join(lines) + "\n"
