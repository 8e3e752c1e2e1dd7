"""The pipeline as stages of one `Setup` (config, workdir, model, data, mesh).

Workdir layout:
  config.json                          the resolved config (see `workdir.bind`)
  means/means_{raw,effective}.npz      constant matrices (see papa/means.py)
  sort/lambdas.npy, sorted_heads.json, history.json
  probe/{variant}_k{K}_s{seed}/result.json, predictions.npz (+ checkpoints/)
  results.{json,csv,md}, papa_curve.png
  effective/                           the effective-attention analysis

Each stage skips work whose outputs already exist for this config, and a
killed or preempted stage resumes from its last checkpoint (means partial
sums, or the probe's last checkpoint within or at the end of an epoch).
Start reading at `run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from papa_jax import config_schema, convert, metrics, parallel, probes, results, tokenization, train
from papa_jax import data as data_lib
from papa_jax import features as features_lib
from papa_jax import workdir as workdir_lib
from papa_jax.attention import AttentionOverride
from papa_jax.config_schema import ConfigError
from papa_jax.papa import means as means_lib
from papa_jax.papa import schedule

__all__ = ["ConfigError", "Setup", "run"]


class Setup:
  """What every stage shares: config, workdir, task, model, tokenizer, mesh, data."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config, self.workdir = config, workdir
    self.task = data_lib.resolve_task(config.data)
    data_lib.check_files(config.data, self.splits_needed())
    model = convert.load_pretrained(config.model.name)
    self.model = dataclasses.replace(model, config=model.config.replace(
        compute_dtype=config_schema.compute_dtype(config, jax.default_backend())))
    mc = self.model.config
    config_schema.validate_for_model(config, mc)
    self.tokenizer = self.model.tokenizer()
    self.mesh = parallel.make_mesh(config.run.num_devices)
    config_schema.validate_for_mesh(config, self.mesh.size)
    self.model_fingerprint = workdir_lib.fingerprint(dict(
        params=means_lib.model_fingerprint(mc, self.model.params),
        tokenizer=tokenization.tokenizer_fingerprint(self.model.model_dir)))
    self.variants = config_schema.variants(config)
    self.seeds = config_schema.seeds(config)
    self.static_head_counts = schedule.static_head_counts(
        mc.total_heads, config_schema.fractions(config))
    self.L = config.data.max_length
    self.baseline_train_features = None  # Set by the means stage when it can (see there).

  def splits_needed(self) -> tuple[str, ...]:
    if self.config.stage in config_schema.ANALYSIS_STAGES:
      return (self.config.effective.split,)
    return ("train", self.task.eval_split)

  def path(self, *parts: str) -> str:
    return os.path.join(self.workdir, *parts)

  def means_path(self, variant: str) -> str:
    return self.path("means", f"means_{variant}.npz")

  def split(self, name: str, max_examples: int = -1) -> data_lib.Encoded:
    return data_lib.load_split(self.config.data, name, self.tokenizer,
                               self.model.config.type_vocab_size, max_examples)

  @functools.cached_property
  def train_data(self) -> data_lib.Encoded:
    return self.split("train", self.config.data.max_train_examples)

  @functools.cached_property
  def eval_data(self) -> data_lib.Encoded:
    return self.split(self.task.eval_split, self.config.data.max_eval_examples)

  def result_fingerprint(self, **unit) -> str:
    """The fingerprint of one unit of work under this config and model."""
    return workdir_lib.fingerprint(dict(unit, model=self.model_fingerprint, config=(
        config_schema.result_config(self.config, config_schema.PAPA_GROUPS))))

  def means_metadata(self, variant: str) -> dict:
    d = self.config.data
    return dict(model=self.config.model.name, model_fingerprint=self.model_fingerprint,
                architecture=self.model.config.architecture_dict(), task=self.task.name,
                split="train", max_length=self.L, attention=variant, papa_layout=d.papa_layout,
                faithful_segment_ids=d.faithful_segment_ids,
                data_fingerprint=workdir_lib.fingerprint(d.to_dict()))

  def load_means(self, variant: str) -> means_lib.Means:
    mc = self.model.config
    m = means_lib.load_means(self.means_path(variant), fingerprint=self.model_fingerprint,
                             max_length=self.L,
                             shape=(mc.num_layers, mc.num_heads, self.L, self.L))
    want = self.means_metadata(variant)
    for key in ("attention", "data_fingerprint"):
      if m.metadata.get(key) != want[key]:
        raise means_lib.MeansFileError(
            f"{self.means_path(variant)} was computed with {key}={m.metadata.get(key)!r}, "
            f"this run has {want[key]!r} (a different data config: {self.config.data}).")
    return m

  @functools.cached_property
  def effective_data(self) -> data_lib.Encoded:
    e = self.config.effective
    data = self.split(e.split, e.max_examples)
    if e.min_valid_tokens > 0:
      data = data.take(np.flatnonzero(data.attention_mask.sum(1) > e.min_valid_tokens))
      if not len(data):
        raise ConfigError(f"effective.min_valid_tokens={e.min_valid_tokens}: no {e.split} "
                          "example has more real tokens than that.")
    return data

  def check_inputs(self) -> None:
    """Reads and checks everything this stage needs, before the workdir is touched."""
    analysis = self.config.stage in config_schema.ANALYSIS_STAGES
    splits = ({self.config.effective.split: self.effective_data} if analysis else
              {"train": self.train_data, self.task.eval_split: self.eval_data})
    for name, d in splits.items():
      tokenization.check_unknown_rate(self.tokenizer, d.input_ids, d.attention_mask,
                                      f"{self.task.name}/{name}")
    if analysis:
      return
    for v in self.variants:
      if os.path.exists(self.means_path(v)):
        self.load_means(v)


