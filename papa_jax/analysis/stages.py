"""The Sun & Marasovic analysis stages: finetune, linguistic, ablation.

Each takes the shared `run.Setup` (model, tokenizer, mesh, data) and writes
under `workdir/<stage>/`: `stats.json` (maps per layer x head, a summary,
provenance), `stats.csv` (a row per head) and PNG heatmaps, raw beside
effective. The passes are data-parallel and resumable (partial sums, or per
layer and replacement for the ablations).
"""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
from absl import logging

from papa_jax import config_schema, convert, features, metrics, parallel, train, workdir
from papa_jax import tokenization
from papa_jax.analysis import ablation, figures, finetune, linguistic, output, passes


def _rtol(setup) -> float | None:
  return setup.config.effective.rtol if setup.config.effective.rtol > 0 else None


def _run_key(setup, stage: str, **extra) -> str:
  return workdir.fingerprint(dict(extra, stage=stage, model=setup.model_fingerprint, config=(
      config_schema.result_config(setup.config, config_schema.EFFECTIVE_GROUPS))))


def _label(setup, what: str, n: int) -> str:
  c = setup.config
  return f"{c.model.name} / {setup.task.name} {c.effective.split} ({n} examples): {what}"


def run_finetune(setup) -> dict:
  """Pretrained (`model.name`) vs fine-tuned (`effective.other_model`) attention."""
  c = setup.config
  other_name = c.effective.other_model
  if not other_name:
    raise config_schema.ConfigError("stage=finetune needs effective.other_model, the "
                                    "fine-tuned (or other) checkpoint to compare with.")
  other = convert.load_pretrained(other_name)
  finetune.check_comparable(setup.model.config, other.config.replace(
      compute_dtype=setup.model.config.compute_dtype),
      tokenization.tokenization_difference(setup.tokenizer, other.tokenizer()))
  data = setup.effective_data
  out_dir = setup.path("finetune")
  sums = passes.sum_pass(
      finetune.make_batch_stats(setup.model.config, _rtol(setup)),
      (setup.model.params, other.params), data, setup.mesh, batch_size=c.run.batch_size,
      partial=os.path.join(out_dir, "partial.npz"),
      run_key=_run_key(setup, "finetune", other=other_name),
      checkpoint_every=c.run.checkpoint_every_batches, desc="finetune")
  st = finetune.finalize(sums)
  summary = dict(model=c.model.name, other_model=other_name, task=setup.task.name,
                 split=c.effective.split, examples=int(st["count"]),
                 **{f"mean_{k}": float(np.mean(st[k])) for k in finetune.PER_HEAD})
  if parallel.is_main_process():
    output.write_per_head(out_dir, {k: st[k] for k in finetune.PER_HEAD}, summary)
    label = _label(setup, f"{c.model.name} vs {other_name}", int(st["count"]))
    figures.head_maps([("cosine, raw", st["cos_raw"]), ("cosine, effective", st["cos_eff"])],
                      os.path.join(out_dir, "cosine.png"), label, cmap="magma")
    figures.head_maps([("JS divergence, raw", st["js_raw"])], os.path.join(out_dir, "js.png"),
                      label, cmap="magma")
  logging.info("finetune: %s", summary)
  return summary


def linguistic_classes(setup, data) -> np.ndarray:
  if setup.task.kind != "tagging":
    raise config_schema.ConfigError(
        f"stage=linguistic needs gold part-of-speech tags: a tagging task such as pos "
        f"(CoNLL-2003, Penn Treebank) or udpos (UPOS), not {setup.task.name!r}.")
  tok = setup.tokenizer
  return linguistic.class_ids(data.input_ids, data.attention_mask, data.labels,
                              setup.task.label_names, tok.cls_token_id, tok.sep_token_id)


def run_linguistic(setup) -> dict:
  """Attention from the [CLS] row and from all rows to part-of-speech classes."""
  c = setup.config
  data = setup.effective_data
  arrays = dict(data.arrays(), classes=linguistic_classes(setup, data))
  out_dir = setup.path("linguistic")
  sums = passes.sum_pass(
      linguistic.make_batch_stats(setup.model.config, _rtol(setup)), setup.model.params,
      arrays, setup.mesh, batch_size=c.run.batch_size,
      partial=os.path.join(out_dir, "partial.npz"), run_key=_run_key(setup, "linguistic"),
      checkpoint_every=c.run.checkpoint_every_batches, desc="linguistic")
  st = linguistic.finalize(sums)
  counts = dict(zip(linguistic.CLASSES, st["count"].astype(int).tolist()))
  summary = dict(model=c.model.name, task=setup.task.name, split=c.effective.split,
                 examples=len(data), examples_with_class=counts,
                 classes=list(linguistic.CLASSES),
                 last_layer_cls_mass_raw=dict(zip(linguistic.CLASSES, np.nanmean(
                     st["cls_mass_raw"][-1], 0).tolist())),
                 last_layer_cls_mass_eff=dict(zip(linguistic.CLASSES, np.nanmean(
                     st["cls_mass_eff"][-1], 0).tolist())))
  if parallel.is_main_process():
    maps = {k: v for k, v in st.items() if k != "count"}
    output.write_per_head(out_dir, maps, summary, linguistic.CLASSES)
    for query in ("cls", "rows"):
      panels = [(f"{kind}: {query} -> {cls}", st[f"{query}_mass_{kind}"][..., i])
                for kind in ("raw", "eff") for i, cls in enumerate(linguistic.CLASSES)]
      figures.head_maps(panels, os.path.join(out_dir, f"{query}_mass.png"),
                        _label(setup, f"attention mass to each class ({query} query)",
                               len(data)), ncols=len(linguistic.CLASSES), center=True,
                        cmap="RdBu_r")
  logging.info("linguistic: %s", summary)
  return summary


