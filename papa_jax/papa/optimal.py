"""The loss-optimal constant attention (Li & Janson, "Optimal ablation", NeurIPS 2024).

PAPA's constant is the mean attention: one constant among many, so its drop bounds the cost of
input-independent attention from above. The `optimal` variant is the constant that minimises
the task loss: every head static, each with a free `[L, L]` matrix of logits started at the
log of PAPA's mean (`train.constant_logits`) and applied by the rule every constant follows
(masked to the example's real tokens, and to the window on local layers, then renormalised
over keys: a softmax of the logits over the real keys), trained jointly with a probe on the
frozen encoder on the train split with the sorting run's recipe (its examples,
`sort.max_train_examples`, and seed, `sort.seed`) and the `optimal` group's epochs and rate:
the probe first trained on the mean alone (`optimal.probe_epochs`), so the joint fit
(`optimal.epochs`, the logits at `optimal.learning_rate`) starts at the mean's optimum; of
its epochs (and the mean itself) the one with the lowest loss on held-out train examples
(`optimal.held_out` of them) is kept. Its rows
are then saved like any means file and frozen; every probe seed trains on them as on every
other constant. The fit is for all heads static: at smaller fractions the first k heads of
PAPA's ranking take their rows of it, which is the all-heads optimum, not each subset's.

With it, the drop with all heads constant has two sides: PAPA's mean gives an upper bound on
what input-independence costs, and a drop that even the loss-optimal constant shows is a
lower one (as far as the fit found the optimum).
"""

from __future__ import annotations

import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from papa_jax import parallel
from papa_jax.attention import AttentionOverride
from papa_jax.config import schema as config_schema
from papa_jax.data import pipeline
from papa_jax.models.encoder import Encoder
from papa_jax.papa import means, sort
from papa_jax.probing import fitting, train
from papa_jax.stage import Setup, Stage
from papa_jax.workdir import storage
from papa_jax.workdir.layout import RELATIVE


GROUPS = config_schema.PAPA_GROUPS + ("optimal",)  # What the fit depends on.


def epochs(config, part: str) -> int:
  """`optimal.<part>` epochs ("probe_epochs" or "epochs"); -1: `sort.epochs`."""
  n = getattr(config.optimal, part)
  return config.sort.epochs if n == -1 else n


def split(setup: Setup):
  """The fit's train examples (`sort.fit_data`) in two: the fit's and a seeded held-out
  `optimal.held_out` share (at least one example) whose loss chooses the epoch."""
  data = sort.fit_data(setup)
  n = len(data)
  order = np.random.default_rng(setup.config.sort.seed + 7).permutation(n)
  k = max(1, int(round(setup.config.optimal.held_out * n)))
  return data.take(np.sort(order[k:])), data.take(np.sort(order[:k]))