# Stage: means.

def stage_means(s: Setup) -> None:
  for variant in s.variants:
    path = s.means_path(variant)
    if os.path.exists(path):
      s.load_means(variant)  # Raises if it does not fit.
      logging.info("means (%s): %s exists; skipping.", variant, path)
      continue
    meta = s.means_metadata(variant)
    run_key = workdir_lib.fingerprint(dict(meta, batch_size=s.config.run.batch_size,
                                           examples=len(s.train_data)))
    partial = s.path("means", f"means_{variant}.partial.npz")
    state = means_lib.load_partial(partial, run_key)
    if state is not None:
      logging.info("means (%s): resuming at batch %d (%d examples done).", variant,
                   state.next_batch, state.num_examples)

    def checkpoint(st: means_lib.MeansState) -> None:
      if parallel.is_main_process():
        means_lib.save_partial(partial, st, run_key)

    t0 = time.perf_counter()
    # The raw pass is the baseline's forward over the same examples: keep its
    # hidden states as the baseline probe's cached train features.
    reuse = s.config.probe.cache_features and variant == "raw"
    state = means_lib.accumulate(
        s.model.config, s.model.params, s.train_data, s.mesh, batch_size=s.config.run.batch_size,
        attention=variant, state=state, checkpoint=checkpoint,
        checkpoint_every=s.config.run.checkpoint_every_batches, desc=f"means ({variant})",
        feature_dtype=s.config.probe.feature_dtype if reuse else None)
    if state.features is not None:
      s.baseline_train_features = features_lib.Features(
          state.features, s.train_data.attention_mask, s.train_data.labels)
    if parallel.is_main_process():
      means_lib.save_means(path, state, meta)
      if os.path.exists(partial):
        os.remove(partial)
    logging.info("means (%s): %d examples in %.1fs -> %s", variant, state.num_examples,
                 time.perf_counter() - t0, path)


# Stages: sort and probe.

def probe_module(s: Setup) -> probes.nn.Module:
  mc, p = s.model.config, s.config.probe
  rate = p.probe_dropout if p.probe_dropout >= 0 else mc.probe_dropout
  return probes.make_probe(s.task.kind, s.task.num_labels, mc.hidden_size, rate)


def fit_config(s: Setup, epochs: int, seed: int, run_dir: str, fingerprint: str
                ) -> train.FitConfig:
  c = s.config
  return train.FitConfig(epochs=epochs, batch_size=c.probe.batch_size,
                         eval_batch_size=c.run.batch_size, seed=seed,
                         log_every_steps=c.run.log_every_steps,
                         checkpoint_dir=os.path.join(run_dir, "checkpoints"),
                         fingerprint=fingerprint,
                         checkpoint_every_steps=c.run.checkpoint_every_steps)


def score_fn(s: Setup, data: data_lib.Encoded | None = None):
  """Scores logits of `data` (default: the eval split) with the task's metrics."""
  labels = (s.eval_data if data is None else data).labels
  return lambda logits: metrics.task_scores(s.task, logits, labels)


def needs_ranking(s: Setup) -> bool:
  total = s.model.config.total_heads
  return any(0 < k < total for k in s.static_head_counts)


