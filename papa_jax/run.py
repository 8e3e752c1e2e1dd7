"""The PAPA pipeline as functions of (config, workdir): means, sort, probe.

Workdir layout:
  config.json                      the resolved config of the first run
  means/means_{raw,effective}.npz  constant matrices (see papa/means.py)
  sort/lambdas.npy, sort/sorted_heads.json, sort/history.json
  probe/{variant}_k{K}/result.json per-run history and score (+ checkpoints/)
  results.{json,csv,md}, papa_curve.png

Each stage skips work whose outputs already exist for this config, and a
killed stage resumes from its last checkpoint (partial means sums, or the
probe's last finished epoch).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from papa_jax import attention as attn
from papa_jax import features as features_lib
from papa_jax import metrics, parallel, probes, results, train
from papa_jax import convert
from papa_jax import data as data_lib
from papa_jax.data import pipeline
from papa_jax.papa import means as means_lib
from papa_jax.papa import schedule
from papa_jax.progress import Progress

STAGES = ("means", "sort", "probe", "all", "effective")
VARIANTS = means_lib.ATTENTION_KINDS
# Config fields that do not change any finished run's result (excluded from
# workdir and run fingerprints). papa.variants / papa.fractions only choose
# which runs exist, so extending them reuses the runs already done.
_VOLATILE = ("stage", "overwrite", "log_every_steps", "means.checkpoint_every_batches",
             "distributed", "mesh", "probe.cache_dir", "probe.cache_max_gb",
             "probe.eval_batch_size", "means.batch_size", "effective", "papa.variants",
             "papa.fractions")


class ConfigError(ValueError):
  """A config that cannot run, found before any long computation."""


def _hash(obj) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def variants(config) -> tuple[str, ...]:
  vs = tuple(v.strip() for v in config.papa.variants.split(",") if v.strip())
  bad = [v for v in vs if v not in VARIANTS]
  if bad or not vs:
    raise ConfigError(f"papa.variants={config.papa.variants!r}: use a comma-separated subset "
                      f"of {VARIANTS}.")
  if "raw" not in vs:
    vs = ("raw",) + vs  # The ranking and the baseline come from raw attention.
  return vs


def validate_config(config) -> None:
  """Static checks of a config (no model or data loaded)."""
  if config.stage not in STAGES:
    raise ConfigError(f"stage={config.stage!r}; choose one of {STAGES}.")
  data_lib.get_task(config.data.task)
  if config.data.source not in ("local", "tfds"):
    raise ConfigError(f"data.source={config.data.source!r}; use 'local' or 'tfds'.")
  if config.data.max_length < 4:
    raise ConfigError(f"data.max_length={config.data.max_length} is too short.")
  variants(config)
  schedule.static_head_counts(1, config.papa.fractions)
  p = config.probe
  if p.feature_dtype not in train.DTYPES:
    raise ConfigError(f"probe.feature_dtype={p.feature_dtype!r}; use one of {list(train.DTYPES)}.")
  if p.cache_features and p.encoder_dropout:
    raise ConfigError("probe.cache_features needs a deterministic encoder: set "
                      "probe.encoder_dropout=False (cached features cannot vary per epoch).")
  for name, v in (("probe.epochs", p.epochs), ("probe.batch_size", p.batch_size),
                  ("probe.eval_batch_size", p.eval_batch_size), ("sort.epochs", config.sort.epochs),
                  ("means.batch_size", config.means.batch_size)):
    if v < 1:
      raise ConfigError(f"{name}={v} must be >= 1.")
  if not p.learning_rate > 0:
    raise ConfigError(f"probe.learning_rate={p.learning_rate} must be > 0.")


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(_flat(v, key + "."))
    else:
      out[key] = v
  return out


def _result_config(config) -> dict:
  """The config fields that decide results (for workdir and checkpoint checks)."""
  flat = _flat(json.loads(config.to_json_best_effort()))
  return {k: v for k, v in flat.items()
          if not any(k == x or k.startswith(x + ".") for x in _VOLATILE)}


def check_workdir(config, workdir: str) -> None:
  """Refuses a workdir holding results of a different config (unless overwrite)."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "config.json")
  mine = _result_config(config)
  if os.path.exists(path):
    with open(path) as f:
      theirs = _result_config(ml_collections.ConfigDict(json.load(f)))
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if diff and not config.overwrite:
      details = "; ".join(f"{k}: {theirs.get(k)!r} -> {mine.get(k)!r}" for k in diff[:8])
      raise ConfigError(f"Workdir {workdir} holds results of a different config ({details}). "
                        "Use another --workdir, or --config.overwrite=True to replace them.")
    if diff and parallel.is_main_process():
      logging.warning("overwrite=True: removing results of the previous config in %s.", workdir)
      for name in ("means", "sort", "probe", "effective", "cache"):
        shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)
      for name in ("results.json", "results.csv", "results.md", "papa_curve.png"):
        if os.path.exists(os.path.join(workdir, name)):
          os.remove(os.path.join(workdir, name))
  if parallel.is_main_process():
    results.write_json(path, json.loads(config.to_json_best_effort()))


