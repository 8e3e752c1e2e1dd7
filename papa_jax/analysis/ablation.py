"""Head ablation (Sun & Marasovic's fig. 8), tied to PAPA's head ranking.

A probe is trained on the unmodified frozen encoder (the PAPA recipe, cached
float32 features). Then, for every layer and head, that head's attention is
replaced, on every dev example, by
  * "uniform": uniform attention over the example's real tokens (theirs);
  * "constant": its dataset-mean constant matrix (PAPA's);
  * "effective": its effective attention (which leaves the layer's output
    unchanged by construction, A_eff V = A V: a check, not an intervention),
and the same probe re-scores the task. The ablations differ only in the
intervention, which is data (`interventions.HeadAblation`): the dev set is
expanded to (example, head) rows, batched over the mesh, and the encoder starts
at the ablated layer from the cached hidden states, so layers before it are
never recomputed. One compiled program per (replacement, layer).

The `ablation` stage writes `workdir/ablation/stats.json` and `stats.csv`
(`change_<kind>`: the score change per layer x head), `score_change.png`, and
resumes per (replacement, layer) from `ablation/partial.partial.npz`.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from papa_jax import head_maps, parallel
from papa_jax.probing import features, fitting, metrics, train
from papa_jax.workdir import resume
from papa_jax.analysis import figures, per_head
from papa_jax.attention import AttentionOverride
from papa_jax.interventions import ABLATIONS as KINDS
from papa_jax.interventions import HeadAblation
from papa_jax.workdir.layout import RELATIVE
from papa_jax.models.config import EncoderConfig
from papa_jax.models.encoder import Encoder, run_from
from papa_jax.papa import means
from papa_jax.stage import Setup, Stage


def rows(data, num_heads: int, examples: np.ndarray) -> dict[str, np.ndarray]:
  """The (example, head) rows of one layer's ablations: example-major, R = N x H."""
  ex = np.repeat(examples, num_heads).astype(np.int32)
  head = np.tile(np.arange(num_heads, dtype=np.int32), len(examples))
  return dict(example=ex, head=head, input_ids=data.input_ids[ex],
              attention_mask=data.attention_mask[ex], token_type_ids=data.token_type_ids[ex])


def make_ablated_logits(config: EncoderConfig, probe: nn.Module, kind: str, layer: int):
  """`(frozen, batch) -> probe logits` with one head of `layer` replaced per row.

  `frozen` is `(encoder params, probe params, hidden [N, K, L, D] float32 of
  the unmodified encoder, constants [layers, H, L, L] or None)`.
  """
  if kind not in KINDS:
    raise ValueError(f"ablation kind {kind!r}; choose one of {KINDS}.")  # caller's argument
  module = Encoder(config)

  def fn(frozen, batch):
    enc, probe_params, hidden, constants = frozen
    ov = AttentionOverride.intervene(HeadAblation(
        jnp.full_like(batch["head"], layer), batch["head"],
        constants if kind == "constant" else None, kind=kind))
    return probe_from_layer(module, probe, enc, probe_params, hidden, batch, ov, layer)

  return fn


def probe_from_layer(module: Encoder, probe: nn.Module, enc, probe_params, hidden, batch,
                     override: AttentionOverride, layer: int):
  """Probe outputs of rows whose `override` acts from `layer` on: the encoder starts there
  from the rows' cached hidden states (`hidden [N, K, L, D]` of the unmodified encoder,
  indexed by `batch["example"]`), so earlier layers are never recomputed."""
  before = hidden[batch["example"]]  # [R, K, L, D]
  out = run_from(module, enc, batch, before.swapaxes(0, 1), override, layer)
  feats = jnp.stack(out.hidden_states, 1)
  return probe.apply({"params": probe_params}, feats, batch["attention_mask"], deterministic=True)


def per_row(fn, frozen, table: dict, n: int, per_example: int, mesh, batch_size: int,
            desc: str = "") -> np.ndarray:
  """`fn(frozen, batch)` over example-major rows (`per_example` per example, `n` examples),
  batched over the mesh: outputs `[per_example, n, ...]`."""
  outs = [out[valid] for _, out, valid in parallel.map_batches(
      lambda b: fn(frozen, b), table, batch_size=batch_size, mesh=mesh, desc=desc)]
  logits = np.concatenate(outs)
  return logits.reshape((n, per_example) + logits.shape[1:]).swapaxes(0, 1)


@functools.lru_cache(maxsize=32)
def compiled(config: EncoderConfig, probe: nn.Module, kind: str, layer: int, mesh):
  repl, shard = parallel.replicated(mesh), parallel.batch_sharding(mesh)
  return jax.jit(make_ablated_logits(config, probe, kind, layer), in_shardings=(repl, shard),
                 out_shardings=repl)


def ablate_layer(config: EncoderConfig, probe: nn.Module, kind: str, layer: int, frozen,
                 data, mesh, batch_size: int, desc: str = "") -> np.ndarray:
  """Probe outputs `[H, N, ...]`: row h holds every example with head h ablated."""
  n, h = len(data), config.num_heads
  return per_row(compiled(config, probe, kind, layer, mesh), frozen,
                 rows(data, h, np.arange(n)), n, h, mesh, batch_size, desc)