def stage_sort(s: Setup) -> None:
  cfg, mc = s.config, s.model.config
  out = s.path("sort", "sorted_heads.json")
  if not needs_ranking(s):
    logging.info("sort: static-head counts %s need no ranking; skipping.", s.static_head_counts)
    return
  fingerprint = s.result_fingerprint(stage="sort")
  meta_path = s.path("sort", "history.json")
  if os.path.exists(out) and os.path.exists(meta_path):
    if workdir_lib.read_json(meta_path).get("fingerprint") == fingerprint:
      logging.info("sort: %s exists; skipping.", out)
      return
  constants = jnp.asarray(s.load_means("raw").avgs)
  encoder = train.FrozenEncoder(
      s.model.params, AttentionOverride.gated(constants, jnp.zeros(constants.shape[:2])), mc,
      dropout=cfg.probe.encoder_dropout)
  data = s.train_data
  if 0 < cfg.sort.max_train_examples < len(data):
    data = data.take(data_lib.subsample_indices(len(data), cfg.sort.max_train_examples,
                                                cfg.data.subsample_seed + 1))
  t0 = time.perf_counter()
  state, history, _ = train.fit(
      "sort", probe_module(s), encoder,
      train.make_optimizer(cfg.probe, gate_learning_rate=cfg.sort.gate_learning_rate),
      fit_config(s, cfg.sort.epochs, cfg.sort.seed, s.path("sort"), fingerprint),
      data, s.eval_data, score_fn(s), s.mesh)
  lambdas = np.asarray(jax.device_get(state.params["gates"]))
  if parallel.is_main_process():
    schedule.save_ranking(s.path("sort"), lambdas)
    sig = jax.nn.sigmoid(lambdas)
    workdir_lib.write_json(meta_path, dict(
        fingerprint=fingerprint, history=history, seconds=time.perf_counter() - t0,
        sigmoid_spread=[float(sig.min()), float(sig.max())]))
  logging.info("sort: lambda range [%.4g, %.4g] -> %s", lambdas.min(), lambdas.max(), out)


def _predictions(kind: str, logits: np.ndarray) -> np.ndarray:
  if kind == "regression":
    return logits[:, 0].astype(np.float32)
  return logits.argmax(-1).astype(np.int32)


def _probe_runs(s: Setup, variant: str, k: int, ranking) -> list[dict]:
  """The probing runs of one static-head set (k heads, mean `variant` attention), per seed."""
  cfg, mc = s.config, s.model.config
  static = schedule.static_heads(ranking, k, mc.num_layers, mc.num_heads)
  todo, rows = [], {}
  for seed in s.seeds:
    run_dir = s.path("probe", f"{variant}_k{k}_s{seed}")
    fp = s.result_fingerprint(stage="probe", variant=variant, k=k, heads=static.tolist(),
                              seed=seed)
    path = os.path.join(run_dir, "result.json")
    if os.path.exists(path) and workdir_lib.read_json(path).get("fingerprint") == fp:
      logging.info("probe %s k=%d seed=%d: done before (%s).", variant, k, seed, path)
      rows[seed] = workdir_lib.read_json(path)
    else:
      todo.append((seed, run_dir, fp))
  if not todo:
    return [rows[seed] for seed in s.seeds]
  override = None
  if k:
    override = AttentionOverride.constant(jnp.asarray(s.load_means(variant).avgs), static)
  encoder = train.FrozenEncoder(s.model.params, override, mc, dropout=cfg.probe.encoder_dropout,
                                feature_dtype=cfg.probe.feature_dtype)
  train_data, eval_data = s.train_data, s.eval_data
  if cfg.probe.cache_features:  # Once per static-head set, shared by every seed.
    name = f"{variant}_k{k}"
    compute = lambda d, split: features_lib.compute(
        encoder, d, s.mesh, cfg.run.batch_size,
        features_lib.cache_path(cfg.run.cache_dir, name, split), f"features {name} {split}")
    reused = s.baseline_train_features if k == 0 else None
    if reused is not None:
      logging.info("features %s train: reusing the means pass's forward.", name)
    train_data = reused if reused is not None else compute(s.train_data, "train")
    eval_data = compute(s.eval_data, "eval")
  for seed, run_dir, fp in todo:
    t0 = time.perf_counter()
    _, history, logits = train.fit(
        f"probe {variant} k={k} seed={seed}", probe_module(s), encoder,
        train.make_optimizer(cfg.probe), fit_config(s, cfg.probe.epochs, seed, run_dir, fp),
        train_data, eval_data, score_fn(s), s.mesh)
    metric = s.task.headline_metric
    row = dict(model=cfg.model.name, task=s.task.name, variant=variant, static_heads=k,
               total_heads=mc.total_heads, fraction=k / mc.total_heads, seed=seed,
               metric=metric, score=history[-1][metric],
               best_score=max(h[metric] for h in history),
               scores={m: history[-1][m] for m in s.task.metrics},
               examples=len(s.train_data), eval_examples=len(s.eval_data),
               epochs=len(history), seconds=time.perf_counter() - t0, history=history,
               fingerprint=fp)
    if parallel.is_main_process():
      results.save_predictions(os.path.join(run_dir, "predictions.npz"),
                               _predictions(s.task.kind, logits), s.eval_data.labels,
                               logits if s.task.kind != "tagging" else None)
      workdir_lib.write_json(os.path.join(run_dir, "result.json"), row)
    rows[seed] = row
  return [rows[seed] for seed in s.seeds]


