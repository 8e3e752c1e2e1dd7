"""The `effective` stage: raw vs effective attention over a dataset split.

Writes under `workdir/effective/`: `stats.json` (per layer x head arrays and a
summary), `stats.csv` (one row per head), `mass_heatmaps.png`,
`agreement_heatmaps.png` and `example_attention.png`.
"""

from __future__ import annotations

import csv
import io
import os

import numpy as np
from absl import logging

from papa_jax import parallel, workdir
from papa_jax.analysis import effective, figures, stats


def _pick_example(mask: np.ndarray, head_dim: int, index: int) -> int:
  """The `index`-th example longer than the head dimension (else the longest)."""
  long = np.flatnonzero(mask.sum(1) > head_dim)
  if len(long):
    return int(long[min(index, len(long) - 1)])
  return int(mask.sum(1).argmax())


def _stats_csv(st: dict, num_layers: int, num_heads: int) -> str:
  out = io.StringIO()
  w = csv.writer(out)
  cols = [f"mass_{k}_{c}" for k in ("raw", "eff") for c in stats.CATEGORIES]
  w.writerow(["subset", "layer", "head"] + cols + ["js", "corr", "null_ratio", "rank"])
  for sub in ("all", "long"):
    for l in range(num_layers):
      for h in range(num_heads):
        mass = np.concatenate([st[f"mass_raw/{sub}"][l, h], st[f"mass_eff/{sub}"][l, h]])
        w.writerow([sub, l, h] + [f"{x:.6g}" for x in mass] + [
            f"{st[f'{k}/{sub}'][l, h]:.6g}" for k in ("js", "corr", "null_ratio", "rank")])
  return out.getvalue()


def run(setup) -> dict:
  """The `effective` stage on a `run.Setup` (its split: `setup.effective_data`)."""
  config, e, mc = setup.config, setup.config.effective, setup.model.config
  data = setup.effective_data
  arrays = dict(data.arrays(), categories=stats.category_ids(
      data.input_ids, data.attention_mask, setup.tokenizer))
  rtol = e.rtol if e.rtol > 0 else None
  fn = parallel.sharded_sum(stats.make_batch_stats(mc, rtol), setup.mesh)
  params = parallel.put_replicated(setup.model.params, setup.mesh)
  sums: dict[str, np.ndarray] = {}
  for _, out, _ in parallel.map_batches(lambda b: fn(params, b), arrays,
                                        batch_size=config.run.batch_size, mesh=setup.mesh,
                                        desc="effective", every=10):
    for k, v in out.items():
      sums[k] = sums.get(k, 0.0) + np.asarray(v, np.float64)
  st = stats.finalize(sums)
  n_all, n_long = st["count/all"], st["count/long"]
  summary = dict(model=config.model.name, task=setup.task.name, split=e.split,
                 examples=int(n_all), long_examples=int(n_long), head_dim=mc.dim_per_head,
                 fraction_longer_than_head_dim=n_long / n_all if n_all else 0.0,
                 max_length=config.data.max_length, papa_layout=config.data.papa_layout)
  subset = "long" if n_long else "all"
  for k in ("js", "corr", "null_ratio"):
    summary[f"mean_{k}_{subset}"] = float(np.nanmean(st[f"{k}/{subset}"]))
  for c, name in enumerate(stats.CATEGORIES):
    for kind in ("raw", "eff"):
      summary[f"mean_mass_{kind}_{name}_{subset}"] = float(
          np.nanmean(st[f"mass_{kind}/{subset}"][..., c]))
  if not parallel.is_main_process():
    return summary
  out_dir = setup.path("effective")
  workdir.write_json(os.path.join(out_dir, "stats.json"), dict(
      summary=summary, categories=list(stats.CATEGORIES), **workdir.provenance(),
      **{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in st.items()}))
  with workdir.atomic_write(os.path.join(out_dir, "stats.csv"), newline="") as f:
    f.write(_stats_csv(st, mc.num_layers, mc.num_heads))
  label = (f"{config.model.name} / {setup.task.name} {e.split} "
           f"({subset}: {int(st['count/' + subset])} examples)")
  figures.mass_heatmaps(st[f"mass_raw/{subset}"], st[f"mass_eff/{subset}"],
                        os.path.join(out_dir, "mass_heatmaps.png"), label)
  figures.agreement_heatmaps({k: st[f"{k}/{subset}"] for k in ("js", "corr", "null_ratio")},
                             os.path.join(out_dir, "agreement_heatmaps.png"), label)
  _example_figure(setup.model, setup.tokenizer, data, st, subset, e,
                  os.path.join(out_dir, "example_attention.png"))
  logging.info("effective: %d examples (%d longer than head dim %d) -> %s", n_all, n_long,
               mc.dim_per_head, out_dir)
  return summary


def _example_figure(model, tokenizer, data, st, subset, e, path: str) -> None:
  mc = model.config
  i = _pick_example(data.attention_mask, mc.dim_per_head, e.example_index)
  layer, head = e.figure_layer, e.figure_head
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
                    token_type_ids=data.token_type_ids[i:i + 1], capture_attention=True,
                    capture_values=True)
  a, v = out.attentions[layer][0, head], out.values[layer][0, head]
  a_eff, _ = effective.effective_attention(a[None], v[None], keep[None])
  a = np.asarray(a)[np.ix_(keep, keep)]
  a_eff = np.asarray(a_eff[0])[np.ix_(keep, keep)]
  tokens = tokenizer.convert_ids_to_tokens(data.input_ids[i][keep].tolist())
  figures.attention_maps(a, a_eff, tokens, path,
                         f"{model.config.name}: layer {layer}, head {head}, {n} tokens "
                         f"(head dim {mc.dim_per_head})")
