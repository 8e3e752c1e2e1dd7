"""Probe training on a frozen encoder: the step, evaluation and the epoch loop.

The trainable tree is `{"probe": ..., "gates": ...}` ("gates" only for PAPA
head sorting). Encoder parameters are an input that is never differentiated;
without gates the encoder's outputs also pass `jax.lax.stop_gradient`, so the
compiled step holds no backward pass through the encoder. With gates the
backward pass must run through it (the gates sit in every layer), but the
encoder weights still get no gradient.
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
from papa_jax import parallel, probes
from papa_jax.data import pipeline
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder
from papa_jax.progress import Progress

Array = jax.Array
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@flax.struct.dataclass
class TrainState:
  step: Array
  params: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
  """How the frozen encoder produces probe features.

  Attributes:
    config: the encoder architecture.
    static_heads: boolean [layers, heads] (PAPA runs), or None.
    gated: mix every head with its constant through trainable gates (sorting).
    dropout: keep the encoder's dropout on while training (as the paper does).
    feature_dtype: dtype the hidden states are cast to before the probe
      (the dtype of cached features; "float32" or "bfloat16").
  """

  config: EncoderConfig
  static_heads: tuple | None = None
  gated: bool = False
  dropout: bool = False
  feature_dtype: str = "float32"

  def __post_init__(self):
    object.__setattr__(self, "static_heads", attn.as_static_heads(self.static_heads))

  def override(self, constants, gates) -> attn.AttentionOverride | None:
    if self.gated:
      return attn.AttentionOverride(constants=constants, gate_logits=gates)
    if self.static_heads is not None and np.any(self.static_heads):
      return attn.AttentionOverride(constants=constants, static_heads=self.static_heads)
    return None

  def features(self, enc_params, constants, gates, batch, *, train: bool, rng=None) -> Array:
    """Stacked hidden states `[B, K, L, D]` in `feature_dtype`."""
    deterministic = not (train and self.dropout)
    out = Encoder(self.config).apply(
        {"params": enc_params}, batch["input_ids"], batch["attention_mask"],
        batch["token_type_ids"], override=self.override(constants, gates),
        deterministic=deterministic, rngs=None if deterministic else {"dropout": rng})
    feats = jnp.stack(out.hidden_states, axis=1).astype(DTYPES[self.feature_dtype])
    return feats if self.gated else jax.lax.stop_gradient(feats)


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


def init_state(probe: nn.Module, spec: EncoderSpec, tx, seed: int, max_length: int) -> TrainState:
  c = spec.config
  dummy = jnp.zeros((1, c.num_hidden_states, max_length, c.hidden_size), jnp.float32)
  params = {"probe": probe.init(jax.random.key(seed), dummy, jnp.ones((1, max_length)))["params"]}
  if spec.gated:
    params["gates"] = jnp.zeros((c.num_layers, c.num_heads), jnp.float32)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def make_train_step(probe: nn.Module, kind: str, spec: EncoderSpec, tx, seed: int) -> Callable:
  """`step(state, batch, enc_params, constants) -> (state, loss)`.

  A batch holds either encoder inputs or precomputed `features`.
  """
  base = jax.random.key(seed + 1)

  def loss(trainable, enc_params, constants, batch, rng):
    enc_rng, probe_rng = jax.random.split(rng)
    if "features" in batch:
      feats = batch["features"]
    else:
      feats = spec.features(enc_params, constants, trainable.get("gates"), batch,
                            train=True, rng=enc_rng)
    logits = probe.apply({"params": trainable["probe"]}, feats, batch["attention_mask"],
                         deterministic=False, rngs={"dropout": probe_rng})
    return probes.loss_fn(kind, logits, batch["labels"], batch["valid"])[0]

  def step(state: TrainState, batch, enc_params, constants):
    rng = jax.random.fold_in(base, state.step)
    value, grads = jax.value_and_grad(loss)(state.params, enc_params, constants, batch, rng)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), value

  return step


def make_eval_step(probe: nn.Module, spec: EncoderSpec) -> Callable:
  def step(params, batch, enc_params, constants):
    if "features" in batch:
      feats = batch["features"]
    else:
      feats = spec.features(enc_params, constants, params.get("gates"), batch, train=False)
    return probe.apply({"params": params["probe"]}, feats, batch["attention_mask"],
                       deterministic=True)
  return step


@dataclasses.dataclass
class FitConfig:
  """What the epoch loop needs from `config.probe` (or `config.sort`)."""

  epochs: int
  batch_size: int
  eval_batch_size: int
  seed: int
  log_every_steps: int = 50


def predict(eval_fn, params, data, enc_params, constants, mesh, batch_size: int) -> np.ndarray:
  """Logits for every example of `data`, in order (padding removed)."""
  outs = []
  for batch in pipeline.batches(data, batch_size):
    valid = batch["valid"]
    logits = eval_fn(params, parallel.put_batch(pipeline.host_slice(batch), mesh),
                     enc_params, constants)
    outs.append(np.asarray(jax.device_get(logits))[valid])  # Replicated output.
  return np.concatenate(outs)


def fit(*, name: str, probe: nn.Module, kind: str, spec: EncoderSpec, tx, fit_cfg: FitConfig,
        train_data, eval_data, enc_params, constants, mesh, score_fn: Callable[[np.ndarray], dict],
        ckpt_dir: str | None, fingerprint: str, max_length: int) -> tuple[TrainState, list[dict]]:
  """Trains `probe` for `fit_cfg.epochs`, evaluating and checkpointing each epoch.

  Resumes from the latest checkpoint in `ckpt_dir` (epoch granularity): the
  data order of epoch e depends only on (seed, e) and dropout keys only on
  the step, so a resumed run equals an uninterrupted one.

  Returns:
    The final state and the per-epoch history (train loss, eval scores, time).
  """
  parallel.check_batch_size(fit_cfg.batch_size, mesh, "batch_size")
  parallel.check_batch_size(fit_cfg.eval_batch_size, mesh, "eval_batch_size")
  repl, shard = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  state = init_state(probe, spec, tx, fit_cfg.seed, max_length)
  state = jax.device_put(state, repl)
  enc_params = parallel.put_replicated(enc_params, mesh)
  constants = None if constants is None else parallel.put_replicated(constants, mesh)
  train_step = jax.jit(make_train_step(probe, kind, spec, tx, fit_cfg.seed),
                       in_shardings=(repl, shard, repl, repl), out_shardings=(repl, repl),
                       donate_argnums=0)
  eval_fn = jax.jit(make_eval_step(probe, spec), in_shardings=(repl, shard, repl, repl),
                    out_shardings=repl)

  history: list[dict] = []
  start_epoch = 0
  ckpt = ckpt_lib.Checkpointer(ckpt_dir) if ckpt_dir else None
  if ckpt is not None and ckpt.latest_step() is not None:
    state, meta = ckpt.restore(ckpt.latest_step(), state, fingerprint)
    history, start_epoch = meta["history"], meta["epoch"]
    logging.info("%s: resumed after epoch %d from %s.", name, start_epoch, ckpt.directory)

  n = len(train_data) if not isinstance(train_data, dict) else len(train_data["labels"])
  steps_per_epoch = pipeline.num_batches(n, fit_cfg.batch_size)
  log_every = max(1, min(fit_cfg.log_every_steps, steps_per_epoch))
  prog = Progress(f"{name} train", fit_cfg.epochs * steps_per_epoch, unit="steps",
                  every=1, start=start_epoch * steps_per_epoch)
  for epoch in range(start_epoch, fit_cfg.epochs):
    t0, losses, host_losses = time.perf_counter(), [], []
    for batch in pipeline.batches(train_data, fit_cfg.batch_size, shuffle=True,
                                  seed=fit_cfg.seed, epoch=epoch):
      state, loss = train_step(state, parallel.put_batch(pipeline.host_slice(batch), mesh),
                               enc_params, constants)
      losses.append(loss)
      if len(losses) % log_every == 0:
        window = _check_finite(losses[len(host_losses):], name, epoch, len(host_losses), steps_per_epoch)
        host_losses.extend(window)
        prog.update(len(window), epoch=epoch + 1, loss=float(np.mean(window)))
    host_losses.extend(_check_finite(losses[len(host_losses):], name, epoch, len(host_losses), steps_per_epoch))
    prog.done = (epoch + 1) * steps_per_epoch
    logits = predict(eval_fn, state.params, eval_data, enc_params, constants, mesh,
                     fit_cfg.eval_batch_size)
    scores = score_fn(logits)
    record = dict(epoch=epoch + 1, train_loss=float(np.mean(host_losses)),
                  seconds=time.perf_counter() - t0, **scores)
    history.append(record)
    logging.info("%s: epoch %d/%d %s", name, epoch + 1, fit_cfg.epochs,
                 " ".join(f"{k}={v:.4f}" for k, v in record.items() if isinstance(v, float)))
    if ckpt is not None:
      ckpt.save(epoch + 1, state, dict(fingerprint=fingerprint, epoch=epoch + 1, history=history))
  if ckpt is not None:
    ckpt.close()
  return state, history


def _check_finite(losses: list, name: str, epoch: int, offset: int,
                  steps_per_epoch: int) -> list[float]:
  """Host copies of `losses` (steps offset+1.. of the epoch); raises on NaN/Inf."""
  values = np.asarray(jax.device_get(losses), np.float64).reshape(-1)
  bad = np.flatnonzero(~np.isfinite(values))
  if len(bad):
    raise FloatingPointError(
        f"{name}: the training loss became {values[bad[0]]} at step "
        f"{epoch * steps_per_epoch + offset + int(bad[0]) + 1} (step {offset + int(bad[0]) + 1}"
        f" of epoch {epoch + 1}); stopping. Lower the learning rate or check the inputs.")
  return values.tolist()
