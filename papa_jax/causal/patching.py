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
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from papa_jax import parallel
from papa_jax.attention import SITE_AXES, SITES, AttentionOverride
from papa_jax.causal.metrics import Metric, as_metric
from papa_jax.interventions import Add, Patch, StopGradient
from papa_jax.models.capture import Capture, EncoderOutput
from papa_jax.models.encoder import run_from
from papa_jax.progress import Progress

Array = jax.Array
# A metric, `metric(output, batch) -> [B]`: one number per example of a run (a logit
# difference, a loss); a `metrics.Metric` (its arrays traced: one program per shape) or any pure
# jax function of the encoder's output and the batch's arrays (one program per function).
ABLATIONS = ("zero", "mean", "resample")
ATTRIBUTIONS = ("atp", "grad_drop")  # attribution_patch's methods.


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


def _captured(out: EncoderOutput, sites: tuple[str, ...]) -> dict[str, Array]:
  """The sites' captured activations, `[layers, B, ...]` in each site's layout."""
  acts = {site: jnp.stack(out.per_layer(site)) for site in sites}
  return {site: jnp.swapaxes(a, 2, 3) if site in ("values", "context") else a  # [.., L, H, d]
          for site, a in acts.items()}


@functools.partial(jax.jit, static_argnames=("module", "sites"))
def _activations(module, params, batch: dict, *, sites: tuple[str, ...]) -> dict[str, Array]:
  return _captured(_run(module, params, batch, None, Capture(**{site: True for site in sites})),
                   sites)


def activations(model, batch: dict, site: str) -> Array:
  """The site's activation in every layer, `[layers, B, ...]` in the site's layout (the one
  `Patch` and `Add` see: `attention.Intervention`), from one forward pass of `model` (a
  `Pretrained`) on `batch` (input_ids, attention_mask, optional token_type_ids)."""
  return _activations(model.module, model.params, _arrays(batch), sites=(_field(site),))[site]


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


@functools.partial(jax.jit, static_argnames=("module", "layer"))
def _hidden(module, params, batch: dict, *, layer: int) -> Array:
  """The target run's hidden states `[layer + 1, B, L, D]` (the inputs of layers 0..layer)."""
  return jnp.stack(_run(module, params, batch, None).hidden_states[:layer + 1])


def earlier_rows(hidden: Array, example: Array, layer: int) -> list[Array]:
  """The cached states entering layers 0..layer for each row (`hidden[i][example]`), one
  gather per layer, so XLA drops those the metric never reads (`run_from`'s `earlier`)."""
  return [hidden[i][example] for i in range(layer + 1)]


@functools.partial(jax.jit, static_argnames=("module", "site", "layer", "mesh"))
def _patched(module, params, hidden: Array, source: Array, metric: Metric, batch: dict, example,
             positions, heads, *, site: str, layer: int, mesh=None) -> Array:
  """`metric` of the rows of `batch` (examples tiled per target; row r is example
  `example[r]`) with `source[layer, example]` patched in at `layer`: the encoder runs from
  `layer` on, from the target run's input to it (`hidden`: the earlier layers are the target
  run's, so nothing before is recomputed). Rows split over `mesh` (`parallel.over_rows`)."""
  def rows(params, hidden, source, metric, batch, example, positions, heads):
    layers = jnp.full(positions.shape, layer, jnp.int32)
    patch = Patch(source[layer][example], layers, positions, heads, site=site)
    out = run_from(module, params, batch, earlier_rows(hidden, example, layer),
                   AttentionOverride.intervene(patch), layer)
    return metric(out, batch)
  return parallel.over_rows(rows, mesh, shared=4)(params, hidden, source, metric, batch,
                                                  example, positions, heads)