def _probe_for_ablation(setup):
  """The baseline probe on the unmodified encoder, and float32 hidden states of the
  analysis split (`effective.split`, `effective.max_examples`: a seeded subset)."""
  c, mc = setup.config, setup.model.config
  encoder = train.FrozenEncoder(setup.model.params, None, mc, feature_dtype="float32")
  n = len(setup.train_data) + len(setup.effective_data)
  features.check_budget(features.cache_bytes(n, mc.num_hidden_states, setup.L, mc.hidden_size,
                                             "float32"), c.run.cache_max_gb, f"{n} examples")
  tr, ev = (features.compute(encoder, d, setup.mesh, c.run.batch_size, desc=f"features {s}")
            for d, s in ((setup.train_data, "train"), (setup.effective_data, "eval")))
  from papa_jax import run as run_lib  # pylint: disable=import-outside-toplevel
  seed = setup.seeds[0]
  fp = _run_key(setup, "ablation-probe", seed=seed, probe=config_schema.result_config(
      c, ("probe",)))
  probe = run_lib.probe_module(setup)
  cfg = run_lib.fit_config(setup, c.probe.epochs, seed,
                           setup.path("ablation", f"probe_{fp[:12]}"), fp)  # One per config.
  state, history, logits = train.fit("ablation probe", probe, encoder,
                                     train.make_optimizer(c.probe), cfg, tr, ev,
                                     run_lib.score_fn(setup, setup.effective_data), setup.mesh)
  return probe, state.params["probe"], ev.features, history, logits


def run_ablation(setup) -> dict:
  """Every head replaced in turn (uniform, constant, effective); the dev score change."""
  c, mc, task = setup.config, setup.model.config, setup.task
  kinds = tuple(c.effective.ablations)
  probe, probe_params, hidden, history, base_logits = _probe_for_ablation(setup)
  labels, metric = setup.effective_data.labels, task.headline_metric
  baseline = metrics.task_scores(task, base_logits, labels)[metric]
  constants = (jnp.asarray(setup.load_means("raw").avgs) if "constant" in kinds else None)
  frozen = parallel.put_replicated((setup.model.params, probe_params, jnp.asarray(hidden),
                                    constants), setup.mesh)
  out_dir = setup.path("ablation")
  key = _run_key(setup, "ablation", probe=config_schema.result_config(c, ("probe",)))
  maps = {}
  for kind in kinds:
    scores = np.zeros((mc.num_layers, mc.num_heads))
    for layer in range(mc.num_layers):
      path = os.path.join(out_dir, f"{kind}_layer{layer}.npz")
      if os.path.exists(path):
        with np.load(path) as z:
          if str(z["key"]) == key:
            scores[layer] = z["scores"]
            continue
      logits = ablation.ablate_layer(mc, probe, kind, layer, frozen, setup.effective_data,
                                     setup.mesh, c.run.batch_size,
                                     desc=f"ablation {kind} layer {layer}")
      scores[layer] = [metrics.task_scores(task, lg, labels)[metric] for lg in logits]
      if parallel.is_main_process():
        with workdir.atomic_write(path, "wb") as f:
          np.savez(f, scores=scores[layer], key=np.asarray(key))
    maps[f"change_{kind}"] = scores - baseline
  summary = dict(model=c.model.name, task=task.name, split=c.effective.split, metric=metric,
                 baseline=baseline, eval_examples=len(labels),
                 train_examples=len(setup.train_data), probe_history=history,
                 **{f"mean_change_{k}": float(maps[f"change_{k}"].mean()) for k in kinds},
                 **{f"max_abs_change_{k}": float(np.abs(maps[f"change_{k}"]).max())
                    for k in kinds})
  gates_path = setup.path("sort", "lambdas.npy")
  if os.path.exists(gates_path):
    gates = np.load(gates_path)
    summary["vs_papa_ranking"] = {k: ablation.rank_agreement(-maps[f"change_{k}"], gates)
                                  for k in kinds}
  if parallel.is_main_process():
    output.write_per_head(out_dir, maps, summary)
    figures.head_maps([(f"{k}: score change", maps[f"change_{k}"]) for k in kinds],
                      os.path.join(out_dir, "score_change.png"),
                      f"{c.model.name} / {task.name}: {metric} change when one head is "
                      f"replaced (baseline {baseline:.4f})", center=True, cmap="RdBu_r")
  logging.info("ablation: %s", {k: v for k, v in summary.items() if k != "probe_history"})
  return summary
