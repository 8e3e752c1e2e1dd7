"""The sort stage: PAPA's head-sorting run, whose gates rank the heads.

A probe trains on the frozen encoder with every head gated between its own
attention and its constant matrix (`AttentionOverride.gated`); the learned
gate logits (`sort/lambdas.npy`) order the heads, least input-dependent first
(`sort/sorted_heads.json`). Skipped when the static-head counts need no
ranking (only 0 and all heads constant). `sort/history.json` records whether the run learned
anything (`chance.sort_check`: the probe above chance, the gates moved); when it did not, the
log warns and every output that uses its ranking says so.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from papa_jax import chance, parallel, uncertainty
from papa_jax.config import schema as config_schema
from papa_jax.probing import fitting, train
from papa_jax.workdir import storage, rules as workdir
from papa_jax import data as data_lib
from papa_jax.attention import AttentionOverride
from papa_jax.workdir.layout import RELATIVE
from papa_jax.papa import means, schedule
from papa_jax.stage import Setup, Stage


def static_head_counts(setup: Setup) -> list[int]:
  """This run's schedule: how many heads are constant in each probing run."""
  return _counts(setup.config, setup.model.config)


def _counts(config, c) -> list[int]:
  return schedule.static_head_counts(c.total_heads, config_schema.fractions(config))


def _ranks(config, c) -> bool:
  """Whether the schedule of `config` on a model of config `c` has a partial head set."""
  return schedule.needs_ranking(_counts(config, c), c.total_heads)


def needs_ranking(setup: Setup) -> bool:
  return _ranks(setup.config, setup.model.config)


def fit_data(setup: Setup):
  """The sorting recipe's train examples: `sort.max_train_examples` of the train split
  (seeded by `data.subsample_seed` + 1), or all of it."""
  cfg, data = setup.config, setup.train_data
  if 0 < cfg.sort.max_train_examples < len(data):
    data = data.take(data_lib.subsample_indices(len(data), cfg.sort.max_train_examples,
                                                cfg.data.subsample_seed + 1))
  return data


def fit_with_probe(setup: Setup, stage: str, encoder: train.FrozenEncoder, fingerprint: str,
                   name: str = "", part: str = "", init_probe=None, data=None,
                   epochs: int | None = None, learning_rate: float | None = None):
  """The sorting recipe: `encoder`'s trainable override arrays (gates or constant logits) at
  `learning_rate` (default `sort.gate_learning_rate`), with a fresh probe (or one started at
  `init_probe`), on `data` (default `fit_data`), for `epochs` (default `sort.epochs`);
  resumable under `<stage>[/<part>]/checkpoints` (a call with more epochs goes on from the
  last); `name` (default `stage`) labels its progress lines.

  Returns:
    `fitting.fit`'s (state, history, last eval outputs), and the number of train examples.
  """
  cfg, layout = setup.config, setup.layout
  data = fit_data(setup) if data is None else data
  run_dir = layout.stage_dir(stage)
  state, history, logits = fitting.fit(
      name or stage, train.probe_module(setup.task, setup.model.config, cfg.probe), encoder,
      train.make_optimizer(cfg.probe, gate_learning_rate=cfg.sort.gate_learning_rate
                           if learning_rate is None else learning_rate),
      train.FitConfig.from_config(cfg, cfg.sort.epochs if epochs is None else epochs,
                                  cfg.sort.seed,
                                  layout.checkpoints(os.path.join(run_dir, part) if part
                                                     else run_dir), fingerprint),
      data, setup.eval_data, train.scorer(setup.task, setup.eval_data.labels), setup.mesh,
      init_probe)
  return state, history, logits, len(data)


def _run(setup: Setup) -> None:
  cfg, mc, layout = setup.config, setup.model.config, setup.layout
  if not needs_ranking(setup):
    logging.info("sort: static-head counts %s need no ranking; skipping.",
                 static_head_counts(setup))
    return
  fingerprint = setup.result_fingerprint(stage="sort")
  if storage.exists(layout.ranking) and storage.exists(layout.sort_history):
    if workdir.read_json(layout.sort_history).get("fingerprint") == fingerprint:
      logging.info("sort: %s exists; skipping.", layout.ranking)
      return
  constants = jnp.asarray(means.load_checked(setup, "raw").avgs)
  encoder = train.FrozenEncoder(
      setup.model.params, AttentionOverride.gated(constants, jnp.zeros(constants.shape[:2])),
      mc, dropout=cfg.probe.encoder_dropout)
  t0 = time.perf_counter()
  state, history, logits, _ = fit_with_probe(setup, "sort", encoder, fingerprint)
  lambdas = np.asarray(jax.device_get(state.params["gates"]))
  if parallel.is_main_process():
    rep = cfg.report
    check = chance.sort_check(
        setup.task, setup.eval_data.labels, train.predictions(setup.task.kind, logits), lambdas,
        level=rep.level, n_boot=rep.n_boot, seed=uncertainty.task_seed(rep.seed, setup.task.name))
    if line := chance.warning("The sorting run", check):
      logging.warning("sort: %s Its head ranking decides which heads become constant; "
                      "train it longer or on more examples (sort.epochs, "
                      "sort.max_train_examples).", line)
    schedule.save_ranking(layout, lambdas)
    sig = jax.nn.sigmoid(lambdas)
    workdir.write_json(layout.sort_history, dict(
        fingerprint=fingerprint, history=history, seconds=time.perf_counter() - t0,
        sigmoid_spread=[float(sig.min()), float(sig.max())], check=check))
  logging.info("sort: lambda range [%.4g, %.4g] -> %s", lambdas.min(), lambdas.max(),
               layout.ranking)


STAGE = Stage(name="sort", run=_run, inputs=("train", "eval"), needs=("means",),
              writes=(RELATIVE.ranking,), groups=config_schema.PAPA_GROUPS, memory="through",
              batch_size="probe.batch_size",
              skipped=lambda config, c: not _ranks(config, c))