def fit(setup: Setup, mean: np.ndarray) -> tuple[np.ndarray, dict]:
  """The loss-optimal constants `[layers, heads, L, L]` (rows summing to 1), fitted from PAPA's
  `mean`, and a record of the fit.

  Two parts, each the sorting recipe (`sort.fit_with_probe`) on the fit's share of its train
  examples (`split`): a probe trained on the encoder with every head at the mean
  (`optimal/probe`), then that probe and the constants' logits, started at log(mean), trained
  together (`optimal/constants`). The joint fit so starts at the mean's optimum for that
  probe. The constants kept are those of the epoch (0: the mean itself) with the lowest loss
  on the held-out share: free `[L, L]` logits per head overfit a few thousand sentences (on
  MiniLM x SST-2 they lowered the train loss from 0.64 to 0.36 while the dev score fell).
  The record: `train_loss` and `held_out_loss` per epoch from 0 (deterministic), `epoch` the
  one kept, `dev_score` after the probe part and each joint epoch.
  """
  model, cfg = setup.model, setup.config
  constant = AttentionOverride.constant(mean)
  fingerprint = setup.fingerprint(GROUPS, ("train", "eval"), stage="optimal")
  fit_data, held_out = split(setup)
  t0 = time.perf_counter()
  at_mean = train.FrozenEncoder(model.params, constant, model.config,
                                dropout=cfg.probe.encoder_dropout)
  probed, probe_history, _, _ = sort.fit_with_probe(
      setup, "optimal", at_mean, fingerprint, "optimal: probe on the mean", part="probe",
      data=fit_data, epochs=epochs(cfg, "probe_epochs"))
  encoder = train.FrozenEncoder(model.params, constant, model.config,
                                dropout=cfg.probe.encoder_dropout, fit_constants=True)
  probe = train.probe_module(setup.task, model.config, cfg.probe)
  losses = lambda params: [fitting.data_loss(probe, params, encoder, d, setup.mesh,
                                             cfg.run.batch_size) for d in (fit_data, held_out)]
  params = dict(probed.params, **encoder.trainable())
  metric = setup.task.headline_metric
  path = setup.layout.path("optimal", "selection.npz")
  record, best = _load_selection(path, fingerprint)
  if record is None:
    record = dict(train_loss=[], held_out_loss=[], dev_score=[probe_history[-1].get(metric)])
  for epoch in range(len(record["train_loss"]), epochs(cfg, "epochs") + 1):
    if epoch:  # Goes on from the last checkpoint (never before the last epoch evaluated).
      state, history, _, _ = sort.fit_with_probe(
          setup, "optimal", encoder, fingerprint, "optimal constants", part="constants",
          init_probe=probed.params["probe"], data=fit_data, epochs=epoch,
          learning_rate=cfg.optimal.learning_rate)
      params = state.params
      record["dev_score"].append(history[-1].get(metric))
    train_loss, held = losses(params)
    record["train_loss"].append(train_loss)
    record["held_out_loss"].append(held)
    if best is None or held < min(record["held_out_loss"][:-1], default=np.inf):
      best = np.asarray(jax.device_get(params["constant_logits"]))
    if parallel.is_main_process():  # Each epoch's losses and the best logits: resumable.
      storage.makedirs(os.path.dirname(path))
      with storage.open(path, "wb") as f:
        np.savez(f, logits=best, record=json.dumps(dict(record, fingerprint=fingerprint)))
  rows = np.asarray(jax.nn.softmax(best, -1), np.float32)
  info = dict(examples=len(fit_data), held_out=len(held_out),
              epoch=int(np.argmin(record["held_out_loss"])),
              seconds=time.perf_counter() - t0, metric=metric, **record)
  return rows, info


def _hidden_error(config, params, logits: jax.Array, batch: dict) -> tuple[jax.Array, jax.Array]:
  """Sums over the batch's real tokens of the squared distance between the last hidden states
  with every head at `softmax(logits)` and without any override, and of the latter's squared
  norm (their ratio is the relative squared error)."""
  run = lambda override: Encoder(config).apply(
      {"params": params}, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
      override=override).last_hidden_state.astype(jnp.float32)
  target = jax.lax.stop_gradient(run(None))
  static = run(AttentionOverride.constant(jax.nn.softmax(logits, -1)))
  m = (batch["attention_mask"] * batch["valid"][:, None]).astype(jnp.float32)
  return (((static - target) ** 2).sum(-1) * m).sum(), ((target ** 2).sum(-1) * m).sum()


