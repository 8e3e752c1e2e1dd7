"""Probe training on a frozen encoder: the representation, the steps, the loop.

The trainable tree is `{"probe": ...}`, plus `"gates"` for PAPA head sorting.
Without gates the encoder's forward pass runs outside the differentiated
function, so the compiled step holds no backward pass through the encoder by
construction. With gates the backward pass must run through it (the gates sit
in every layer), but the encoder weights are data, never differentiated.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from papa_jax import attention as attn
from papa_jax import checkpoint as ckpt_lib
from papa_jax import metrics, parallel, preemption, probes
from papa_jax.data import pipeline
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import DTYPES, Encoder
from papa_jax.progress import Progress

Array = jax.Array


@flax.struct.dataclass
class TrainState:
  step: Array
  params: Any
  opt_state: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FrozenEncoder:
  """The frozen encoder as a representation function (scenic's `representation_fn`).

  A pytree: the parameters and the override's arrays are traced data, so new
  constant matrices or gate values never recompile; the architecture, the
  static-head selection and the dropout choice are static.

  Attributes:
    params: encoder parameters.
    override: an `AttentionOverride`, or None.
    config: the architecture.
    dropout: keep the encoder's dropout on while training (as the paper does).
    feature_dtype: dtype of the features fed to the probe ("float32" or
      "bfloat16"; the dtype of cached features).
  """

  params: Any
  override: attn.AttentionOverride | None
  config: EncoderConfig = dataclasses.field(metadata=dict(static=True))
  dropout: bool = dataclasses.field(default=False, metadata=dict(static=True))
  feature_dtype: str = dataclasses.field(default="float32", metadata=dict(static=True))

  @property
  def gated(self) -> bool:
    return self.override is not None and self.override.gate_logits is not None

  def features(self, batch: dict, *, train: bool, rng=None, gates: Array | None = None) -> Array:
    """Stacked hidden states `[B, K, L, D]` in `feature_dtype`."""
    override = self.override if gates is None else self.override.with_gates(gates)
    deterministic = not (train and self.dropout)
    out = Encoder(self.config).apply(
        {"params": self.params}, batch["input_ids"], batch["attention_mask"],
        batch["token_type_ids"], override=override, deterministic=deterministic,
        rngs=None if deterministic else {"dropout": rng})
    return jnp.stack(out.hidden_states, axis=1).astype(DTYPES[self.feature_dtype])

  def feature_shape(self, max_length: int) -> tuple[int, int, int]:
    return self.config.num_hidden_states, max_length, self.config.hidden_size


def make_optimizer(cfg, gate_learning_rate: float | None = None) -> optax.GradientTransformation:
  """Clip the global norm of all trainable grads, then AdamW (HF's recipe)."""
  def adamw(lr):
    return optax.adamw(lr, b1=cfg.adam_b1, b2=cfg.adam_b2, eps=cfg.adam_eps,
                       weight_decay=cfg.weight_decay)
  if gate_learning_rate is None:
    inner = adamw(cfg.learning_rate)
  else:
    inner = optax.multi_transform(
        {"probe": adamw(cfg.learning_rate), "gates": adamw(gate_learning_rate)},
        lambda params: {k: k for k in params})
  if cfg.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), inner)
  return inner


def init_state(probe: nn.Module, encoder: FrozenEncoder, tx, seed: int,
               max_length: int) -> TrainState:
  k, l, d = encoder.feature_shape(max_length)
  dummy = jnp.zeros((1, k, l, d), jnp.float32)
  params = {"probe": probe.init(jax.random.key(seed), dummy, jnp.ones((1, l)))["params"]}
  if encoder.gated:
    params["gates"] = jnp.zeros(encoder.override.gate_logits.shape, jnp.float32)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def _inputs(encoder: FrozenEncoder, batch: dict, **kwargs) -> Array:
  """Cached features when the batch has them, else the encoder's."""
  return batch["features"] if "features" in batch else encoder.features(batch, **kwargs)


def make_train_step(probe: nn.Module, tx, seed: int) -> Callable:
  """`step(state, batch, encoder) -> (state, loss)`; batches hold inputs or `features`."""
  base = jax.random.key(seed + 1)

  def probe_loss(probe_params, feats, batch, rng):
    logits = probe.apply({"params": probe_params}, feats, batch["attention_mask"],
                         deterministic=False, rngs={"dropout": rng})
    return probes.loss_fn(probe.kind, logits, batch["labels"], batch["valid"])[0]

  def step(state: TrainState, batch, encoder: FrozenEncoder):
    enc_rng, probe_rng = jax.random.split(jax.random.fold_in(base, state.step))
    if "gates" in state.params:  # Head sorting: the gates' gradient runs through the encoder.
      def loss(trainable):
        feats = encoder.features(batch, train=True, rng=enc_rng, gates=trainable["gates"])
        return probe_loss(trainable["probe"], feats, batch, probe_rng)
      value, grads = jax.value_and_grad(loss)(state.params)
    else:  # The encoder's forward pass stays outside the differentiated function.
      feats = _inputs(encoder, batch, train=True, rng=enc_rng)
      value, g = jax.value_and_grad(probe_loss)(state.params["probe"], feats, batch, probe_rng)
      grads = {"probe": g}
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), value

  return step


