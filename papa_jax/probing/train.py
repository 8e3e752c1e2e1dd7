"""Probe training on a frozen encoder: the representation and the steps (the loop: `fitting`).

The trainable tree is `{"probe": ...}`, plus `"gates"` for PAPA head sorting.
Without gates the encoder's forward pass runs outside the differentiated
function, so the compiled step holds no backward pass through the encoder by
construction. With gates the backward pass must run through it (the gates sit
in every layer), but the encoder weights are data, never differentiated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from papa_jax import attention as attn
from papa_jax.probing import metrics, probes
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import DTYPES, Encoder

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
    fit_constants: train the static heads' constants as free logits (the
      loss-optimal constant, `papa/constants.py`), starting from the log of the
      override's constants.
  """

  params: Any
  override: attn.AttentionOverride | None
  config: EncoderConfig = dataclasses.field(metadata=dict(static=True))
  dropout: bool = dataclasses.field(default=False, metadata=dict(static=True))
  feature_dtype: str = dataclasses.field(default="float32", metadata=dict(static=True))
  fit_constants: bool = dataclasses.field(default=False, metadata=dict(static=True))

  @property
  def gated(self) -> bool:
    return self.override is not None and self.override.gate_logits is not None

  def trainable(self) -> dict[str, Array]:
    """The override's arrays a fit trains beside the probe (their gradient runs through the
    encoder): PAPA's gates (from 0), or the constants' logits (from log of the constants)."""
    if self.gated:
      return {"gates": jnp.zeros(self.override.gate_logits.shape, jnp.float32)}
    if self.fit_constants:
      return {"constant_logits": constant_logits(self.override.constants)}
    return {}

  def features(self, batch: dict, *, train: bool, rng=None, gates: Array | None = None,
               constant_logits: Array | None = None) -> Array:
    """Stacked hidden states `[B, K, L, D]` in `feature_dtype`; `gates` or `constant_logits`
    (`trainable`) replace the override's."""
    override = self.override if gates is None else self.override.with_gates(gates)
    if constant_logits is not None:
      override = dataclasses.replace(override, constants=jax.nn.softmax(constant_logits, -1))
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
  else:  # The override's trainable arrays (gates or constant logits) get their own rate.
    inner = optax.multi_transform(
        {"probe": adamw(cfg.learning_rate), "override": adamw(gate_learning_rate)},
        lambda params: {k: "probe" if k == "probe" else "override" for k in params})
  if cfg.grad_clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(cfg.grad_clip_norm), inner)
  return inner


def constant_logits(constants: Array) -> Array:
  """Logits whose row softmax, masked and renormalised like every constant, is the constant
  itself: the log, with never-seen cells (0) at log(1e-30), effectively 0 mass."""
  return jnp.log(jnp.maximum(jnp.asarray(constants, jnp.float32), 1e-30))


def init_state(probe: nn.Module, encoder: FrozenEncoder, tx, seed: int, max_length: int,
               init_probe: Any = None) -> TrainState:
  """A fresh state: the probe initialised from `seed` (or a copy of `init_probe`), the
  encoder's trainable arrays at their start, a fresh optimiser state."""
  if init_probe is None:
    k, l, d = encoder.feature_shape(max_length)
    dummy = jnp.zeros((1, k, l, d), jnp.float32)
    init_probe = probe.init(jax.random.key(seed), dummy, jnp.ones((1, l)))["params"]
  else:  # A copy: the train step donates its state, never the caller's arrays.
    init_probe = jax.tree.map(jnp.array, init_probe)
  params = {"probe": init_probe, **encoder.trainable()}
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
    if len(state.params) > 1:  # Gates or constants: their gradient runs through the encoder.
      def loss(trainable):
        feats = encoder.features(batch, train=True, rng=enc_rng,
                                 **{k: v for k, v in trainable.items() if k != "probe"})
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
    feats = _inputs(encoder, batch, train=False,
                    **{k: v for k, v in params.items() if k != "probe"})
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


def predictions(kind: str, logits: np.ndarray) -> np.ndarray:
  """A probe's predictions from its outputs: class (or tag) ids, or the regression value."""
  if kind == "regression":
    return logits[:, 0].astype(np.float32)
  return logits.argmax(-1).astype(np.int32)


@jax.jit
def take(table: dict, idx: Array) -> dict:
  """Rows `idx` of every array of `table` (-1: a padding row, `valid` False)."""
  valid = idx >= 0
  return dict({k: v[jnp.maximum(idx, 0)] for k, v in table.items()}, valid=valid)


def make_group_step(probe: nn.Module, tx) -> Callable:
  """`step(states, table, idx [P, B], seeds [P]) -> (states, losses [P])`: P probes at once
  (vmapped), probe p on rows `idx[p]` of the cached-feature `table`, each step exactly
  `make_train_step(probe, tx, seeds[p])` (its own dropout keys and data order)."""
  def step(states: TrainState, table: dict, idx: Array, seeds: Array):
    one = lambda state, i, seed: make_train_step(probe, tx, seed)(state, take(table, i), None)
    return jax.vmap(one)(states, idx, seeds)
  return step