def package_versions() -> dict:
  import importlib.metadata as md
  out = {}
  for name in ("papa-jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy",
               "transformers", "tokenizers", "tensorflow-datasets"):
    try:
      out[name] = md.version(name)
    except md.PackageNotFoundError:
      pass
  return out


def git_revision() -> str | None:
  import subprocess
  try:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                         text=True, timeout=5)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return rev.stdout.strip() + ("-dirty" if dirty else "") if rev.returncode == 0 else None
  except (OSError, subprocess.SubprocessError):
    return None


class Context:
  """Everything the stages share: model, tokenizer, task, data, mesh, paths."""

  def __init__(self, config, workdir: str):
    self.config, self.workdir = config, workdir
    self.task = data_lib.get_task(config.data.task)
    splits = ("train", self.task.eval_split)
    data_lib.check_files(config.data, splits)
    self.model = convert.load_pretrained(config.model.name)
    mc = self.model.config
    if config.data.max_length > mc.max_length:
      raise ConfigError(f"data.max_length={config.data.max_length} exceeds the model's "
                        f"{mc.max_length} positions.")
    self.tokenizer = self.model.tokenizer()
    self.mesh = parallel.make_mesh(config.mesh.num_devices)
    for name, bs in (("probe.batch_size", config.probe.batch_size),
                     ("probe.eval_batch_size", config.probe.eval_batch_size),
                     ("means.batch_size", config.means.batch_size)):
      parallel.check_batch_size(bs, self.mesh, name)
    self.fingerprint = means_lib.model_fingerprint(mc, self.model.params)
    self.variants = variants(config)
    self.counts = schedule.static_head_counts(mc.total_heads, config.papa.fractions)
    self.L = config.data.max_length

  # Paths.
  def path(self, *parts: str) -> str:
    return os.path.join(self.workdir, *parts)

  def means_path(self, variant: str) -> str:
    return self.path("means", f"means_{variant}.npz")

  @functools.cached_property
  def train_data(self) -> data_lib.Encoded:
    return data_lib.load_split(self.config.data, "train", self.tokenizer,
                               self.model.config.type_vocab_size,
                               self.config.data.max_train_examples)

  @functools.cached_property
  def eval_data(self) -> data_lib.Encoded:
    return data_lib.load_split(self.config.data, self.task.eval_split, self.tokenizer,
                               self.model.config.type_vocab_size,
                               self.config.data.max_eval_examples)

  def means_metadata(self, variant: str) -> dict:
    d = self.config.data
    return dict(model=self.config.model.name, model_fingerprint=self.fingerprint,
                architecture=self.model.config.architecture_dict(), task=self.task.name,
                split="train", max_length=self.L, attention=variant, papa_layout=d.papa_layout,
                faithful_segment_ids=d.faithful_segment_ids,
                max_train_examples=d.max_train_examples, subsample_seed=d.subsample_seed)

  def load_means(self, variant: str) -> means_lib.Means:
    mc = self.model.config
    m = means_lib.load_means(self.means_path(variant), fingerprint=self.fingerprint,
                             max_length=self.L,
                             shape=(mc.num_layers, mc.num_heads, self.L, self.L))
    want = self.means_metadata(variant)
    for key in ("task", "attention", "papa_layout", "max_train_examples", "subsample_seed"):
      if m.metadata.get(key) != want[key]:
        raise means_lib.MeansFileError(
            f"{self.means_path(variant)} was computed with {key}={m.metadata.get(key)!r}, "
            f"this run has {want[key]!r}.")
    return m

  def check_existing_means(self) -> None:
    """Fail fast if means already on disk do not fit this run."""
    for v in self.variants:
      if os.path.exists(self.means_path(v)):
        self.load_means(v)


