"""What the explorer shows, from a finished workdir (`reader`) and the model, for examples."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
from absl import logging

from papa_jax import api
from papa_jax import data as data_lib
from papa_jax import head_maps, reader, results
from papa_jax.measures import effective, mixing_methods
from papa_jax.explorer import pack
from papa_jax.models.encoder import Capture
from papa_jax.errors import ConfigError

# What each per-layer context-mixing map of an example is (`explore.mixing`; all heads): the
# registry's (papa_jax/measures/mixing_methods.py), rollouts too.
MIXING_LABELS = mixing_methods.LABELS


@jax.jit
def _effective(a: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """One layer's effective attention (jitted: every layer reuses one compilation)."""
  key_mask = jnp.broadcast_to(mask[:, None, :], a.shape[:-1])
  return effective.effective_attention(a, v, key_mask)[0]


# Effective attention within this of the dynamic one (far below the 8-bit
# step) is stored as "same as dynamic".
SAME_ATOL = 1e-5


def ranking_view(wd: reader.FinishedWorkdir) -> dict | None:
  """Gate logits and the ranking (least input-dependent first), if sorted."""
  if wd.ranking is None:
    return None
  return dict(order=wd.ranking, lambdas=pack.finite_or_none(wd.lambdas))


def orderings_view(wd: reader.FinishedWorkdir) -> list[dict]:
  """Every head ordering, PAPA's first: each head's 1-based position, and the Spearman
  correlation of the positions with PAPA's (none without PAPA's ranking)."""
  rankings = wd.rankings
  out, ref = [], None
  for name, order in rankings.items():
    order = np.asarray(order)
    layers, heads = int(order[:, 0].max()) + 1, int(order[:, 1].max()) + 1
    pos = np.zeros((layers, heads), int)
    pos[order[:, 0], order[:, 1]] = np.arange(1, len(order) + 1)
    row = dict(name=name, positions=pos.tolist(),
               direction=wd.orderings.get(name, {}).get("direction", "ascending"))
    if name == "lambda":
      ref = pos.ravel()
    elif ref is not None:
      r = scipy.stats.spearmanr(ref, pos.ravel())
      row.update(spearman=float(r.statistic), p_value=float(r.pvalue))
    out.append(row)
  return out if len(out) > 1 else []


def results_view(wd: reader.FinishedWorkdir) -> dict | None:
  """Score vs static heads per variant (mean over probe seeds, with the sample
  std as `score_std` when there are several), if probed."""
  raw = wd.rows
  if not raw:
    return None
  if len({(r["variant"], r["static_heads"]) for r in raw}) == len(raw):  # One row per run.
    keep = ("variant", "static_heads", "total_heads", "fraction", "metric", "score",
            "score_std", "band_low", "band_high", "examples", "eval_examples")
    return dict(rows=pack.finite_or_none([{k: r[k] for k in keep if k in r} for r in raw]))
  rows = []
  raw = [dict(r, model=r.get("model", ""), task=r.get("task", ""),
              best_score=r.get("best_score", r["score"]), seconds=r.get("seconds", 0.0))
         for r in raw]
  for (_, _, variant, k), r in results.by_run(raw).items():
    row = dict(variant=variant, static_heads=k, total_heads=r["total_heads"],
               fraction=r["fraction"], metric=r["metric"], score=r["mean"], n_seeds=r["n"],
               examples=raw[0].get("examples"), eval_examples=raw[0].get("eval_examples"))
    if r["std"] is not None:
      row.update(score_std=r["std"], band_low=r["mean"] - r["std"],
                 band_high=r["mean"] + r["std"])
    rows.append(row)
  return dict(rows=pack.finite_or_none(rows))


def heads_view(wd: reader.FinishedWorkdir) -> dict:
  """Every per-head result of the workdir (`FinishedWorkdir.head_maps`; a map with columns
  becomes one map per column) and the workdir's agreement table (`head_maps`)."""
  maps = wd.head_maps
  out = [dict(key=p.key, stage=p.stage, name=p.name, label=p.label or p.name,
              subset=p.subset, higher=p.higher, unit=p.unit, examples=p.examples,
              split=p.split, note=p.note, values=pack.finite_or_none(p.values))
         for m in maps for p in m.planes()]
  return dict(maps=out, agreement=pack.finite_or_none(head_maps.workdir_agreement(maps)))


def token_maps_view(wd: reader.FinishedWorkdir) -> list[dict]:
  """Every per-position result of the workdir (`FinishedWorkdir.token_maps`): per map its key,
  label, unit, row names and, per example, title, word pieces and `[rows, tokens]` values."""
  return [dict(key=m.key, stage=m.stage, name=m.name, label=m.label, unit=m.unit,
               signed=m.signed, note=m.note, rows=list(m.rows),
               examples=[dict(title=ex["title"], tokens=list(ex["tokens"]),
                              values=pack.finite_or_none(np.asarray(ex["values"]).tolist()))
                         for ex in m.examples]) for m in wd.token_maps]


