"""The probe stage: a fresh probe per static-head set and seed, and the results files.

For every variant (constant = mean raw or effective attention) and every
static-head count k of the schedule, the first k heads of the ranking become
constant and a probe trains on the frozen encoder, once per probe seed (the
baseline, k = 0, serves every variant). Each run writes
`probe/{variant}_k{K}_s{seed}/result.json` and `predictions.npz`; a run whose
result exists for the same fingerprint is reused. Then `results.{json,csv,md}`
and `papa_curve.png`.
"""

from __future__ import annotations

import os
import time

import jax.numpy as jnp
import numpy as np
from absl import logging

from papa_jax import config_schema, parallel, results, train, workdir
from papa_jax import features as features_lib
from papa_jax.attention import AttentionOverride
from papa_jax.layout import RELATIVE
from papa_jax.papa import means, schedule
from papa_jax.papa.sort import needs_ranking, static_head_counts
from papa_jax.stage import Setup, Stage


def _predictions(kind: str, logits: np.ndarray) -> np.ndarray:
  if kind == "regression":
    return logits[:, 0].astype(np.float32)
  return logits.argmax(-1).astype(np.int32)


def _features(setup: Setup, encoder: train.FrozenEncoder, variant: str, k: int):
  """Cached train and eval features of one static-head set, shared by every seed."""
  cfg = setup.config
  name = f"{variant}_k{k}"
  compute = lambda d, split: features_lib.compute(
      encoder, d, setup.mesh, cfg.run.batch_size,
      features_lib.cache_path(cfg.run.cache_dir, name, split), f"features {name} {split}")
  reused = setup.baseline_train_features if k == 0 else None
  if reused is not None:
    logging.info("features %s train: reusing the means pass's forward.", name)
  return (reused if reused is not None else compute(setup.train_data, "train"),
          compute(setup.eval_data, "eval"))


def _probe_runs(setup: Setup, variant: str, k: int, ranking) -> list[dict]:
  """The probing runs of one static-head set (k heads, mean `variant` attention), per seed."""
  cfg, mc, layout, task = setup.config, setup.model.config, setup.layout, setup.task
  static = schedule.static_heads(ranking, k, mc.num_layers, mc.num_heads)
  todo, rows = [], {}
  for seed in setup.seeds:
    fp = setup.result_fingerprint(stage="probe", variant=variant, k=k, heads=static.tolist(),
                                  seed=seed)
    path = layout.probe_result(variant, k, seed)
    if os.path.exists(path) and workdir.read_json(path).get("fingerprint") == fp:
      logging.info("probe %s k=%d seed=%d: done before (%s).", variant, k, seed, path)
      rows[seed] = workdir.read_json(path)
    else:
      todo.append((seed, fp))
  if not todo:
    return [rows[seed] for seed in setup.seeds]
  override = None
  if k:
    override = AttentionOverride.constant(jnp.asarray(means.load_checked(setup, variant).avgs),
                                          static)
  encoder = train.FrozenEncoder(setup.model.params, override, mc,
                                dropout=cfg.probe.encoder_dropout,
                                feature_dtype=cfg.probe.feature_dtype)
  train_data, eval_data = setup.train_data, setup.eval_data
  if cfg.probe.cache_features:  # Once per static-head set, shared by every seed.
    train_data, eval_data = _features(setup, encoder, variant, k)
  for seed, fp in todo:
    t0 = time.perf_counter()
    run_dir = layout.probe_run(variant, k, seed)
    _, history, logits = train.fit(
        f"probe {variant} k={k} seed={seed}", train.probe_module(task, mc, cfg.probe), encoder,
        train.make_optimizer(cfg.probe),
        train.FitConfig.from_config(cfg, cfg.probe.epochs, seed, layout.checkpoints(run_dir), fp),
        train_data, eval_data, train.scorer(task, setup.eval_data.labels), setup.mesh)
    metric = task.headline_metric
    row = dict(model=cfg.model.name, task=task.name, variant=variant, static_heads=k,
               total_heads=mc.total_heads, fraction=k / mc.total_heads, seed=seed,
               metric=metric, score=history[-1][metric],
               best_score=max(h[metric] for h in history),
               scores={m: history[-1][m] for m in task.metrics},
               examples=len(setup.train_data), eval_examples=len(setup.eval_data),
               epochs=len(history), seconds=time.perf_counter() - t0, history=history,
               fingerprint=fp)
    if parallel.is_main_process():
      results.save_predictions(layout.probe_predictions(variant, k, seed),
                               _predictions(task.kind, logits), setup.eval_data.labels,
                               logits if task.kind != "tagging" else None)
      workdir.write_json(layout.probe_result(variant, k, seed), row)
    rows[seed] = row
  return [rows[seed] for seed in setup.seeds]


def _check_inputs(setup: Setup):
  """Ranking, means and cache budget, checked before any probe trains."""
  mc = setup.model.config
  ranking = None
  if needs_ranking(setup):
    ranking = schedule.load_ranking(setup.layout.ranking, mc.num_layers, mc.num_heads)
  if any(static_head_counts(setup)):
    for v in setup.variants:
      means.load_checked(setup, v)
  if setup.config.probe.cache_features:
    n = len(setup.train_data) + len(setup.eval_data)
    features_lib.check_budget(features_lib.cache_bytes(
        n, mc.num_hidden_states, setup.max_length, mc.hidden_size,
        setup.config.probe.feature_dtype), setup.config.run.cache_max_gb, f"{n} examples")
  return ranking


def _run(setup: Setup) -> list[dict]:
  ranking = _check_inputs(setup)
  rows = []
  for variant in setup.variants:
    for k in static_head_counts(setup):
      if k == 0 and variant != "raw":
        continue  # One baseline serves every variant.
      rows.extend(_probe_runs(setup, variant, k, ranking))
  meta = dict(config=setup.config.to_dict(), seeds=list(setup.seeds),
              label_names=list(setup.task.label_names), model_fingerprint=setup.model_fingerprint,
              **workdir.provenance())
  if parallel.is_main_process():
    clean = [{k: v for k, v in r.items() if k not in ("history", "fingerprint")} for r in rows]
    paths = results.write_all(setup.layout, clean, meta)
    logging.info("Results: %s\n%s", paths["md"], results.markdown(clean))
  return rows


STAGE = Stage(name="probe", run=_run, inputs=("train", "eval"), needs=("means", "sort"),
              writes=(RELATIVE.probe_result("*", "*", "*"), RELATIVE.results()),
              groups=config_schema.PAPA_GROUPS)