# Stage: means.

def stage_means(ctx: Context) -> None:
  for variant in ctx.variants:
    path = ctx.means_path(variant)
    if os.path.exists(path):
      ctx.load_means(variant)  # Raises if it does not fit.
      logging.info("means (%s): %s exists; skipping.", variant, path)
      continue
    compute_means(ctx, variant)


def _local_batches(shard: data_lib.Encoded, local_bs: int, steps: int, start: int):
  """This process's batches, padded with empty ones to `steps` (same on all hosts)."""
  produced = 0
  for batch in pipeline.batches(shard, local_bs, start=start):
    produced += 1
    yield batch
  empty = pipeline.gather(shard, np.full(local_bs, -1))
  for _ in range(start + produced, steps):
    yield empty


def compute_means(ctx: Context, variant: str) -> str:
  cfg = ctx.config
  os.makedirs(ctx.path("means"), exist_ok=True)
  nproc, pid = jax.process_count(), jax.process_index()
  global_bs = cfg.means.batch_size
  local_bs = global_bs // nproc
  total = len(data_lib.subsample(data_lib.load_records(cfg.data, "train"),
                                 cfg.data.max_train_examples, cfg.data.subsample_seed)) \
      if nproc > 1 else len(ctx.train_data)
  shard = (data_lib.load_split(cfg.data, "train", ctx.tokenizer, ctx.model.config.type_vocab_size,
                               cfg.data.max_train_examples, shard=(pid, nproc))
           if nproc > 1 else ctx.train_data)
  steps = pipeline.num_batches(-(-total // nproc), local_bs)
  meta = ctx.means_metadata(variant)
  run_key = _hash(dict(meta, global_batch=global_bs, processes=nproc, total=total))
  partial = ctx.path("means", f"means_{variant}.partial.npz")
  state = means_lib.load_partial(partial, run_key)
  if state is None:
    state = means_lib.MeansState.zeros(ctx.model.config, ctx.L)
  else:
    logging.info("means (%s): resuming at batch %d/%d (%d examples done).", variant,
                 state.next_batch, steps, state.num_examples)
  prog = Progress(f"means ({variant})", total, every=max(1, steps // 50),
                  start=state.num_examples)
  every = cfg.means.checkpoint_every_batches

  def on_batch(s: means_lib.MeansState):
    prog.update(s.num_examples - prog.done)
    if every > 0 and s.next_batch % every == 0 and s.next_batch < steps and parallel.is_main_process():
      means_lib.save_partial(partial, s, run_key)

  means_lib.accumulate(ctx.model.config, ctx.model.params,
                       _local_batches(shard, local_bs, steps, state.next_batch), ctx.mesh,
                       attention=variant, state=state, on_batch=on_batch)
  state.num_examples = total if nproc > 1 else state.num_examples
  if parallel.is_main_process():
    means_lib.save_means(ctx.means_path(variant), state, meta)
    if os.path.exists(partial):
      os.remove(partial)
  logging.info("means (%s): %d examples in %.1fs -> %s", variant, state.num_examples,
               prog.seconds, ctx.means_path(variant))
  return ctx.means_path(variant)


# Stages: sort and probe.

def _fit_cfg(cfg, epochs: int) -> train.FitConfig:
  return train.FitConfig(epochs=epochs, batch_size=cfg.probe.batch_size,
                         eval_batch_size=cfg.probe.eval_batch_size, seed=cfg.probe.seed,
                         log_every_steps=cfg.log_every_steps)


def _probe_module(ctx: Context):
  mc, p = ctx.model.config, ctx.config.probe
  rate = p.probe_dropout if p.probe_dropout >= 0 else (
      0.0 if mc.family == "roberta" else mc.hidden_dropout)
  return probes.make_probe(ctx.task.kind, ctx.task.num_labels, mc.hidden_size, rate)


def _score_fn(ctx: Context):
  labels = ctx.eval_data.labels
  return lambda logits: metrics.task_scores(ctx.task, logits, labels)


def needs_ranking(ctx: Context) -> bool:
  total = ctx.model.config.total_heads
  return any(0 < k < total for k in ctx.counts)


def stage_sort(ctx: Context) -> None:
  cfg, mc = ctx.config, ctx.model.config
  out = ctx.path("sort", "sorted_heads.json")
  if not needs_ranking(ctx):
    logging.info("sort: static-head counts %s need no ranking; skipping.", ctx.counts)
    return
  fingerprint = _hash(dict(stage="sort", model=ctx.fingerprint, cfg=_result_config(cfg)))
  meta_path = ctx.path("sort", "history.json")
  if os.path.exists(out) and os.path.exists(meta_path):
    with open(meta_path) as f:
      if json.load(f).get("fingerprint") == fingerprint:
        logging.info("sort: %s exists; skipping.", out)
        return
  means = ctx.load_means("raw")
  spec = train.EncoderSpec(mc, gated=True, dropout=cfg.probe.encoder_dropout)
  tx = train.make_optimizer(cfg.probe, gate_learning_rate=cfg.sort.gate_learning_rate)
  t0 = time.perf_counter()
  data = ctx.train_data
  n = cfg.sort.max_train_examples
  if 0 < n < len(data):
    data = data.take(np.sort(np.random.default_rng(cfg.data.subsample_seed + 1)
                             .permutation(len(data))[:n]))
  state, history = train.fit(
      name="sort", probe=_probe_module(ctx), kind=ctx.task.kind, spec=spec, tx=tx,
      fit_cfg=_fit_cfg(cfg, cfg.sort.epochs), train_data=data,
      eval_data=ctx.eval_data, enc_params=ctx.model.params,
      constants=jnp.asarray(means.avgs), mesh=ctx.mesh, score_fn=_score_fn(ctx),
      ckpt_dir=ctx.path("sort", "checkpoints"), fingerprint=fingerprint, max_length=ctx.L)
  lambdas = np.asarray(jax.device_get(state.params["gates"]))
  if parallel.is_main_process():
    schedule.save_ranking(ctx.path("sort"), lambdas)
    results.write_json(meta_path, dict(fingerprint=fingerprint, history=history,
                                       seconds=time.perf_counter() - t0,
                                       sigmoid_spread=[float(jax.nn.sigmoid(lambdas.min())),
                                                       float(jax.nn.sigmoid(lambdas.max()))]))
  logging.info("sort: lambda range [%.4g, %.4g] -> %s", lambdas.min(), lambdas.max(), out)


def _static_mask(ctx: Context, k: int, ranking) -> np.ndarray:
  mc = ctx.model.config
  if k == mc.total_heads:
    return np.ones((mc.num_layers, mc.num_heads), bool)
  return attn.head_mask_from_ranking(ranking or [], k, mc.num_layers, mc.num_heads)


def train_probe(ctx: Context, variant: str, k: int, ranking) -> dict:
  """One probing run: `k` heads constant (mean `variant` attention)."""
  cfg, mc = ctx.config, ctx.model.config
  run_dir = ctx.path("probe", f"{variant}_k{k}")
  static = _static_mask(ctx, k, ranking)
  fingerprint = _hash(dict(stage="probe", model=ctx.fingerprint, variant=variant, k=k,
                           heads=static.tolist(), cfg=_result_config(cfg)))
  result_path = os.path.join(run_dir, "result.json")
  if os.path.exists(result_path):
    with open(result_path) as f:
      row = json.load(f)
    if row.get("fingerprint") == fingerprint:
      logging.info("probe %s k=%d: done before (%s).", variant, k, result_path)
      return row
  constants = jnp.asarray(ctx.load_means(variant).avgs) if k else None
  spec = train.EncoderSpec(mc, static_heads=static if k else None,
                           dropout=cfg.probe.encoder_dropout,
                           feature_dtype=cfg.probe.feature_dtype)
  t0 = time.perf_counter()
  train_data, eval_data = ctx.train_data, ctx.eval_data
  if cfg.probe.cache_features:
    train_data, eval_data = _cached(ctx, spec, constants, f"{variant}_k{k}")
  state, history = train.fit(
      name=f"probe {variant} k={k}", probe=_probe_module(ctx), kind=ctx.task.kind, spec=spec,
      tx=train.make_optimizer(cfg.probe), fit_cfg=_fit_cfg(cfg, cfg.probe.epochs),
      train_data=train_data, eval_data=eval_data, enc_params=ctx.model.params,
      constants=constants, mesh=ctx.mesh, score_fn=_score_fn(ctx),
      ckpt_dir=os.path.join(run_dir, "checkpoints"), fingerprint=fingerprint, max_length=ctx.L)
  del state
  metric = ctx.task.headline_metric
  row = dict(model=cfg.model.name, task=ctx.task.name, variant=variant, static_heads=k,
             total_heads=mc.total_heads, fraction=k / mc.total_heads, metric=metric,
             score=history[-1][metric], best_score=max(h[metric] for h in history),
             scores={m: history[-1][m] for m in ctx.task.metrics},
             examples=len(ctx.train_data), eval_examples=len(ctx.eval_data),
             epochs=len(history), seconds=time.perf_counter() - t0, history=history,
             fingerprint=fingerprint)
  if parallel.is_main_process():
    os.makedirs(run_dir, exist_ok=True)
    results.write_json(result_path, row)
  return row


def _cached(ctx: Context, spec, constants, name: str):
  cfg, mc = ctx.config, ctx.model.config
  n = len(ctx.train_data) + len(ctx.eval_data)
  need = features_lib.cache_bytes(n, mc.num_hidden_states, ctx.L, mc.hidden_size,
                                  spec.feature_dtype)
  features_lib.check_budget(need, cfg.probe.cache_max_gb, f"{n} examples")
  bs = cfg.probe.eval_batch_size
  where = cfg.probe.cache_dir
  paths = [os.path.join(where, f"{name}_{s}.npy") if where else "" for s in ("train", "eval")]
  logging.info("Caching %s features (%.2f GiB, %s).", name, need / 2**30, where or "in memory")
  tr = features_lib.compute(spec, ctx.model.params, constants, ctx.train_data, ctx.mesh, bs,
                            paths[0], f"features {name} train")
  ev = features_lib.compute(spec, ctx.model.params, constants, ctx.eval_data, ctx.mesh, bs,
                            paths[1], f"features {name} eval")
  return tr, ev


def stage_probe(ctx: Context) -> list[dict]:
  cfg, mc = ctx.config, ctx.model.config
  ranking = None
  if needs_ranking(ctx):
    ranking = schedule.load_ranking(ctx.path("sort", "sorted_heads.json"), mc.num_layers,
                                    mc.num_heads)
  for v in ctx.variants:  # Fail fast on missing or foreign means.
    if any(ctx.counts):
      ctx.load_means(v)
  if cfg.probe.cache_features:  # Fail fast on the cache budget.
    n = len(ctx.train_data) + len(ctx.eval_data)
    features_lib.check_budget(features_lib.cache_bytes(
        n, mc.num_hidden_states, ctx.L, mc.hidden_size, cfg.probe.feature_dtype),
        cfg.probe.cache_max_gb, f"{n} examples")
  rows = []
  for variant in ctx.variants:
    for k in ctx.counts:
      if k == 0 and variant != "raw":
        continue  # One baseline serves every variant.
      rows.append(train_probe(ctx, variant, k, ranking))
  meta = dict(config=json.loads(cfg.to_json_best_effort()), seed=cfg.probe.seed,
              versions=package_versions(), git_revision=git_revision(),
              model_fingerprint=ctx.fingerprint)
  if parallel.is_main_process():
    clean = [{k: v for k, v in r.items() if k not in ("history", "fingerprint")} for r in rows]
    paths = results.write_all(ctx.workdir, clean, meta)
    logging.info("Results: %s\n%s", paths["md"], results.markdown(clean))
  return rows


def run(config, workdir: str):
  """Runs `config.stage` ("all": means, sort, probe) in `workdir`."""
  validate_config(config)
  check_workdir(config, workdir)
  if config.stage == "effective":
    from papa_jax.analysis import stage as effective_stage  # pylint: disable=import-outside-toplevel
    return effective_stage.run(config, workdir)
  ctx = Context(config, workdir)
  ctx.check_existing_means()
  stages = ("means", "sort", "probe") if config.stage == "all" else (config.stage,)
  out = None
  for name in stages:
    t0 = time.perf_counter()
    out = {"means": stage_means, "sort": stage_sort, "probe": stage_probe}[name](ctx)
    logging.info("Stage %s finished in %.1fs.", name, time.perf_counter() - t0)
  return out