def make_eval_step(probe: nn.Module) -> Callable:
  def step(params, batch, encoder: FrozenEncoder):
    feats = _inputs(encoder, batch, train=False, gates=params.get("gates"))
    return probe.apply({"params": params["probe"]}, feats, batch["attention_mask"],
                       deterministic=True)
  return step


@dataclasses.dataclass(frozen=True)
class FitConfig:
  """The loop's settings (from `config.probe` or `config.sort`, and `config.run`).

  `checkpoint_every_steps` adds checkpoints within an epoch (0: at epoch ends
  only); a resumed run equals an uninterrupted one either way.
  """

  epochs: int
  batch_size: int
  eval_batch_size: int
  seed: int
  log_every_steps: int = 50
  checkpoint_dir: str = ""
  fingerprint: str = ""
  checkpoint_every_steps: int = 0

  @classmethod
  def from_config(cls, config, epochs: int, seed: int, checkpoint_dir: str,
                  fingerprint: str) -> FitConfig:
    """A run's settings from the experiment config (`probe` and `run` groups)."""
    return cls(epochs=epochs, batch_size=config.probe.batch_size,
               eval_batch_size=config.run.batch_size, seed=seed,
               log_every_steps=config.run.log_every_steps, checkpoint_dir=checkpoint_dir,
               fingerprint=fingerprint, checkpoint_every_steps=config.run.checkpoint_every_steps)


def probe_module(task, model_config: EncoderConfig, probe_config) -> nn.Module:
  """The task's probe for this encoder (`config.probe.probe_dropout` < 0: the checkpoint's)."""
  p = probe_config.probe_dropout
  rate = p if p >= 0 else model_config.probe_dropout
  return probes.make_probe(task.kind, task.num_labels, model_config.hidden_size, rate)


def scorer(task, labels: np.ndarray) -> Callable[[np.ndarray], dict]:
  """Scores probe outputs (logits) against `labels` with every metric of `task`."""
  return lambda logits: metrics.task_scores(task, logits, labels)


def resident_table(data, mesh) -> dict | None:
  """Cached features kept on the device for the whole fit (one-device, one-process meshes).

  Each batch is then gathered on the device, with no host copy per step (the
  gathered rows are the same; padding rows differ only in content the loss
  masks out). Elsewhere, None: each process gathers its rows on the host.
  """
  if not hasattr(data, "features") or mesh.size != 1 or jax.process_count() != 1:
    return None
  return {k: jnp.asarray(v) for k, v in pipeline.columns(data).items()}


def device_batches(data, table: dict | None, batch_size: int, mesh, *, seed: int, epoch: int,
                   start: int = 0):
  """One epoch's shuffled training batches on the mesh, from batch `start`."""
  if table is None:
    for batch in pipeline.batches(data, batch_size, shuffle=True, seed=seed, epoch=epoch,
                                  start=start):
      yield parallel.put_batch(pipeline.host_slice(batch), mesh)
    return
  order = pipeline.epoch_order(pipeline.num_rows(data), shuffle=True, seed=seed, epoch=epoch)
  for idx in pipeline.batch_indices(order, batch_size)[start:]:
    yield _take(table, jnp.asarray(idx, jnp.int32))


@jax.jit
def _take(table: dict, idx: Array) -> dict:
  valid = idx >= 0
  return dict({k: v[jnp.maximum(idx, 0)] for k, v in table.items()}, valid=valid)


def predict(eval_fn, params, encoder: FrozenEncoder, data, mesh, batch_size: int) -> np.ndarray:
  """Probe outputs for every example of `data`, in order (padding removed)."""
  outs = [out[valid] for _, out, valid in parallel.map_batches(
      lambda b: eval_fn(params, b, encoder), data, batch_size=batch_size, mesh=mesh)]
  return np.concatenate(outs)


