"""The `effective` stage: raw vs effective attention over a dataset split.

Writes under `workdir/effective/`: `stats.json` (per layer x head arrays and a
summary), `stats.csv` (one row per head), `mass_heatmaps.png`,
`agreement_heatmaps.png` and `example_attention.png`.
"""

from __future__ import annotations

import csv
import os

import jax
import numpy as np
from absl import logging

from papa_jax import convert, parallel, results
from papa_jax import data as data_lib
from papa_jax.analysis import effective, figures, stats
from papa_jax.data import pipeline
from papa_jax.progress import Progress


def _pick_example(mask: np.ndarray, head_dim: int, index: int) -> int:
  """The `index`-th example longer than the head dimension (else the longest)."""
  long = np.flatnonzero(mask.sum(1) > head_dim)
  if len(long):
    return int(long[min(index, len(long) - 1)])
  return int(mask.sum(1).argmax())


def run(config, workdir: str) -> dict:
  e = config.effective
  task = data_lib.get_task(config.data.task)
  data_lib.check_files(config.data, (e.split,))
  model = convert.load_pretrained(config.model.name)
  mc = model.config
  if config.data.max_length > mc.max_length:
    raise ValueError(f"data.max_length={config.data.max_length} exceeds the model's "
                     f"{mc.max_length} positions.")
  for name, v, hi in (("effective.figure_layer", e.figure_layer, mc.num_layers),
                      ("effective.figure_head", e.figure_head, mc.num_heads)):
    if not -1 <= v < hi:
      raise ValueError(f"{name}={v} does not exist in this model ({hi} of them; -1 picks "
                       "the head with the largest null part).")
  tokenizer = model.tokenizer()
  mesh = parallel.make_mesh(config.mesh.num_devices)
  parallel.check_batch_size(e.batch_size, mesh, "effective.batch_size")
  data = data_lib.load_split(config.data, e.split, tokenizer, mc.type_vocab_size, e.max_examples)
  if e.min_valid_tokens > 0:
    data = data.take(np.flatnonzero(data.attention_mask.sum(1) > e.min_valid_tokens))
    if not len(data):
      raise ValueError(f"No {e.split} example has more than {e.min_valid_tokens} tokens.")
  arrays = dict(data.arrays(), categories=stats.category_ids(data.input_ids,
                                                             data.attention_mask, tokenizer))
  rtol = e.rtol if e.rtol > 0 else None
  fn = parallel.sharded_sum(stats.make_batch_stats(mc, rtol), mesh)
  params = parallel.put_replicated(model.params, mesh)
  sums: dict[str, np.ndarray] = {}
  prog = Progress("effective", len(data), every=10)
  for batch in pipeline.batches(arrays, e.batch_size):
    out = jax.device_get(fn(params, parallel.put_batch(batch, mesh)))
    for k, v in out.items():
      sums[k] = sums.get(k, 0.0) + np.asarray(v, np.float64)
    prog.update(int(batch["valid"].sum()))
  st = stats.finalize(sums)

  out_dir = os.path.join(workdir, "effective")
  os.makedirs(out_dir, exist_ok=True)
  n_all, n_long = st["count/all"], st["count/long"]
  summary = dict(model=config.model.name, task=task.name, split=e.split, examples=int(n_all),
                 long_examples=int(n_long), head_dim=mc.dim_per_head,
                 fraction_longer_than_head_dim=n_long / n_all if n_all else 0.0,
                 max_length=config.data.max_length, papa_layout=config.data.papa_layout)
  subset = "long" if n_long else "all"
  for k in ("js", "corr", "null_ratio"):
    summary[f"mean_{k}_{subset}"] = float(np.nanmean(st[f"{k}/{subset}"]))
  for c, name in enumerate(stats.CATEGORIES):
    for kind in ("raw", "eff"):
      summary[f"mean_mass_{kind}_{name}_{subset}"] = float(np.nanmean(st[f"mass_{kind}/{subset}"][..., c]))
  results.write_json(os.path.join(out_dir, "stats.json"), dict(
      summary=summary, categories=list(stats.CATEGORIES),
      **{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in st.items()}))
  with open(os.path.join(out_dir, "stats.csv"), "w", newline="") as f:
    w = csv.writer(f)
    cols = [f"mass_{k}_{c}" for k in ("raw", "eff") for c in stats.CATEGORIES]
    w.writerow(["subset", "layer", "head"] + cols + ["js", "corr", "null_ratio", "rank"])
    for sub in ("all", "long"):
      for l in range(mc.num_layers):
        for h in range(mc.num_heads):
          w.writerow([sub, l, h] + [f"{x:.6g}" for x in np.concatenate(
              [st[f"mass_raw/{sub}"][l, h], st[f"mass_eff/{sub}"][l, h]])]
                     + [f"{st[f'{k}/{sub}'][l, h]:.6g}" for k in ("js", "corr", "null_ratio", "rank")])

  label = f"{config.model.name} / {task.name} {e.split} ({subset}: {int(st['count/' + subset])} examples)"
  figures.mass_heatmaps(st[f"mass_raw/{subset}"], st[f"mass_eff/{subset}"],
                        os.path.join(out_dir, "mass_heatmaps.png"), label)
  figures.agreement_heatmaps({k: st[f"{k}/{subset}"] for k in ("js", "corr", "null_ratio")},
                             os.path.join(out_dir, "agreement_heatmaps.png"), label)
  _example_figure(model, tokenizer, data, st, subset, e, os.path.join(out_dir, "example_attention.png"))
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