def layer_groups(start_layers: np.ndarray, arrays: dict, chunk: int, devices: int = 1
                 ) -> tuple[list[np.ndarray], int, dict]:
  """A sweep's targets grouped by the layer they start at (those >= 0), one chunk size for
  every group (one program each) as even as the largest group allows and, over `devices`,
  rounded up so that the rows split evenly, and the batch's arrays tiled that many times
  (rows: target-major, the examples within; `example`: each row's example)."""
  groups = [np.flatnonzero(start_layers == l) for l in np.unique(start_layers[start_layers >= 0])]
  largest = max((len(g) for g in groups), default=1)
  chunk = -(-largest // -(-largest // chunk))
  n = len(np.asarray(arrays["input_ids"]))
  step = devices // math.gcd(n, devices)  # chunk * n divisible by devices.
  chunk = -(-chunk // step) * step
  tiled = {k: jnp.tile(jnp.asarray(v), (chunk,) + (1,) * (np.ndim(v) - 1))
           for k, v in arrays.items()}
  tiled["example"] = jnp.asarray(np.tile(np.arange(n, dtype=np.int32), chunk))
  return groups, chunk, tiled


def process_chunks(groups: list[np.ndarray], chunk: int, count: int
                   ) -> tuple[list[np.ndarray], np.ndarray]:
  """The chunks of target indices (`chunk` at a time within each group, in order) that this
  process runs, chunk k on process k mod P, and each of the `count` targets' process (0 for
  those in no group: every process runs them)."""
  parts = [idx[s:s + chunk] for idx in groups for s in range(0, len(idx), chunk)]
  owner, procs = np.zeros(count, np.int32), jax.process_count()
  for k, part in enumerate(parts):
    owner[part] = k % procs
  return parts[jax.process_index()::procs], owner


def run_chunks(groups: list[np.ndarray], chunk: int, count: int, n: int,
               call: Callable[[np.ndarray], Array], desc: str = "") -> np.ndarray:
  """`call(part) -> [chunk * n]` (a padded chunk of target indices, examples within) on this
  process's chunks (`process_chunks`), with progress lines under `desc` ("" for none); the
  `[count, n]` rows gathered on every process (0 for targets in no group)."""
  parts, owner = process_chunks(groups, chunk, count)
  out, dtype = np.zeros((count, n), np.float64), None
  prog = (Progress(desc, sum(map(len, parts)), unit="targets", every=1)
          if desc and parts else None)
  for part in parts:
    vals = np.asarray(call(part)).reshape(chunk, n)
    out[part], dtype = vals[:len(part)], vals.dtype
    if prog:
      prog.update(len(part))
  return parallel.gather_owned(out, owner).astype(dtype or jnp.result_type(float))


def sweep(model, batch: dict, source: Array, site: str, targets: Targets, metric: Metric, *,
          chunk: int = 16, mesh: Mesh | None = None, desc: str = "") -> np.ndarray:
  """Exact activation patching: `metric` on `batch` with `source[layer]` (`[layers, B, ...]`,
  `activations` of the source run or `ablation_source`) patched in at each target, `[T, B]`.

  Targets run grouped by layer, each group from its layer on (the layers before are the
  target run's, computed once): one program per layer and chunk size, whatever the
  positions and heads.
  The rows of one call are at most `chunk` targets times the batch's B examples (the size
  evened out over the largest layer's targets; a group's last chunk is padded with position
  and head 0, and the padding dropped). With `mesh`, each call's rows are split over this
  process's devices of it (data-parallel; `chunk` rounded up so that they split evenly); over
  several processes, each runs every P-th chunk and the results are gathered on every process.
  `desc`: progress lines (this process's targets done, rate, ETA) under this label; "" for
  none."""
  n = batch["input_ids"].shape[0]
  if source.shape[1] != n:
    # caller's argument
    raise ValueError(f"source has {source.shape[1]} examples; the batch {n}.")
  arrays, metric = _arrays(batch), as_metric(metric)
  layers = np.asarray(targets.layers)
  hidden = _hidden(model.module, model.params, arrays, layer=max(int(layers.max()), 0))
  mesh = parallel.local_part(mesh)
  groups, chunk, tiled = layer_groups(layers, arrays, chunk, 1 if mesh is None else mesh.size)
  example = tiled.pop("example")

  def call(part):
    rows = []
    for full in (targets.positions, targets.heads):
      p = np.zeros(chunk, np.int32)
      p[:len(part)] = np.asarray(full)[part]
      rows.append(jnp.asarray(np.repeat(p, n)))
    return _patched(model.module, model.params, hidden, source, metric, tiled, example, *rows,
                    site=site, layer=int(layers[part[0]]), mesh=mesh)
  out = run_chunks(groups, chunk, len(targets), n, call, desc)
  if (layers < 0).any():  # Targets at layer -1 patch nothing.
    out[layers < 0] = run_metric(model, batch, metric)
  return out


@functools.partial(jax.jit, static_argnames=("module",))
def _metric(module, params, batch: dict, metric: Metric) -> Array:
  return metric(_run(module, params, batch, None), batch)


def run_metric(model, batch: dict, metric: Metric) -> np.ndarray:
  """`metric` of the unpatched run, `[B]`."""
  return np.asarray(_metric(model.module, model.params, _arrays(batch), as_metric(metric)))


GRAD_DROP_SITES = ("attention_output", "mlp_output")  # A layer's block outputs.


@functools.partial(jax.jit, static_argnames=("module", "sites", "drop"))
def _attribution(module, params, batch: dict, source: dict, metric: Metric, *,
                 sites: tuple[str, ...], drop: int = -1) -> dict[str, Array]:
  """AtP at every site of `source` from one forward and one backward pass: per site,
  `(source - activation) * gradient` summed over features, `[layers, B, L, H]`; with `drop`
  >= 0, no gradient through that layer's block outputs (GradDrop)."""
  stops = [StopGradient(drop, site=s) for s in GRAD_DROP_SITES] if drop >= 0 else []

  def total(deltas):  # The sites' activations are captured in the differentiated pass.
    adds = [Add(deltas[site], site=site) for site in sites]
    out = module.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                       batch.get("token_type_ids"),
                       override=AttentionOverride.intervene(*adds, *stops),
                       capture=Capture(**{site: True for site in sites}))
    return metric(out, batch).sum(), _captured(out, sites)

  grads, acts = jax.grad(total, has_aux=True)({site: jnp.zeros_like(a)
                                               for site, a in source.items()})
  out = {}
  for site in sites:
    contrib = (source[site] - acts[site]) * grads[site]
    if site == "probs":  # [layers, B, H, Lq, Lk]: sum over keys, positions before heads.
      out[site] = jnp.swapaxes(contrib.sum(-1), 2, 3)
    elif SITE_AXES[site][1] is None:  # [layers, B, L, D]
      out[site] = contrib.sum(-1)[..., None]
    else:  # [layers, B, L, H, d]
      out[site] = contrib.sum(-1)
  return out


@functools.partial(jax.jit, static_argnames=("module", "site"))
def _gradients(module, params, batch: dict, zeros: Array, metric: Metric, *, site: str) -> Array:
  def total(delta):
    return metric(_run(module, params, batch, Add(delta, site=site)), batch).sum()
  return jax.grad(total)(zeros)


def gradients(model, batch: dict, site: str, metric: Metric) -> Array:
  """d sum(metric) / d activation at the site of every layer, `[layers, B, ...]` (the site's
  layout), from one forward and one backward pass (`attribution` uses the same)."""
  arrays = _arrays(batch)
  shape = jax.eval_shape(functools.partial(_activations, model.module, sites=(_field(site),)),
                         model.params, arrays)[site]  # The shape alone: no forward pass.
  return _gradients(model.module, model.params, arrays, jnp.zeros(shape.shape, shape.dtype),
                    as_metric(metric), site=site)


def attribution(model, batch: dict, source: dict[str, Array], metric: Metric, *,
                drop: int = -1) -> dict[str, np.ndarray]:
  """AtP: the first-order estimate of every (layer, example, position, head) patch's effect,
  `(source - activation) . gradient`, `[layers, B, L, H]` per site of `source` (`{site:
  [layers, B, ...]}`; H = 1 at sites without heads), every site from the same forward and
  backward pass; a target's estimate is the sum over its positions and heads
  (`at_targets`). `drop` >= 0: with no gradient through that layer's attention and MLP
  outputs (the residual still carries it; `grad_drop`)."""
  sites = tuple(_field(site) for site in source)
  out = _attribution(model.module, model.params, _arrays(batch), dict(source),
                     as_metric(metric), sites=sites, drop=drop)
  return {site: np.asarray(v) for site, v in out.items()}


def grad_drop(model, batch: dict, source: dict[str, Array], targets: dict[str, Targets],
              metric: Metric) -> dict[str, np.ndarray]:
  """AtP*'s GradDrop (Kramar et al. 2024), `[T, B]` per site: once per layer l, each target's
  AtP estimate with no gradient through layer l's attention and MLP outputs, then
  `sum_l |estimate_l| / (layers - 1)`: a magnitude (no sign) that paths cancelling each
  other in the gradient cannot hide. One forward and backward pass per layer. (AtP*'s other
  part, the QK fix, is for query and key sites, which are not patch sites here.)"""
  layers = model.config.num_layers
  total = {site: 0.0 for site in targets}
  for drop in range(layers):
    per_site = attribution(model, batch, source, metric, drop=drop)
    for site, t in targets.items():
      total[site] = total[site] + np.abs(at_targets(per_site[site], t).astype(np.float64))
  return {site: v / max(layers - 1, 1) for site, v in total.items()}


def at_targets(per_site: np.ndarray, targets: Targets) -> np.ndarray:
  """`attribution`'s `[layers, B, L, H]` summed over each target's positions and heads,
  `[T, B]`: the estimate of what `sweep` measures."""
  layers, pos, heads = (np.asarray(a) for a in (targets.layers, targets.positions,
                                                 targets.heads))
  out = np.empty((len(layers), per_site.shape[1]), per_site.dtype)
  for all_pos in (False, True):  # Vectorised per kind: -1 sums that axis.
    for all_heads in (False, True):
      sel = ((pos < 0) == all_pos) & ((heads < 0) == all_heads)
      if sel.any():
        x = per_site.sum(2, keepdims=True) if all_pos else per_site
        x = x.sum(3, keepdims=True) if all_heads else x
        out[sel] = x[layers[sel], :, np.where(all_pos, 0, pos[sel]),
                     np.where(all_heads, 0, heads[sel])]
  return out


def patch(model, target: dict, source: dict, site: str, targets: Targets, metric: Metric, *,
          chunk: int = 16, mesh: Mesh | None = None) -> dict[str, np.ndarray]:
  """Activation patching of `source`'s activations (e.g. clean) into `target` (e.g. corrupt)
  at each of `targets`: `patched [T, B]`, and the unpatched `target` and `source` metrics
  `[B]` (the effect of a patch is `patched - target`; normalised, divide by
  `source - target`). Pairs must have equal lengths where positions are patched; `mesh`
  splits the sweep's rows over devices (`sweep`)."""
  check_pairs(target["attention_mask"], source["attention_mask"], site)
  acts = activations(model, source, site)
  return dict(patched=sweep(model, target, acts, site, targets, metric, chunk=chunk,
                               mesh=mesh),
              target=run_metric(model, target, metric), source=run_metric(model, source, metric))


def attribution_patch(model, target: dict, source: dict, targets: dict[str, Targets],
                      metric: Metric, *, method: str = "atp") -> dict[str, np.ndarray]:
  """AtP's estimate of `patch(...)["patched"] - patch(...)["target"]`, `[T, B]` per site of
  `targets` (`{site: Targets}`), every site from one forward and one backward pass over
  `target` (and one forward over `source`); `method="grad_drop"`: AtP*'s GradDrop magnitude
  instead (`grad_drop`: one pass per layer)."""
  if method not in ATTRIBUTIONS:
    # caller's argument
    raise ValueError(f"method {method!r}; choose one of {ATTRIBUTIONS}.")
  sites = tuple(_field(site) for site in targets)
  for site in sites:
    check_pairs(target["attention_mask"], source["attention_mask"], site)
  acts = _activations(model.module, model.params, _arrays(source), sites=sites)
  if method == "grad_drop":
    return grad_drop(model, target, acts, targets, metric)
  per_site = attribution(model, target, acts, metric)
  return {site: at_targets(per_site[site], t) for site, t in targets.items()}
