"""The probe training loop: batches, evaluation, checkpoints, resume, probes trained together.

`fit` trains one probe; `fit_many` trains several that differ only in seed on
the same cached features in one vmapped step (`train.make_group_step`), each
as if alone. The steps themselves live in `train`.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from papa_jax.workdir import checkpoint as ckpt_lib
from papa_jax import parallel, preemption
from papa_jax.data import pipeline
from papa_jax.data.preprocess import IGNORE
from papa_jax.progress import INTERVAL, Progress
from papa_jax.probing import probes
from papa_jax.probing.train import (FitConfig, FrozenEncoder, TrainState, init_state,
                                    make_eval_step, make_group_step, make_train_step, take)
from papa_jax.errors import TrainingDiverged


class FeatureTable:
  """Cached features for probes trained on a one-device, one-process mesh, each batch gathered
  there: from a device copy of them all (`table`), or, where they are in a file
  (`features.Features.path`: a spilled or `run.cache_dir` cache), from the batch's rows read
  from it, so host memory holds a batch rather than the split."""

  def __init__(self, data):
    self.data = data
    self.streamed = bool(getattr(data, "path", ""))
    self.table = None if self.streamed else {
        k: jnp.asarray(v) for k, v in pipeline.columns(data).items()}

  def __len__(self) -> int:
    return pipeline.num_rows(self.data)

  @property
  def labels(self) -> np.ndarray:
    return np.asarray(pipeline.columns(self.data)["labels"])

  def gather(self, idx: np.ndarray) -> tuple[dict, jax.Array]:
    """`(table, positions)` such that `take(table, positions)` is rows `idx` (any shape; -1: a
    padding row): the device table and `idx`, or the rows read for `idx` and their places
    among them (padding rows then repeat another row instead of row 0 of the split: the
    loss masks them out either way)."""
    if not self.streamed:
      return self.table, jnp.asarray(idx, jnp.int32)
    flat = idx.reshape(-1)
    rows = self.data.rows(np.maximum(flat, 0))
    where = np.where(flat >= 0, np.arange(flat.size), -1).reshape(idx.shape)
    # device_put, not jnp.asarray: on CPU it takes the aligned rows without a copy.
    return jax.device_put(rows), jnp.asarray(where, jnp.int32)


def feature_table(data, mesh) -> FeatureTable | None:
  """`FeatureTable` of `data` where probes train on them together (`vectorisable`), else
  None: each process then gathers its rows on the host."""
  return FeatureTable(data) if vectorisable(data, mesh) else None


def device_batches(data, table: FeatureTable | None, batch_size: int, mesh, *, seed: int,
                   epoch: int, start: int = 0):
  """One epoch's shuffled training batches on the mesh, from batch `start`."""
  if table is None:
    for batch in pipeline.batches(data, batch_size, shuffle=True, seed=seed, epoch=epoch,
                                  start=start):
      yield parallel.put_batch(pipeline.host_slice(batch), mesh)
    return
  for idx in _epoch_batches(pipeline.num_rows(data), batch_size, seed, epoch)[start:]:
    yield take(*table.gather(idx))


def _ahead(items: Iterator) -> Iterator:
  """`items`, each made in a worker thread while the caller uses the one before (a batch's
  reads from a features file overlap the step before it)."""
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    upcoming = pool.submit(next, items, None)
    while (item := upcoming.result()) is not None:
      upcoming = pool.submit(next, items, None)
      yield item


def _epoch_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
  """The row indices of one epoch's shuffled batches (the last padded with -1)."""
  return pipeline.batch_indices(
      pipeline.epoch_order(n, shuffle=True, seed=seed, epoch=epoch), batch_size)


def predict(eval_fn, params, encoder: FrozenEncoder, data, mesh, batch_size: int) -> np.ndarray:
  """Probe outputs for every example of `data`, in order (padding removed)."""
  outs = [out[valid] for _, out, valid in parallel.map_batches(
      lambda b: eval_fn(params, b, encoder), data, batch_size=batch_size, mesh=mesh)]
  return np.concatenate(outs)


