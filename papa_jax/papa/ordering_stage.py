"""The orderings stage: every head ordering of `papa.orderings` beside PAPA's, as files.

For each ordering other than "lambda" (`papa/orderings.py`), writes
`orderings/<name>.json`: the ranking (most constant-like head first), the
per-head scores it sorts (none for random draws) and their direction. Scores
come from the raw means file's one-pass sums (entropy, variance, kl), from
gradients through the baseline probe (gradient), or from the ablation stage
(ablation). A ranking whose fingerprint is unchanged is reused.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from papa_jax import interventions, parallel
from papa_jax.config import schema as config_schema
from papa_jax.probing import fitting, probes, train
from papa_jax.workdir import storage
from papa_jax.workdir import rules as workdir
from papa_jax import data as data_lib
from papa_jax.attention import AttentionOverride
from papa_jax.errors import ConfigError
from papa_jax.workdir.layout import RELATIVE
from papa_jax.papa import means, orderings, probe
from papa_jax.stage import Setup, Stage


def _gradient_fn(encoder: train.FrozenEncoder, module):
  """`(probe params, batch) -> {"importance": sum_b |dL_b/dxi_b| [layers, H], "count"}`."""
  mc = encoder.config

  def fn(probe_params, batch):
    b = batch["input_ids"].shape[0]

    def loss(xi):
      enc = train.FrozenEncoder(encoder.params, AttentionOverride.intervene(
          interventions.HeadMask(xi)), mc, feature_dtype="float32")
      feats = enc.features(batch, train=False)
      logits = module.apply({"params": probe_params}, feats, batch["attention_mask"],
                            deterministic=True)
      return jnp.sum(probes.example_losses(module.kind, logits, batch["labels"]) *
                     batch["valid"])

    g = jax.grad(loss)(jnp.ones((b, mc.num_layers, mc.num_heads), jnp.float32))
    valid = batch["valid"].astype(jnp.float32)
    return dict(importance=jnp.einsum("blh,b->lh", jnp.abs(g), valid), count=jnp.sum(valid))

  return fn


def gradient_importance(setup: Setup) -> np.ndarray:
  """Michel et al.'s importance per head, through the baseline probe (first seed)."""
  c, mc = setup.config, setup.model.config
  probe.baseline_runs(setup)  # Trains the k = 0 probes if they are not done.
  module, encoder, tx, fit = probe.baseline_fit(setup, setup.seeds[0])
  # On the host: each process then places its own copy on the (multi-process) mesh.
  params = jax.device_get(fitting.restore_final(module, encoder, tx, fit,
                                              setup.max_length)["probe"])
  data = setup.train_data
  if 0 < c.sort.max_train_examples < len(data):  # The sorting run's subset.
    data = data.take(data_lib.subsample_indices(len(data), c.sort.max_train_examples,
                                                c.data.subsample_seed + 1))
  fn = parallel.sharded_sum(_gradient_fn(train.FrozenEncoder(setup.model.params, None, mc),
                                         module), setup.mesh)
  params = parallel.put_replicated(params, setup.mesh)
  total, count = 0.0, 0.0
  for _, out, _ in parallel.map_batches(lambda b: fn(params, b), data,
                                        batch_size=c.run.batch_size, mesh=setup.mesh,
                                        desc="gradient importance"):
    total = total + np.asarray(out["importance"], np.float64)
    count += float(out["count"])
  return total / max(count, 1.0)


def _scores(setup: Setup, name: str) -> np.ndarray:
  if name in ("entropy", "variance", "kl"):
    return orderings.input_dependence(means.load_checked(setup, "raw"),
                                      setup.layout.means("raw"))[name]
  if name == "gradient":
    return gradient_importance(setup)
  path = setup.layout.stats("ablation")
  if not storage.exists(path):
    raise ConfigError(f"papa.orderings has 'ablation' but {path} does not exist: run "
                      "--config.stage=ablation in this workdir first.")
  st = workdir.read_json(path)
  if "change_uniform" not in st:
    raise ConfigError(f"{path} has no uniform ablation (ablation.kinds must include "
                      "'uniform' for the 'ablation' ordering).")
  return -np.asarray(st["change_uniform"], np.float64)  # The score drop: importance.


def _run(setup: Setup) -> None:
  mc, layout = setup.model.config, setup.layout
  for name in orderings.names(setup.config):
    if name == "lambda":
      continue
    path = layout.ordering(name)
    fp = setup.result_fingerprint(stage="orderings", ordering=name,
                                  draws=setup.config.papa.random_draws)
    if storage.exists(path) and workdir.read_json(path).get("fingerprint") == fp:
      logging.info("ordering %s: %s exists; skipping.", name, path)
      continue
    if name.startswith("random_"):
      scores, direction = None, "random"
      ranking = orderings.random_ranking(mc.num_layers, mc.num_heads, int(name.split("_")[1]),
                               setup.config.data.subsample_seed)
    else:
      scores, direction = _scores(setup, name), orderings.DIRECTIONS[name]
      ranking = orderings.ranking_from_scores(scores, direction)
    if parallel.is_main_process():
      workdir.write_json(path, dict(ordering=name, ranking=ranking, direction=direction,
                                    scores=None if scores is None else scores.tolist(),
                                    fingerprint=fp))
    logging.info("ordering %s: first heads %s -> %s", name, ranking[:5], path)


STAGE = Stage(name="orderings", run=_run, inputs=("train", "eval"), needs=("means",),
              writes=(RELATIVE.ordering("*"),), groups=config_schema.PAPA_GROUPS, memory="")
