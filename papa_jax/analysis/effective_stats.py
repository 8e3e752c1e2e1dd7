"""Raw vs effective attention statistics per (layer, head), summed over a split.

For each example, layer and head, averaged over the example's real query rows:
  * mass on each token category (CLS, SEP, punctuation, other) for raw and
    effective attention (effective mass is signed, as in the reference code);
  * Jensen-Shannon divergence between a raw row and the effective row clipped
    at zero and renormalised (effective attention is not a distribution:
    rows whose clipped mass is zero are skipped);
  * over the example's real block: Pearson correlation of A and A_eff, the
    relative null norm ||A - A_eff||_F / ||A||_F, and the numerical rank.
Every statistic is averaged by the analysis runner twice: over all examples
and over the "long" examples whose real length exceeds the head dimension
(the only ones where A_eff != A). The `effective` stage writes under
`workdir/effective/`: `stats.json` (per layer x head arrays `<stat>/<subset>`,
`count/<subset>` and a summary), `stats.csv` (one row per subset and head),
`mass_heatmaps.png`, `agreement_heatmaps.png` and `example_attention.png`.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from papa_jax import convert, head_maps, runner
from papa_jax.measures import effective
from papa_jax.analysis import figures, per_head
from papa_jax.models.encoder import Capture
from papa_jax.stage import Setup

CATEGORIES = ("cls", "sep", "punct", "other")
PAD = -1
PER_HEAD = ("mass_raw", "mass_eff", "js", "corr", "null_ratio", "rank")
INFOS = dict(
    mass_raw=head_maps.HeadInfo("raw attention mass on"),
    mass_eff=head_maps.HeadInfo("effective attention mass on"),
    js=head_maps.HeadInfo("JS divergence raw vs effective", unit="nats"),
    corr=head_maps.HeadInfo("corr(A, A_eff)"),
    null_ratio=head_maps.HeadInfo("null ratio ||A - A_eff|| / ||A||"),
    rank=head_maps.HeadInfo("rank of the values"))


def is_punctuation(token: str) -> bool:
  core = token.lstrip("#").lstrip("Ġ▁")
  return bool(core) and all(unicodedata.category(ch).startswith("P") for ch in core)


def category_ids(input_ids: np.ndarray, mask: np.ndarray, tokenizer) -> np.ndarray:
  """Per token: 0 CLS, 1 SEP, 2 punctuation, 3 other, -1 padding."""
  vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
  punct = np.array([is_punctuation(t or "") for t in vocab])
  cat = np.full(input_ids.shape, 3, np.int32)
  cat[punct[input_ids]] = 2
  cat[input_ids == tokenizer.sep_token_id] = 1
  cat[input_ids == tokenizer.cls_token_id] = 0
  cat[mask == 0] = PAD
  return cat


def js_divergence(p, q):
  """Jensen-Shannon divergence (natural log) of rows `p` and `q` over the last axis."""
  m = 0.5 * (p + q)
  kl = lambda a: jnp.sum(jnp.where(a > 0, a * (jnp.log(jnp.where(a > 0, a, 1.0))
                                              - jnp.log(jnp.where(m > 0, m, 1.0))), 0.0), -1)
  return 0.5 * kl(p) + 0.5 * kl(q)


def head_stats(A, E, mask, cat, rank):
  """Per-example statistics `[B, H, ...]` for one layer."""
  m = mask.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m, -1), 1.0)  # [B]
  onehot = jax.nn.one_hot(cat, len(CATEGORIES))  # [B, L, C]; padding is all-zero.
  qm = m[:, None, :, None]

  def mass(X):
    per_row = jnp.einsum("bhqk,bkc->bhqc", X, onehot)
    return jnp.sum(per_row * qm, 2) / n[:, None, None]

  pos = jnp.maximum(E, 0.0) * m[:, None, None, :]
  total = jnp.sum(pos, -1, keepdims=True)
  q = pos / jnp.where(total > 0, total, 1.0)
  p = A * m[:, None, None, :]
  rows = (total[..., 0] > 0) & (m[:, None, :] > 0)
  js = jnp.sum(jnp.where(rows, js_divergence(p, q), 0.0), -1) / jnp.maximum(jnp.sum(rows, -1), 1)
  block = (m[:, None, :, None] * m[:, None, None, :])
  cnt = jnp.maximum(jnp.sum(block, (-1, -2)), 1.0)  # Padding examples: no 0/0.
  mean_a = jnp.sum(A * block, (-1, -2)) / cnt
  mean_e = jnp.sum(E * block, (-1, -2)) / cnt
  da, de = (A - mean_a[..., None, None]) * block, (E - mean_e[..., None, None]) * block
  corr = jnp.sum(da * de, (-1, -2)) / jnp.sqrt(jnp.maximum(
      jnp.sum(da * da, (-1, -2)) * jnp.sum(de * de, (-1, -2)), 1e-30))
  null = jnp.sqrt(jnp.sum(((A - E) * block) ** 2, (-1, -2))) / jnp.sqrt(
      jnp.maximum(jnp.sum((A * block) ** 2, (-1, -2)), 1e-30))
  return dict(mass_raw=mass(A * block), mass_eff=mass(E), js=js, corr=corr, null_ratio=null,
              rank=rank.astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class EffectiveStats(per_head.PerHeadAnalysis):
  """Raw vs effective attention per head, over all and over long examples."""

  head_dim: int
  rtol: float | None = None
  name: ClassVar[str] = "effective"
  capture: ClassVar[Capture] = Capture(probs=True, values=True)

  @classmethod
  def from_setup(cls, setup: Setup) -> EffectiveStats:
    rtol = setup.config.effective.rtol
    return cls(setup.model.config.dim_per_head, rtol if rtol > 0 else None)

  def arrays(self, setup: Setup, data) -> dict[str, np.ndarray]:
    return dict(categories=category_ids(data.input_ids, data.attention_mask, setup.tokenizer))

  def stats(self, outs, batch, mask, params) -> dict[str, runner.Weighted]:
    del params
    out = outs[0]
    every = jnp.ones(mask.shape[:1], jnp.float32)
    long = (jnp.sum(mask, -1) > self.head_dim).astype(jnp.float32)
    per_layer = {k: [] for k in PER_HEAD}
    for a, v in zip(out.attentions, out.values):
      key_mask = jnp.broadcast_to(mask[:, None, :] > 0, a.shape[:-1])
      e, info = effective.effective_attention(a, v, key_mask, rtol=self.rtol)
      for k, x in head_stats(a, e, mask, batch["categories"], info.rank).items():
        per_layer[k].append(x)
    return {f"{k}/{subset}": runner.Weighted(tuple(xs), w) for k, xs in per_layer.items()
            for subset, w in (("all", every), ("long", long))}

  def finalize(self, totals: runner.Totals) -> dict:
    st = totals.means()
    for subset in ("all", "long"):
      st[f"count/{subset}"] = float(totals.weights[f"js/{subset}"])
    return st

  def summary(self, st: dict, setup: Setup, data) -> dict:
    n_all, n_long = st["count/all"], st["count/long"]
    out = dict(examples=int(n_all), long_examples=int(n_long), head_dim=self.head_dim,
               fraction_longer_than_head_dim=n_long / n_all if n_all else 0.0,
               max_length=setup.config.data.max_length,
               papa_layout=setup.config.data.papa_layout)
    subset = "long" if n_long else "all"
    for k in ("js", "corr", "null_ratio"):
      out[f"mean_{k}_{subset}"] = float(np.nanmean(st[f"{k}/{subset}"]))
    for c, name in enumerate(CATEGORIES):
      for kind in ("raw", "eff"):
        out[f"mean_mass_{kind}_{name}_{subset}"] = float(
            np.nanmean(st[f"mass_{kind}/{subset}"][..., c]))
    return out

  def head_maps(self, st: dict, summary: dict) -> list[head_maps.HeadMap]:
    arrays = {f"{k}/{s}": st[f"{k}/{s}"] for s in ("all", "long") for k in PER_HEAD}
    return head_maps.maps_of(self.name, INFOS, arrays, split=summary["split"],
                             examples={s: st[f"count/{s}"] for s in ("all", "long")},
                             columns=CATEGORIES)

  def write(self, st: dict, summary: dict, setup: Setup, data) -> None:
    mc, layout = setup.model.config, setup.layout
    head_maps.write(layout, self.name, self.head_maps(st, summary), summary,
                    categories=list(CATEGORIES),
                    **{f"count/{s}": st[f"count/{s}"] for s in ("all", "long")})
    subset = "long" if st["count/long"] else "all"
    label = per_head.label(setup, f"{subset} examples", int(st["count/" + subset]))
    figures.mass_heatmaps(st[f"mass_raw/{subset}"], st[f"mass_eff/{subset}"], CATEGORIES,
                          layout.figure(self.name, "mass_heatmaps.png"), label)
    figures.agreement_heatmaps({k: st[f"{k}/{subset}"] for k in ("js", "corr", "null_ratio")},
                               layout.figure(self.name, "agreement_heatmaps.png"), label)
    _example_figure(setup, data, st, subset, layout.figure(self.name, "example_attention.png"))
    logging.info("effective: %d examples (%d longer than head dim %d) -> %s",
                 st["count/all"], st["count/long"], mc.dim_per_head, layout.stage_dir(self.name))


def _pick_example(mask: np.ndarray, head_dim: int, index: int) -> int:
  """The `index`-th example longer than the head dimension (else the longest)."""
  long = np.flatnonzero(mask.sum(1) > head_dim)
  if len(long):
    return int(long[min(index, len(long) - 1)])
  return int(mask.sum(1).argmax())


def _example_figure(setup: Setup, data, st: dict, subset: str, path: str) -> None:
  """One example's attention, raw beside effective, for the head of `config.figures`."""
  model, f = setup.model, setup.config.figures
  mc = model.config
  i = _pick_example(data.attention_mask, mc.dim_per_head, f.example_index)
  layer, head = f.layer, f.head
  if layer < 0 or head < 0:
    null = np.nan_to_num(st[f"null_ratio/{subset}"], nan=-1.0)
    if layer >= 0:
      head = int(null[layer].argmax())
    elif head >= 0:
      layer = int(null[:, head].argmax())
    else:
      layer, head = map(int, np.unravel_index(null.argmax(), null.shape))
  n = int(data.attention_mask[i].sum())
  keep = data.attention_mask[i].astype(bool)
  out = model.apply(data.input_ids[i:i + 1], data.attention_mask[i:i + 1],
                    token_type_ids=data.token_type_ids[i:i + 1],
                    capture=Capture(probs=True, values=True))
  a, v = out.attentions[layer][0, head], out.values[layer][0, head]
  a_eff, _ = effective.effective_attention(a[None], v[None], keep[None])
  a = np.asarray(a)[np.ix_(keep, keep)]
  a_eff = np.asarray(a_eff[0])[np.ix_(keep, keep)]
  tokens = setup.tokenizer.convert_ids_to_tokens(data.input_ids[i][keep].tolist())
  figures.attention_maps(a, a_eff, tokens, path,
                         f"{convert.short_name(setup.config.model.name)} / {setup.task.name}: "
                         f"layer {layer}, head {head}, {n} tokens (head dim {mc.dim_per_head})")


STAGE = per_head.stage(EffectiveStats)