def fit_hidden(setup: Setup, mean: np.ndarray) -> tuple[np.ndarray, dict]:
  """The task-free fit (`optimal.objective=hidden`): the constants whose encoder reproduces the
  unmodified encoder's last hidden states best, by the relative squared error over real tokens
  (no probe, no labels); AdamW on the logits from log(mean) at `optimal.learning_rate` for
  `optimal.epochs`, batches of `probe.batch_size` in the sorting run's seeded order, the epoch
  (0: the mean) with the lowest error on the held-out share kept. Resumable per epoch."""
  model, cfg = setup.model, setup.config
  fingerprint = setup.fingerprint(GROUPS, ("train",), stage="optimal")
  fit_data, held_out = split(setup)
  tx = optax.adamw(cfg.optimal.learning_rate, b1=cfg.probe.adam_b1, b2=cfg.probe.adam_b2,
                   eps=cfg.probe.adam_eps, weight_decay=0.0)
  repl, shard = parallel.replicated(setup.mesh), parallel.batch_sharding(setup.mesh)

  def loss(logits, batch):
    err, ref = _hidden_error(model.config, model.params, logits, batch)
    return err / jnp.maximum(ref, 1e-30)

  @functools.partial(jax.jit, in_shardings=(repl, repl, shard), out_shardings=repl)
  def step(logits, opt_state, batch):
    value, grad = jax.value_and_grad(loss)(logits, batch)
    updates, opt_state = tx.update(grad, opt_state, logits)
    return optax.apply_updates(logits, updates), opt_state, value

  sums = jax.jit(functools.partial(_hidden_error, model.config, model.params),
                 in_shardings=(repl, shard), out_shardings=repl)

  def error(logits, data) -> float:
    total = np.zeros(2)
    for _, out, _ in parallel.map_batches(lambda b: sums(logits, b), data,
                                          batch_size=cfg.probe.batch_size, mesh=setup.mesh):
      total += np.asarray(out, np.float64)
    return float(total[0] / max(total[1], 1e-30))

  logits = parallel.put_replicated(train.constant_logits(mean), setup.mesh)
  opt_state = tx.init(logits)
  path = setup.layout.path("optimal", "selection.npz")
  record, best = _load_selection(path, fingerprint)
  if record is not None:  # Goes on after the last epoch evaluated.
    with storage.open(path, "rb") as f:
      z = np.load(f)
      logits = parallel.put_replicated(jnp.asarray(z["current"]), setup.mesh)
      leaves = [jnp.asarray(z[f"opt_{i}"]) for i in range(len(jax.tree.leaves(opt_state)))]
      opt_state = jax.tree.unflatten(jax.tree.structure(opt_state), leaves)
  else:
    record = dict(train_loss=[], held_out_loss=[])
  t0 = time.perf_counter()
  for epoch in range(len(record["train_loss"]), epochs(cfg, "epochs") + 1):
    if epoch:
      for batch in pipeline.batches(fit_data, cfg.probe.batch_size, shuffle=True,
                                    seed=cfg.sort.seed, epoch=epoch - 1):
        logits, opt_state, _ = step(logits, opt_state,
                                    parallel.put_batch(pipeline.host_slice(batch), setup.mesh))
    record["train_loss"].append(error(logits, fit_data))
    record["held_out_loss"].append(error(logits, held_out))
    logging.info("optimal (hidden states) epoch %d: relative squared error %.5f fit, %.5f "
                 "held out", epoch, record["train_loss"][-1], record["held_out_loss"][-1])
    if best is None or record["held_out_loss"][-1] < min(record["held_out_loss"][:-1],
                                                        default=np.inf):
      best = np.asarray(jax.device_get(logits))
    if parallel.is_main_process():
      storage.makedirs(os.path.dirname(path))
      with storage.open(path, "wb") as f:
        np.savez(f, logits=best, current=np.asarray(jax.device_get(logits)),
                 record=json.dumps(dict(record, fingerprint=fingerprint)),
                 **{f"opt_{i}": np.asarray(jax.device_get(x))
                    for i, x in enumerate(jax.tree.leaves(opt_state))})
  rows = np.asarray(jax.nn.softmax(best, -1), np.float32)
  info = dict(objective="hidden", examples=len(fit_data), held_out=len(held_out),
              epoch=int(np.argmin(record["held_out_loss"])), seconds=time.perf_counter() - t0,
              metric="relative squared error of the last hidden states", **record)
  return rows, info


def _load_selection(path: str, fingerprint: str) -> tuple[dict | None, np.ndarray | None]:
  """The epochs a resumed fit already evaluated, and the best logits so far (none when the
  file is absent or from another config)."""
  if not storage.exists(path):
    return None, None
  with storage.open(path, "rb") as f:
    z = np.load(f)
    record = json.loads(str(z["record"]))
    if record.pop("fingerprint", None) != fingerprint:
      return None, None
    return record, np.asarray(z["logits"])


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
  rows, info = (fit_hidden if setup.config.optimal.objective == "hidden" else fit)(
      setup, raw.avgs)
  logging.info("optimal: kept epoch %d of %d (held-out loss per epoch from the mean: %s; "
               "train: %s) in %.0f s", info["epoch"], len(info["train_loss"]) - 1,
               " ".join(f"{x:.4f}" for x in info["held_out_loss"]),
               " ".join(f"{x:.4f}" for x in info["train_loss"]), info["seconds"])
  if info["epoch"] == 0:
    logging.warning("optimal: no epoch of the fit beat PAPA's mean on held-out examples; the "
                    "`optimal` constant is the mean.")
  if parallel.is_main_process():
    means.save_means(path, means.MeansState(rows.astype(np.float64), raw.counts,
                                            raw.metadata.get("num_examples", 0)),
                     dict(means.metadata(setup, "optimal"), fit=info), rows)


STAGE = Stage(name="optimal", run=_run, inputs=("train", "eval"), needs=("means",),
              writes=(RELATIVE.means("optimal"),), groups=GROUPS, memory="through",
              batch_size="probe.batch_size",
              skipped=lambda config, c: "optimal" not in config_schema.variants(config))
