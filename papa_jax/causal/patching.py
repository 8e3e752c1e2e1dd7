"""Activation patching and attribution patching on encoders, batched over sites.

Activation patching (Meng et al. 2022; Heimersheim & Nanda 2024, "How to use and interpret
activation patching") runs one input (the *target* run, e.g. a corrupted sentence) with one
site's activation taken from another (the *source*, e.g. the clean sentence), and reads how a
metric moves. Here a sweep over (layer, position, head) targets is one jitted function of
traced target arrays: the rows of a batch are (target, example) pairs, chunked over targets so
memory stays bounded, and a new target set never recompiles.

Attribution patching (AtP; Nanda 2023, Kramár et al. 2024) estimates every target's effect at
once to first order: `(source - target activation) . d metric / d activation`, from one
forward and one backward pass (`pj.Add` at zero gives the gradient at every layer).

Sites and their shapes are `attention.SITES` (`docs/override_api.md`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from papa_jax.attention import SITE_AXES, SITES, AttentionOverride
from papa_jax.interventions import Add, Patch
from papa_jax.models.capture import Capture, EncoderOutput

Array = jax.Array
Metric = Callable[[EncoderOutput, dict], Array]
"""`metric(output, batch) -> [B]`: one number per example of a run (a logit difference, a
loss); a pure jax function of the encoder's output and the batch's arrays."""
ABLATIONS = ("zero", "mean", "resample")


@dataclasses.dataclass(frozen=True)
class Targets:
  """What each patch replaces: layer, position (-1: all) and head (-1: all) per target."""

  layers: np.ndarray
  positions: np.ndarray
  heads: np.ndarray

  def __len__(self) -> int:
    return len(self.layers)

  @classmethod
  def grid(cls, num_layers: int, positions=(-1,), heads=(-1,)) -> Targets:
    """Every (layer, position, head) of the given positions and heads, layer-major."""
    l, p, h = np.meshgrid(np.arange(num_layers), np.asarray(positions),
                          np.asarray(heads), indexing="ij")
    return cls(*(np.asarray(a.ravel(), np.int32) for a in (l, p, h)))


def _field(site: str) -> str:
  if site not in SITES:
    raise ValueError(f"site {site!r}; choose one of {SITES}.")  # caller's argument
  return site


def _arrays(batch: dict) -> dict:
  return {k: v for k, v in batch.items() if v is not None}


@functools.partial(jax.jit, static_argnames=("module", "site"))
def _activations(module, params, batch: dict, *, site: str) -> Array:
  out = _run(module, params, batch, None, Capture(**{site: True}))
  acts = jnp.stack(out.per_layer(site))
  return jnp.swapaxes(acts, 2, 3) if site in ("values", "context") else acts  # [.., B, L, H, d]


def activations(model, batch: dict, site: str) -> Array:
  """The site's activation in every layer, `[layers, B, ...]` in the site's layout (the one
  `Patch` and `Add` see: `attention.Intervention`), from one forward pass of `model` (a
  `Pretrained`) on `batch` (input_ids, attention_mask, optional token_type_ids)."""
  return _activations(model.module, model.params, _arrays(batch), site=_field(site))


def ablation_source(acts: Array, mask: np.ndarray, site: str, kind: str, seed: int = 0) -> Array:
  """A source for ablating with `Patch`, from `activations`' `[layers, B, ...]` at `site`:
  "zero"; "mean" (per layer and position, over the examples whose token there is real); or
  "resample" (each example takes another's activations: a seeded derangement)."""
  if kind == "zero":
    return jnp.zeros_like(acts)
  if kind == "mean":
    pos = SITE_AXES[_field(site)][0] + 1  # Positions' axis in [layers, B, ...].
    shape = [1] * acts.ndim
    shape[1], shape[pos] = mask.shape
    m = jnp.asarray(mask, acts.dtype).reshape(shape)
    mean = (acts * m).sum(1, keepdims=True) / jnp.maximum(m.sum(1, keepdims=True), 1)
    return jnp.broadcast_to(mean, acts.shape)
  if kind == "resample":
    n = acts.shape[1]
    perm = np.random.default_rng(seed).permutation(n)
    other = np.empty(n, np.int64)
    other[perm] = np.roll(perm, 1)  # A cycle through a random order: nobody keeps their own.
    return acts[:, other]
  raise ValueError(f"ablation {kind!r}; choose one of {ABLATIONS}.")  # caller's argument


def check_pairs(target_mask: np.ndarray, source_mask: np.ndarray, site: str) -> None:
  """Patching position-wise needs pairs of equal length: raises naming the first pair whose
  real tokens differ."""
  a, b = np.asarray(target_mask, bool), np.asarray(source_mask, bool)
  if a.shape != b.shape:
    raise ValueError(f"the target and source batches have shapes {a.shape} and {b.shape}; "
                     "patching needs one shape.")  # caller's argument
  if SITE_AXES[site][0] is not None:
    bad = np.flatnonzero((a != b).any(-1))
    if len(bad):
      i = int(bad[0])
      raise ValueError(  # caller's argument
          f"pair {i}: the target has {a[i].sum()} tokens and the source {b[i].sum()}; patching "
          f"at {site!r} replaces positions, so each pair needs equal lengths ({len(bad)} "
          "pairs differ).")


def _run(module, params, batch: dict, patch, capture: Capture | None = None) -> EncoderOutput:
  return module.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                      batch.get("token_type_ids"), capture=capture,
                      override=None if patch is None else AttentionOverride.intervene(patch))


