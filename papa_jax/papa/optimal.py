"""The loss-optimal constant attention (Li & Janson, "Optimal ablation", NeurIPS 2024).

PAPA's constant is the mean attention: one constant among many, so its drop bounds the cost of
input-independent attention from above. The `optimal` variant is the constant that minimises
the task loss: every head static, each with a free `[L, L]` matrix of logits started at the
log of PAPA's mean (`train.constant_logits`) and applied by the rule every constant follows
(masked to the example's real tokens, and to the window on local layers, then renormalised
over keys: a softmax of the logits over the real keys), trained jointly with a probe on the
frozen encoder on the train split with the sorting run's recipe (`sort.epochs`,
`sort.max_train_examples`, `sort.gate_learning_rate` for the logits, `sort.seed`), the probe
first trained on the mean alone, so the joint fit starts at the mean's optimum. Its rows
are then saved like any means file and frozen; every probe seed trains on them as on every
other constant. The fit is for all heads static: at smaller fractions the first k heads of
PAPA's ranking take their rows of it, which is the all-heads optimum, not each subset's.

With it, the drop with all heads constant has two sides: PAPA's mean gives an upper bound on
what input-independence costs, and a drop that even the loss-optimal constant shows is a
lower one (as far as the fit found the optimum).
"""

from __future__ import annotations

import time

import jax
import numpy as np
from absl import logging

from papa_jax import parallel
from papa_jax.attention import AttentionOverride
from papa_jax.config import schema as config_schema
from papa_jax.papa import means, sort
from papa_jax.probing import fitting, train
from papa_jax.stage import Setup, Stage
from papa_jax.workdir import storage
from papa_jax.workdir.layout import RELATIVE


def fit(setup: Setup, mean: np.ndarray) -> tuple[np.ndarray, dict]:
  """The loss-optimal constants `[layers, heads, L, L]` (rows summing to 1), fitted from PAPA's
  `mean`, and a record of the fit.

  Two parts, each the sorting recipe (`sort.fit_with_probe`): a probe trained on the encoder
  with every head at the mean (`optimal/probe`), then that probe and the constants' logits,
  started at log(mean), trained together (`optimal/constants`). The joint fit so starts at
  the mean's optimum for that probe, and the record holds the loss it must beat: `train_loss`
  is the deterministic loss on the fit's examples at the start (mean, trained probe) and at
  the end (fitted constants, tuned probe); `dev_score` the dev score after each part and
  `epoch_losses` each part's per-epoch training loss.
  """
  model, cfg = setup.model, setup.config
  constant = AttentionOverride.constant(mean)
  fingerprint = setup.result_fingerprint(stage="optimal")
  t0 = time.perf_counter()
  at_mean = train.FrozenEncoder(model.params, constant, model.config,
                                dropout=cfg.probe.encoder_dropout)
  probed, probe_history, _, examples = sort.fit_with_probe(
      setup, "optimal", at_mean, fingerprint, "optimal: probe on the mean", part="probe")
  encoder = train.FrozenEncoder(model.params, constant, model.config,
                                dropout=cfg.probe.encoder_dropout, fit_constants=True)
  state, history, _, _ = sort.fit_with_probe(
      setup, "optimal", encoder, fingerprint, "optimal constants", part="constants",
      init_probe=probed.params["probe"])
  logits = jax.device_get(state.params["constant_logits"])
  rows = np.asarray(jax.nn.softmax(logits, -1), np.float32)
  probe, data = train.probe_module(setup.task, model.config, cfg.probe), sort.fit_data(setup)
  loss = lambda params: fitting.data_loss(probe, params, encoder, data, setup.mesh,
                                          cfg.run.batch_size)
  start = dict(probed.params, **encoder.trainable())
  metric = setup.task.headline_metric
  info = dict(examples=examples, epochs=[len(probe_history), len(history)],
              epoch_losses=[[h["train_loss"] for h in probe_history],
                            [h["train_loss"] for h in history]],
              seconds=time.perf_counter() - t0,
              train_loss=[loss(start), loss(state.params)],
              dev_score=[probe_history[-1].get(metric), history[-1].get(metric)], metric=metric)
  return rows, info


def _run(setup: Setup) -> None:
  if "optimal" not in setup.variants:
    logging.info("optimal: not among papa.variants %s; skipping.", tuple(setup.variants))
    return
  path = setup.layout.means("optimal")
  if storage.exists(path):
    means.load_checked(setup, "optimal")
    logging.info("optimal: %s exists; skipping.", path)
    return
  raw = means.load_checked(setup, "raw")
  rows, info = fit(setup, raw.avgs)
  logging.info("optimal: train loss %.4f at the mean -> %.4f fitted, dev %s %.4f -> %.4f "
               "(%.0f s)", *info["train_loss"], info["metric"], *info["dev_score"],
               info["seconds"])
  if parallel.is_main_process():
    means.save_means(path, means.MeansState(rows.astype(np.float64), raw.counts,
                                            raw.metadata.get("num_examples", 0)),
                     dict(means.metadata(setup, "optimal"), fit=info), rows)


STAGE = Stage(name="optimal", run=_run, inputs=("train", "eval"), needs=("means",),
              writes=(RELATIVE.means("optimal"),), groups=config_schema.PAPA_GROUPS)