# The ablation stage.

GROUPS = ("model", "data", "sort", "probe", "effective", "ablation")
INPUTS = ("train", "analysis")  # The probe trains on train; heads are scored on analysis.


def probe_features(setup: Setup) -> tuple:
  """The frozen encoder and float32 features of the train and analysis splits
  (`effective.split`, `effective.max_examples`: a seeded subset) the baseline probes read."""
  c, mc = setup.config, setup.model.config
  encoder = train.FrozenEncoder(setup.model.params, None, mc, feature_dtype="float32")
  n = len(setup.train_data) + len(setup.analysis_data)
  features.check_budget(features.cache_bytes(n, mc.num_hidden_states, setup.max_length,
                                             mc.hidden_size, "float32"),
                        c.run.cache_max_gb, f"{n} examples")
  tr, ev = (features.compute(encoder, d, setup.mesh, c.run.batch_size, desc=f"features {s}")
            for d, s in ((setup.train_data, "train"), (setup.analysis_data, "eval")))
  return encoder, tr, ev


def baseline_probe(setup: Setup, seed: int | None = None, feats: tuple | None = None):
  """The baseline probe on the unmodified encoder (probe seed `seed`, default the first of
  `papa.seeds`), and float32 hidden states of the analysis split; `feats`: `probe_features`'
  output, when several seeds share it."""
  c, mc = setup.config, setup.model.config
  encoder, tr, ev = feats or probe_features(setup)
  seed = setup.seeds[0] if seed is None else seed
  fp = setup.fingerprint(GROUPS, INPUTS, stage="ablation-probe", seed=seed)
  probe = train.probe_module(setup.task, mc, c.probe)
  run_dir = setup.layout.path("ablation", f"probe_{fp[:12]}")  # One per config and seed.
  state, history, logits = fitting.fit(
      "ablation probe", probe, encoder, train.make_optimizer(c.probe),
      train.FitConfig.from_config(c, c.probe.epochs, seed, setup.layout.checkpoints(run_dir), fp),
      tr, ev, train.scorer(setup.task, setup.analysis_data.labels), setup.mesh)
  return probe, state.params["probe"], ev.features, history, logits


def _run(setup: Setup) -> dict:
  """Every head replaced in turn (uniform, constant, effective); the dev score change."""
  c, mc, task = setup.config, setup.model.config, setup.task
  kinds = tuple(c.ablation.kinds)
  probe, probe_params, hidden, history, base_logits = baseline_probe(setup)
  labels, metric = setup.analysis_data.labels, task.headline_metric
  baseline = metrics.task_scores(task, base_logits, labels)[metric]
  constants = jnp.asarray(means.load_checked(setup, "raw").avgs) if "constant" in kinds else None
  frozen = parallel.put_replicated((setup.model.params, probe_params, jnp.asarray(hidden),
                                    constants), setup.mesh)
  units = [(kind, layer) for kind in kinds for layer in range(mc.num_layers)]
  key = setup.fingerprint(GROUPS, INPUTS, stage="ablation")
  partial = setup.layout.partial("ablation")
  saved = resume.load(partial, key)
  scores = dict(saved.arrays) if saved else {k: np.zeros((mc.num_layers, mc.num_heads))
                                             for k in kinds}
  for i in range(saved.position if saved else 0, len(units)):
    kind, layer = units[i]
    logits = ablate_layer(mc, probe, kind, layer, frozen, setup.analysis_data, setup.mesh,
                          c.run.batch_size, desc=f"ablation {kind} layer {layer}")
    scores[kind][layer] = [metrics.task_scores(task, lg, labels)[metric] for lg in logits]
    if parallel.is_main_process():
      resume.save(partial, key, i + 1, scores)
  maps = {f"change_{k}": scores[k] - baseline for k in kinds}
  summary = dict(model=c.model.name, task=task.name, split=c.effective.split, metric=metric,
                 baseline=baseline, eval_examples=len(labels),
                 train_examples=len(setup.train_data), probe_history=history,
                 **{f"mean_change_{k}": float(maps[f"change_{k}"].mean()) for k in kinds},
                 **{f"max_abs_change_{k}": float(np.abs(maps[f"change_{k}"]).max())
                    for k in kinds})
  if parallel.is_main_process():
    info = head_maps.HeadInfo(f"{metric} change when the head is replaced", head_maps.LESS,
                              metric)
    head_maps.write(setup.layout, "ablation", head_maps.maps_of(
        "ablation", {k: info for k in maps}, maps, examples=len(labels),
        split=c.effective.split), summary)
    figures.head_maps([(f"{k}: score change", maps[f"change_{k}"]) for k in kinds],
                      setup.layout.figure("ablation", "score_change.png"),
                      per_head.label(setup, f"{metric} change when one head is replaced "
                                     f"(baseline {baseline:.4f})", len(labels)),
                      center=True, cmap="RdBu_r")
    resume.remove(partial)
  logging.info("ablation: %s", {k: v for k, v in summary.items() if k != "probe_history"})
  return summary


STAGE = Stage(name="ablation", run=_run, inputs=INPUTS, needs=("means",),
              writes=(RELATIVE.stats("ablation"),), groups=GROUPS, memory="forward")