def fit(name: str, probe: nn.Module, encoder: FrozenEncoder, tx, cfg: FitConfig, train_data,
        eval_data, score_fn: Callable[[np.ndarray], dict],
        mesh) -> tuple[TrainState, list[dict], np.ndarray]:
  """Trains `probe` for `cfg.epochs`, evaluating each epoch; resumable.

  The data order of epoch e depends only on (seed, e) and dropout keys only on
  the step, so resuming from a checkpoint (at an epoch end, or within an epoch
  every `cfg.checkpoint_every_steps` steps, or on preemption) gives the same
  result as an uninterrupted run.

  Returns:
    The final state, the per-epoch history (train loss, eval scores, time), and
    the last epoch's eval outputs (logits) for every eval example.
  """
  repl, shard = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  state = jax.device_put(init_state(probe, encoder, tx, cfg.seed, eval_data.max_length), repl)
  encoder = parallel.put_replicated(encoder, mesh)
  train_step = jax.jit(make_train_step(probe, tx, cfg.seed), in_shardings=(repl, shard, repl),
                       out_shardings=(repl, repl), donate_argnums=0)
  eval_fn = jax.jit(make_eval_step(probe), in_shardings=(repl, shard, repl), out_shardings=repl)

  n = pipeline.num_rows(train_data)
  steps_per_epoch = pipeline.num_batches(n, cfg.batch_size)
  history: list[dict] = []
  epoch, start, epoch_losses = 0, 0, []
  ckpt = ckpt_lib.Checkpointer(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
  if ckpt is not None and ckpt.latest_step() is not None:
    state, meta = ckpt.restore(ckpt.latest_step(), state, cfg.fingerprint)
    history, epoch = meta["history"], meta["epoch"]
    start, epoch_losses = meta.get("step_in_epoch", 0), meta.get("epoch_losses", [])
    logging.info("%s: resumed after epoch %d%s from %s.", name, epoch,
                 f", step {start} of epoch {epoch + 1}" if start else "", ckpt.directory)

  def save(epoch_done: int, step_in_epoch: int, losses: list[float]) -> None:
    global_step = epoch_done * steps_per_epoch + step_in_epoch
    ckpt.save(global_step, state, dict(fingerprint=cfg.fingerprint, epoch=epoch_done,
                                       step_in_epoch=step_in_epoch, epoch_losses=losses,
                                       history=history))

  table = resident_table(train_data, mesh)
  log_every = max(1, min(cfg.log_every_steps, steps_per_epoch))
  prog = Progress(f"{name} train", cfg.epochs * steps_per_epoch, unit="steps", every=1,
                  start=epoch * steps_per_epoch + start)
  logits = None
  for epoch in range(epoch, cfg.epochs):
    t0, pending = time.perf_counter(), []
    host = list(epoch_losses)
    for i, batch in enumerate(device_batches(train_data, table, cfg.batch_size, mesh,
                                             seed=cfg.seed, epoch=epoch, start=start),
                              start=start):
      state, loss = train_step(state, batch, encoder)
      pending.append(loss)
      done = i + 1
      stop = preemption.should_stop()
      due = ckpt is not None and cfg.checkpoint_every_steps > 0 and (
          done % cfg.checkpoint_every_steps == 0) and done < steps_per_epoch
      if len(pending) == log_every or stop or due:
        window = _check_finite(pending, name, epoch, len(host), steps_per_epoch)
        host.extend(window)
        pending = []
        prog.update(len(window), epoch=epoch + 1, loss=float(np.mean(window)))
      if (stop or due) and ckpt is not None:
        save(epoch, done, host)
      if stop:
        raise preemption.Preempted(f"{name}: stopped at step {done} of epoch {epoch + 1}"
                                   + (" (checkpoint saved)" if ckpt is not None else ""))
    host.extend(_check_finite(pending, name, epoch, len(host), steps_per_epoch))
    start, epoch_losses = 0, []
    prog.done = (epoch + 1) * steps_per_epoch
    logits = predict(eval_fn, state.params, encoder, eval_data, mesh, cfg.eval_batch_size)
    record = dict(epoch=epoch + 1, train_loss=float(np.mean(host)),
                  seconds=time.perf_counter() - t0, **score_fn(logits))
    history.append(record)
    logging.info("%s: epoch %d/%d %s", name, epoch + 1, cfg.epochs,
                 " ".join(f"{k}={v:.4f}" for k, v in record.items() if isinstance(v, float)))
    if ckpt is not None:
      save(epoch + 1, 0, [])
  if logits is None:  # Every epoch was done before: score the restored state.
    logits = predict(eval_fn, state.params, encoder, eval_data, mesh, cfg.eval_batch_size)
  if ckpt is not None:
    ckpt.close()
  return state, history, logits


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


def _check_finite(losses: list, name: str, epoch: int, offset: int,
                  steps_per_epoch: int) -> list[float]:
  """Host copies of `losses` (steps offset+1.. of the epoch); raises on NaN/Inf."""
  if not losses:
    return []
  values = np.asarray(jax.device_get(losses), np.float64).reshape(-1)
  bad = np.flatnonzero(~np.isfinite(values))
  if len(bad):
    raise FloatingPointError(
        f"{name}: the training loss became {values[bad[0]]} at step "
        f"{epoch * steps_per_epoch + offset + int(bad[0]) + 1} (step {offset + int(bad[0]) + 1}"
        f" of epoch {epoch + 1}); stopping. Lower the learning rate or check the inputs.")
  return values.tolist()