@functools.partial(jax.jit, static_argnames=("module", "metric", "site"))
def _patched(module, params, batch: dict, source: Array, layers, positions, heads, *,
             metric: Metric, site: str) -> Array:
  """`metric` of the rows of `batch` (examples tiled per target) with `source[layer, example]`
  patched in."""
  n = source.shape[1]
  example = jnp.arange(layers.shape[0]) % n
  rows = source[jnp.maximum(layers, 0), example]
  return metric(_run(module, params, batch, Patch(rows, layers, positions, heads, site=site)),
                batch)


def sweep(model, batch: dict, source: Array, site: str, targets: Targets, metric: Metric, *,
          chunk: int = 16) -> np.ndarray:
  """Exact activation patching: `metric` on `batch` with `source[layer]` (`[layers, B, ...]`,
  `activations` of the source run or `ablation_source`) patched in at each target, `[T, B]`.

  The rows of one call are `chunk` targets times the batch's B examples (one compile for every
  chunk: the last is padded with layer -1, which patches nothing)."""
  n = batch["input_ids"].shape[0]
  if source.shape[1] != n:
    raise ValueError(f"source has {source.shape[1]} examples; the batch {n}.")  # caller's
  tiled = {k: jnp.tile(jnp.asarray(v), (chunk,) + (1,) * (np.ndim(v) - 1))
           for k, v in _arrays(batch).items()}
  out = []
  for start in range(0, len(targets), chunk):
    part = [np.full(chunk, -1, np.int32) for _ in range(3)]
    for p, full in zip(part, (targets.layers, targets.positions, targets.heads)):
      got = full[start:start + chunk]
      p[:len(got)] = got
    rows = [jnp.asarray(np.repeat(p, n)) for p in part]
    vals = _patched(model.module, model.params, tiled, source, *rows, metric=metric, site=site)
    out.append(np.asarray(vals).reshape(chunk, n)[:min(chunk, len(targets) - start)])
  return np.concatenate(out) if out else np.zeros((0, n), np.float32)


@functools.partial(jax.jit, static_argnames=("module", "metric"))
def _metric(module, params, batch: dict, *, metric: Metric) -> Array:
  return metric(_run(module, params, batch, None), batch)


def run_metric(model, batch: dict, metric: Metric) -> np.ndarray:
  """`metric` of the unpatched run, `[B]`."""
  return np.asarray(_metric(model.module, model.params, _arrays(batch), metric=metric))


@functools.partial(jax.jit, static_argnames=("module", "metric", "site"))
def _gradients(module, params, batch: dict, zeros: Array, *, metric: Metric, site: str) -> Array:
  def total(delta):
    return metric(_run(module, params, batch, Add(delta, site=site)), batch).sum()
  return jax.grad(total)(zeros)


def gradients(model, batch: dict, site: str, metric: Metric) -> Array:
  """d sum(metric) / d activation at the site of every layer, `[layers, B, ...]` (the site's
  layout), from one forward and one backward pass."""
  acts = activations(model, batch, site)
  return _gradients(model.module, model.params, _arrays(batch), jnp.zeros_like(acts),
                    metric=metric, site=site)


def attribution(model, batch: dict, source: Array, site: str, metric: Metric) -> np.ndarray:
  """AtP: the first-order estimate of every (layer, example, position, head) patch's effect,
  `(source - activation) . gradient`, `[layers, B, L, H]` (H = 1 at sites without heads); a
  target's estimate is the sum over its positions and heads (`at_targets`)."""
  diff = source - activations(model, batch, site)
  contrib = diff * gradients(model, batch, site, metric)
  if site == "probs":  # [layers, B, H, Lq, Lk]: sum over keys, positions before heads.
    return np.asarray(jnp.swapaxes(contrib.sum(-1), 2, 3))
  if SITE_AXES[site][1] is None:  # [layers, B, L, D]
    return np.asarray(contrib.sum(-1))[..., None]
  return np.asarray(contrib.sum(-1))  # [layers, B, L, H, d] -> [layers, B, L, H]


def at_targets(per_site: np.ndarray, targets: Targets) -> np.ndarray:
  """`attribution`'s `[layers, B, L, H]` summed over each target's positions and heads,
  `[T, B]`: the estimate of what `sweep` measures."""
  out = np.empty((len(targets), per_site.shape[1]), per_site.dtype)
  for t, (l, p, h) in enumerate(zip(targets.layers, targets.positions, targets.heads)):
    x = per_site[l]
    x = x if p < 0 else x[:, p:p + 1]
    out[t] = (x if h < 0 else x[..., h:h + 1]).sum((1, 2))
  return out


def patch(model, target: dict, source: dict, site: str, targets: Targets, metric: Metric, *,
          chunk: int = 16) -> dict[str, np.ndarray]:
  """Activation patching of `source`'s activations (e.g. clean) into `target` (e.g. corrupt)
  at each of `targets`: `patched [T, B]`, and the unpatched `target` and `source` metrics
  `[B]` (the effect of a patch is `patched - target`; normalised, divide by
  `source - target`). Pairs must have equal lengths where positions are patched."""
  check_pairs(target["attention_mask"], source["attention_mask"], site)
  acts = activations(model, source, site)
  return dict(patched=sweep(model, target, acts, site, targets, metric, chunk=chunk),
              target=run_metric(model, target, metric), source=run_metric(model, source, metric))


def attribution_patch(model, target: dict, source: dict, site: str, targets: Targets,
                      metric: Metric) -> np.ndarray:
  """AtP's estimate of `patch(...)["patched"] - patch(...)["target"]`, `[T, B]`, from one
  forward and one backward pass over `target` (and one forward over `source`)."""
  check_pairs(target["attention_mask"], source["attention_mask"], site)
  return at_targets(attribution(model, target, activations(model, source, site), site, metric),
                    targets)