def _check_probe_inputs(s: Setup):
  """Ranking, means and cache budget, checked before any probe trains."""
  mc = s.model.config
  ranking = None
  if needs_ranking(s):
    ranking = schedule.load_ranking(s.path("sort", "sorted_heads.json"), mc.num_layers,
                                    mc.num_heads)
  if any(s.static_head_counts):
    for v in s.variants:
      s.load_means(v)
  if s.config.probe.cache_features:
    n = len(s.train_data) + len(s.eval_data)
    features_lib.check_budget(features_lib.cache_bytes(
        n, mc.num_hidden_states, s.L, mc.hidden_size, s.config.probe.feature_dtype),
        s.config.run.cache_max_gb, f"{n} examples")
  return ranking


def stage_probe(s: Setup) -> list[dict]:
  ranking = _check_probe_inputs(s)
  rows = []
  for variant in s.variants:
    for k in s.static_head_counts:
      if k == 0 and variant != "raw":
        continue  # One baseline serves every variant.
      rows.extend(_probe_runs(s, variant, k, ranking))
  meta = dict(config=s.config.to_dict(), seeds=list(s.seeds),
              label_names=list(s.task.label_names), model_fingerprint=s.model_fingerprint,
              **workdir_lib.provenance())
  if parallel.is_main_process():
    clean = [{k: v for k, v in r.items() if k not in ("history", "fingerprint")} for r in rows]
    paths = results.write_all(s.workdir, clean, meta)
    logging.info("Results: %s\n%s", paths["md"], results.markdown(clean))
  return rows


def _analysis(name: str):
  def stage(s: Setup):
    # pylint: disable-next=import-outside-toplevel
    from papa_jax.analysis import stage as effective_stage
    from papa_jax.analysis import stages  # pylint: disable=import-outside-toplevel
    return {"effective": effective_stage.run, "finetune": stages.run_finetune,
            "linguistic": stages.run_linguistic, "ablation": stages.run_ablation}[name](s)
  return stage


STAGES = {"means": stage_means, "sort": stage_sort, "probe": stage_probe,
          **{n: _analysis(n) for n in ("effective", "finetune", "linguistic", "ablation")}}
PLANS = {"all": ("means", "sort", "probe"), "ablation": ("means", "ablation")}


def run(config: ml_collections.ConfigDict, workdir: str):
  """Runs `config.stage` in `workdir` ("all": means, sort, probe); returns its result."""
  config_schema.validate(config)
  workdir_lib.prepare(workdir)
  main = parallel.is_main_process()
  if config.stage == "explore":
    from papa_jax import explorer  # pylint: disable=import-outside-toplevel
    with workdir_lib.lock(workdir) if main else contextlib.nullcontext():
      return explorer.run(config, workdir) if main else None
  if config.stage in ("suite", "report"):
    from papa_jax import suite  # pylint: disable=import-outside-toplevel
    if config.stage == "suite":
      return suite.run_suite(config, workdir)  # Each cell takes its own lock.
    with workdir_lib.lock(workdir) if main else contextlib.nullcontext():
      return suite.write(config, workdir) if main else None
  with workdir_lib.lock(workdir) if main else contextlib.nullcontext():
    s = Setup(config, workdir)
    s.check_inputs()  # Nothing is written before the data has been read and checked.
    workdir_lib.bind(config, workdir, main_process=main)
    out = None
    for name in PLANS.get(config.stage, (config.stage,)):
      t0 = time.perf_counter()
      out = STAGES[name](s)
      parallel.sync(f"stage {name} written")  # Later stages read what process 0 wrote.
      logging.info("Stage %s finished in %.1fs.", name, time.perf_counter() - t0)
  return out