@functools.lru_cache(maxsize=8)
def _eval_fn(probe: nn.Module, mesh):
  """The jitted eval step of `probe` on `mesh`, its outputs replicated so every process can
  read them (one per probe module and mesh, so repeated calls reuse it)."""
  repl, shard = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  return jax.jit(make_eval_step(probe), in_shardings=(repl, shard, repl), out_shardings=repl)


def data_loss(probe: nn.Module, params, encoder: FrozenEncoder, data, mesh,
              batch_size: int) -> float:
  """The probe's mean loss over `data` (tokens for tagging), deterministic (no dropout), with
  `params`' trainable override arrays in the encoder."""
  out = predict(_eval_fn(probe, mesh), params, encoder, data, mesh, batch_size)
  labels = np.asarray(data.labels)
  return float(probes.loss_fn(probe.kind, jnp.asarray(out), jnp.asarray(labels),
                              jnp.ones(len(labels), bool))[0])


def vectorisable(data, mesh) -> bool:
  """Whether probes can train together on `data`: cached features resident on the one
  device of one process (elsewhere each probe trains in turn)."""
  return hasattr(data, "features") and parallel.one_device(mesh)


def scored_widths(labels: np.ndarray, step: int = 8) -> np.ndarray:
  """Per row of tag labels `[N, L]`: the positions a per-token probe must see (up to the
  last scored one), rounded up to a multiple of `step` (at most L) so that few shapes
  compile."""
  length = labels.shape[1]
  scored = labels != IGNORE
  last = np.where(scored.any(1), length - np.argmax(scored[:, ::-1], 1), 0)
  return np.minimum(np.maximum(-(-last // step), 1) * step, length)


@functools.partial(jax.jit, static_argnums=2)
def _take_width(table: dict, idx: jax.Array, width: int) -> dict:
  """`take` of rows `idx`, their positions cut to the first `width`."""
  batch = take(table, idx)
  return dict(batch, features=batch["features"][:, :, :width],
              attention_mask=batch["attention_mask"][:, :width], labels=batch["labels"][:, :width])


def _group_predict(eval_fn, params, table: FeatureTable, batch_size: int,
                   widths: np.ndarray | None = None) -> list[np.ndarray]:
  """Every probe's outputs `[N, ...]` on every row of `table`, in order.

  `widths` (`scored_widths`, for per-token probes only): rows are batched by
  width and each batch sees only its first positions; the outputs there are the
  full-width ones (a token's output depends on its features alone) and 0 past them.
  """
  n = len(table)
  if widths is None:
    outs = []
    for idx in pipeline.batch_indices(np.arange(n), batch_size):
      out = eval_fn(params, take(*table.gather(idx)))
      outs.append(np.asarray(out)[:, idx >= 0])
    return list(np.concatenate(outs, axis=1))
  out = None
  for idx in pipeline.batch_indices(np.argsort(-widths, kind="stable"), batch_size):
    rows = idx[idx >= 0]
    width = int(widths[rows].max())
    got = np.asarray(eval_fn(params, _take_width(*table.gather(idx), width)))
    if out is None:
      out = np.zeros((got.shape[0], n, table.labels.shape[1]) + got.shape[3:], got.dtype)
    out[:, rows, :width] = got[:, idx >= 0]
  return list(out)


def _widths(probe: nn.Module, data) -> np.ndarray | None:
  """`scored_widths` of `data` where `probe` is per-token (its outputs at a position depend
  on that position's features alone: `probes.TokenProbe`), else None."""
  if getattr(probe, "kind", None) != "tagging":
    return None
  return scored_widths(np.asarray(pipeline.columns(data)["labels"]))


def _stack(trees: list) -> Any:
  return jax.tree.map(lambda *x: jnp.stack(x), *trees)


def _row(tree: Any, p: int) -> Any:
  return jax.tree.map(lambda x: x[p], tree)


def fit(name: str, probe: nn.Module, encoder: FrozenEncoder, tx, cfg: FitConfig, train_data,
        eval_data, score_fn: Callable[[np.ndarray], dict], mesh,
        init_probe: Any = None) -> tuple[TrainState, list[dict], np.ndarray]:
  """Trains `probe` for `cfg.epochs`, evaluating each epoch; resumable (`fit_many` of one).
  `init_probe`: the probe's starting parameters (default: initialised from `cfg.seed`).

  The data order of epoch e depends only on (seed, e) and dropout keys only on
  the step, so resuming from a checkpoint (at an epoch end, or within an epoch
  every `cfg.checkpoint_every_steps` steps, or on preemption) gives the same
  result as an uninterrupted run.

  Returns:
    The final state, the per-epoch history (train loss, eval scores, time), and
    the last epoch's eval outputs (logits) for every eval example.
  """
  return fit_many(name, probe, encoder, tx, [cfg], train_data, eval_data, score_fn, mesh,
                  init_probe)[0]


def fit_many(name: str, probe: nn.Module, encoder: FrozenEncoder, tx, cfgs: list[FitConfig],
             train_data, eval_data, score_fn: Callable[[np.ndarray], dict], mesh,
             init_probe: Any = None) -> list[tuple[TrainState, list[dict], np.ndarray]]:
  """`fit` of several probes that differ only in seed (and checkpoint directory), trained
  together in one vmapped step where `vectorisable` (else in turn). Each probe keeps its
  own data order, dropout keys, history and checkpoints, as if trained alone; probes whose
  checkpoints stand at different points train in groups, one per point."""
  if len(cfgs) > 1 and not (vectorisable(train_data, mesh) and vectorisable(eval_data, mesh)):
    return [fit(f"{name} seed={c.seed}", probe, encoder, tx, c, train_data, eval_data,
                score_fn, mesh) for c in cfgs]
  repl = parallel.replicated(mesh)
  encoder = parallel.put_replicated(encoder, mesh)
  ckpts = [ckpt_lib.Checkpointer(c.checkpoint_dir) if c.checkpoint_dir else None for c in cfgs]
  states, metas = [], []
  for c, ckpt in zip(cfgs, ckpts):
    state = init_state(probe, encoder, tx, c.seed, eval_data.max_length, init_probe)
    state = jax.device_put(state, repl)
    meta = {}
    if ckpt is not None and ckpt.latest_step() is not None:
      state, meta = ckpt.restore(ckpt.latest_step(), state, c.fingerprint)
    states.append(state)
    metas.append(meta)
  points = [(m.get("epoch", 0), m.get("step_in_epoch", 0)) for m in metas]
  out = [None] * len(cfgs)
  try:
    for point in sorted(set(points)):  # Resumed from different points: one group per point.
      ids = [i for i, q in enumerate(points) if q == point]
      pick = lambda xs: [xs[i] for i in ids]  # pylint: disable=cell-var-from-loop
      for i, r in zip(ids, _fit_group(name, probe, encoder, tx, pick(cfgs), pick(ckpts),
                                      pick(states), pick(metas), point, train_data, eval_data,
                                      score_fn, mesh)):
        out[i] = r
  finally:  # Waits for checkpoints still being written (also when a run is preempted).
    for ckpt in ckpts:
      if ckpt is not None:
        ckpt.close()
  return out


def _fit_group(name: str, probe: nn.Module, encoder: FrozenEncoder, tx, cfgs: list[FitConfig],
               ckpts: list, states: list, metas: list[dict], point: tuple[int, int], train_data,
               eval_data, score_fn: Callable[[np.ndarray], dict],
               mesh) -> list[tuple[TrainState, list[dict], np.ndarray]]:
  """`fit_many`'s loop over probes whose (restored) states stand at the same `point`
  (epoch, step in epoch), saving into `ckpts`."""
  repl, shard = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  cfg, group = cfgs[0], len(cfgs)
  n = pipeline.num_rows(train_data)
  steps_per_epoch = pipeline.num_batches(n, cfg.batch_size)
  histories = [m.get("history", []) for m in metas]
  epoch, start = point
  epoch_losses = [m.get("epoch_losses", []) for m in metas]
  if point != (0, 0):
    logging.info("%s: resumed after epoch %d%s from %s.", name, epoch,
                 f", step {start} of epoch {epoch + 1}" if start else "",
                 ", ".join(c.directory for c in ckpts if c is not None))
  table = feature_table(train_data, mesh)
  streamed = table is not None and table.streamed
  widths = _widths(probe, eval_data)  # Per-token probes: eval batches cut to their tokens.
  if group == 1:
    state = states[0]
    train_step = jax.jit(make_train_step(probe, tx, cfg.seed), in_shardings=(repl, shard, repl),
                         out_shardings=(repl, repl), donate_argnums=0)
    eval_fn = _eval_fn(probe, mesh)
    step_fn = lambda st, batch: (lambda s, loss: (s, loss[None]))(*train_step(st, batch,
                                                                               encoder))
    epoch_batches = lambda e, s0: device_batches(train_data, table, cfg.batch_size, mesh,
                                                 seed=cfg.seed, epoch=e, start=s0)
    eval_table = feature_table(eval_data, mesh)
    if eval_table is None:
      predict_all = lambda st: [predict(eval_fn, st.params, encoder, eval_data, mesh,
                                        cfg.eval_batch_size)]
    else:  # Cached eval features on the device: batches gathered there.
      predict_all = lambda st: _group_predict(lambda p, b: eval_fn(p, b, encoder)[None],
                                              st.params, eval_table, cfg.eval_batch_size,
                                              widths)
    row = lambda st, p: st
  else:
    state = _stack(states)
    seeds = jnp.asarray([c.seed for c in cfgs], jnp.int32)
    group_step = jax.jit(make_group_step(probe, tx), donate_argnums=0)
    step_fn = lambda st, gathered: group_step(st, *gathered, seeds)
    eval_step = make_eval_step(probe)
    eval_fn = jax.jit(lambda params, batch: jax.vmap(lambda p: eval_step(p, batch, None))(params))
    eval_table = feature_table(eval_data, mesh)
    predict_all = lambda st: _group_predict(eval_fn, st.params, eval_table, cfg.eval_batch_size,
                                            widths)
    row = _row

    def epoch_batches(e: int, s0: int):
      per = [_epoch_batches(n, cfg.batch_size, c.seed, e) for c in cfgs]
      for i in range(s0, steps_per_epoch):
        yield table.gather(np.stack([b[i] for b in per]))

  def save(epoch_done: int, step_in_epoch: int, losses: list[list[float]]) -> None:
    global_step = epoch_done * steps_per_epoch + step_in_epoch
    for p, (c, ckpt) in enumerate(zip(cfgs, ckpts)):
      if ckpt is not None:
        ckpt.save(global_step, row(state, p), dict(
            fingerprint=c.fingerprint, epoch=epoch_done, step_in_epoch=step_in_epoch,
            epoch_losses=losses[p], history=histories[p]))

  log_every = max(1, min(cfg.log_every_steps, steps_per_epoch))
  prog = Progress(f"{name} train" + (f" ({group} probes)" if group > 1 else ""),
                  cfg.epochs * steps_per_epoch, unit="steps", every=1,
                  start=epoch * steps_per_epoch + start)
  checkpointed = any(c is not None for c in ckpts)
  names = [name if group == 1 else f"{name} seed={c.seed}" for c in cfgs]
  logits = None
  logged = -float("inf")  # When an epoch line was last logged at INFO.
  for epoch in range(epoch, cfg.epochs):
    t0, pending = time.perf_counter(), []
    host = [list(x) for x in epoch_losses]
    batches = epoch_batches(epoch, start)
    for i, batch in enumerate(_ahead(batches) if streamed else batches, start=start):
      state, loss = step_fn(state, batch)
      pending.append(loss)
      if streamed and len(pending) > 1:  # Read batches wait for their steps: 2 in flight.
        pending[-2].block_until_ready()
      done = i + 1
      stop = preemption.should_stop()
      due = checkpointed and cfg.checkpoint_every_steps > 0 and (
          done % cfg.checkpoint_every_steps == 0) and done < steps_per_epoch
      if len(pending) == log_every or stop or due:
        window = _check_finite(pending, names, epoch, len(host[0]), steps_per_epoch)
        for h, w in zip(host, window):
          h.extend(w)
        pending = []
        prog.update(len(window[0]), epoch=epoch + 1, loss=float(np.mean(window)))
      if (stop or due) and checkpointed:
        save(epoch, done, host)
      if stop:
        raise preemption.Preempted(f"{name}: stopped at step {done} of epoch {epoch + 1}"
                                   + (" (checkpoint saved)" if checkpointed else ""))
    for h, w in zip(host, _check_finite(pending, names, epoch, len(host[0]), steps_per_epoch)):
      h.extend(w)
    start, epoch_losses = 0, [[] for _ in cfgs]
    prog.done = (epoch + 1) * steps_per_epoch
    logits = predict_all(state)
    seconds = time.perf_counter() - t0
    # Every epoch is in the history (results.json); the console gets the last one and at most
    # one every INTERVAL before it (the others at DEBUG).
    now = time.perf_counter()
    shown = epoch + 1 == cfg.epochs or now - logged >= INTERVAL
    logged = now if shown else logged
    log = logging.info if shown else logging.debug
    for p in range(group):
      record = dict(epoch=epoch + 1, train_loss=float(np.mean(host[p])), seconds=seconds,
                    **score_fn(logits[p]))
      histories[p].append(record)
      log("%s: epoch %d/%d %s", names[p], epoch + 1, cfg.epochs,
          " ".join(f"{k}={v:.4f}" for k, v in record.items() if isinstance(v, float)))
    if checkpointed:
      save(epoch + 1, 0, epoch_losses)
  if logits is None:  # Every epoch was done before: score the restored state.
    logits = predict_all(state)
  return [(row(state, p), histories[p], logits[p]) for p in range(group)]


def restore_final(probe: nn.Module, encoder: FrozenEncoder, tx, cfg: FitConfig,
                  max_length: int) -> Any:
  """The trainable parameters a finished `fit` left in `cfg.checkpoint_dir` (its last epoch)."""
  ckpt = ckpt_lib.Checkpointer(cfg.checkpoint_dir)
  try:
    step = ckpt.latest_step()
    if step is None:
      raise ckpt_lib.CheckpointError(f"No checkpoint in {cfg.checkpoint_dir}: that run has not "
                                     "trained (or its checkpoints were deleted).")
    state, meta = ckpt.restore(step, init_state(probe, encoder, tx, cfg.seed, max_length),
                               cfg.fingerprint)
    if meta.get("epoch") != cfg.epochs or meta.get("step_in_epoch", 0):
      raise ckpt_lib.CheckpointError(f"{cfg.checkpoint_dir} holds epoch {meta.get('epoch')} of "
                                     f"{cfg.epochs}: that run has not finished.")
    return state.params
  finally:
    ckpt.close()


def _check_finite(losses: list, names: list[str], epoch: int, offset: int,
                  steps_per_epoch: int) -> list[list[float]]:
  """Host copies of `losses` (each `[P]`, steps offset+1.. of the epoch), per probe;
  raises on NaN/Inf naming the probe."""
  if not losses:
    return [[] for _ in names]
  values = np.asarray(jax.device_get(losses), np.float64).reshape(len(losses), -1).T
  for name, v in zip(names, values):
    bad = np.flatnonzero(~np.isfinite(v))
    if len(bad):
      raise TrainingDiverged(
          f"{name}: the training loss became {v[bad[0]]} at step "
          f"{epoch * steps_per_epoch + offset + int(bad[0]) + 1} (step {offset + int(bad[0]) + 1}"
          f" of epoch {epoch + 1}); stopping. Lower the learning rate or check the inputs.")
  return values.tolist()
