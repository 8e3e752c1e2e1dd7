"""The loss-optimal constant attention (Li & Janson, "Optimal ablation", NeurIPS 2024).

PAPA's constant is the mean attention: one constant among many, so its drop bounds the cost of
input-independent attention from above. The `optimal` variant is the constant that minimises
the task loss: every head static, each with a free `[L, L]` matrix of logits started at the
log of PAPA's mean (`train.constant_logits`) and applied by the rule every constant follows
(masked to the example's real tokens, and to the window on local layers, then renormalised
over keys: a softmax of the logits over the real keys), trained jointly with a probe on the
frozen encoder on the train split with the sorting run's recipe (`sort.epochs`,
`sort.max_train_examples`, `sort.gate_learning_rate` for the logits, `sort.seed`). Its rows
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
from papa_jax.probing import train
from papa_jax.stage import Setup, Stage
from papa_jax.workdir import storage
from papa_jax.workdir.layout import RELATIVE


def fit(setup: Setup, mean: np.ndarray) -> tuple[np.ndarray, dict]:
  """The loss-optimal constants `[layers, heads, L, L]` (rows summing to 1), fitted from PAPA's
  `mean`, and a record of the fit (train loss and dev score of its first and last epoch,
  seconds, examples)."""
  encoder = train.FrozenEncoder(setup.model.params, AttentionOverride.constant(mean),
                                setup.model.config, dropout=setup.config.probe.encoder_dropout,
                                fit_constants=True)
  t0 = time.perf_counter()
  state, history, _, examples = sort.fit_with_probe(
      setup, "optimal", encoder, setup.result_fingerprint(stage="optimal"), "optimal constants")
  logits = jax.device_get(state.params["constant_logits"])
  rows = np.asarray(jax.nn.softmax(logits, -1), np.float32)
  metric = setup.task.headline_metric
  info = dict(examples=examples, epochs=len(history), seconds=time.perf_counter() - t0,
              train_loss=[history[0]["train_loss"], history[-1]["train_loss"]],
              dev_score=[history[0].get(metric), history[-1].get(metric)], metric=metric)
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
  logging.info("optimal: train loss %.4f -> %.4f, dev %s %s -> %s over %d epochs (%.0f s)",
               *info["train_loss"], info["metric"], *info["dev_score"], info["epochs"],
               info["seconds"])
  if parallel.is_main_process():
    means.save_means(path, means.MeansState(rows.astype(np.float64), raw.counts,
                                            raw.metadata.get("num_examples", 0)),
                     dict(means.metadata(setup, "optimal"), fit=info), rows)


STAGE = Stage(name="optimal", run=_run, inputs=("train", "eval"), needs=("means",),
              writes=(RELATIVE.means("optimal"),), groups=config_schema.PAPA_GROUPS)