def mixing_maps(model, data, names: Sequence[str], batch_size: int = 8) -> dict[str, np.ndarray]:
  """The per-layer context-mixing maps `names` (`MIXING_LABELS`) of `data` by
  `api.context_mixing`: `{name: [B, layers, L, L] float32}`, pad rows and columns 0."""
  if not names:
    return {}
  bad = sorted(set(names) - set(MIXING_LABELS))
  if bad:
    raise ConfigError(f"Unknown context-mixing maps {bad}; choose from {tuple(MIXING_LABELS)}.")
  rolled = [n for n in names if n.endswith(mixing_methods.ROLLOUT)]
  base = tuple(dict.fromkeys(n.removesuffix(mixing_methods.ROLLOUT) if n in rolled else n
                             for n in names))
  maps = api.context_mixing(model, data, base, batch_size=max(1, min(batch_size, len(data))),
                            rollout=bool(rolled))
  return {n: maps[n] for n in names}


def example_indices(examples: Sequence[int], max_examples: int, available: int) -> list[int]:
  """`examples` first, then the following dev indices, up to `max_examples` in all.

  `max_examples <= 0` keeps exactly `examples`.
  """
  chosen = [int(i) for i in examples]
  bad = [i for i in chosen if not 0 <= i < available]
  if bad:
    raise ConfigError(f"explore.examples {bad} outside the {available} dev examples.")
  if max_examples > 0 and len(chosen) > max_examples:
    raise ConfigError(f"explore.examples lists {len(chosen)} indices but "
                     f"explore.max_examples={max_examples}.")
  if len(set(chosen)) != len(chosen):
    raise ConfigError(f"explore.examples {chosen} repeats an index.")
  want = max(max_examples, len(chosen))
  i = 0
  while len(chosen) < want and i < available:
    if i not in chosen:
      chosen.append(i)
    i += 1
  return chosen


def example_records(model, data_cfg, examples: Sequence[int], max_examples: int,
                    mixing: Sequence[str] = ()) -> list[dict]:
  """Per example: word pieces, positions, every head's dynamic and effective block, and
  every layer's block of the context-mixing maps `mixing` (`mixing_maps`).

  Runs `model` on the chosen dev examples (the workdir's layout and length) and
  keeps only the n x n block of each example's real tokens.
  """
  tokenizer = model.tokenizer()
  dev = data_lib.load_split(data_cfg, "validation", tokenizer, model.config.type_vocab_size)
  chosen = example_indices(examples, max_examples, len(dev))
  if not chosen:
    return []
  sub = dev.take(np.asarray(chosen))
  out = model.apply(jnp.asarray(sub.input_ids), jnp.asarray(sub.attention_mask),
                    token_type_ids=jnp.asarray(sub.token_type_ids),
                    capture=Capture(probs=True, values=True))
  mask = jnp.asarray(sub.attention_mask, bool)
  dyn, eff = [], []
  for a, v in zip(out.attentions, out.values):
    dyn.append(np.asarray(a, np.float32))
    eff.append(np.asarray(_effective(a, v, mask), np.float32))
  dyn, eff = np.stack(dyn, 1), np.stack(eff, 1)  # [B, layers, H, L, L]
  mix = mixing_maps(model, sub, mixing)  # {name: [B, layers, L, L]}
  records = []
  for b, index in enumerate(chosen):
    pos = np.flatnonzero(sub.attention_mask[b])
    ids = sub.input_ids[b, pos]
    block = np.ix_(pos, pos)
    # Softmax rows are non-negative; tiny negative float noise would force signed codes.
    d = np.maximum(dyn[b][..., block[0], block[1]], 0.0)
    e = eff[b][..., block[0], block[1]]
    label = sub.labels[b]
    # With no more real tokens than the head dimension the values span every
    # key, so A_eff = A: store it once (the page reuses the dynamic block).
    same = bool(np.abs(e - d).max() <= SAME_ATOL)
    records.append(dict(
        index=int(index), positions=pos.tolist(),
        tokens=tokenizer.convert_ids_to_tokens(ids.tolist()),
        text=tokenizer.decode(ids.tolist(), skip_special_tokens=True),
        label=pack.finite_or_none(label.tolist() if label.ndim == 0 else None),
        dynamic=pack.packed_matrices(d, signed=False),
        effective=None if same else pack.packed_matrices(e, signed=True),
        mixing={k: pack.packed_matrices(np.maximum(v[b][:, block[0], block[1]], 0.0),
                                        signed=False) for k, v in mix.items()}))
  logging.info("explorer: %d dev examples (%s).", len(records), chosen)
  return records
