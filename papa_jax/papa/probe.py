"""The probe stage: a fresh probe per static-head set and seed, and the results files.

For every variant (the constant: `papa/constants.py`) with PAPA's ranking,
and for every other head ordering (`papa/orderings.py`) with the raw mean,
and every static-head count k of the schedule, the first k heads of the
ordering become constant and a probe trains on the frozen encoder, once per
probe seed (the baseline, k = 0, serves them all); the seeds of one head set
train together, vmapped, where their features are cached on one device
(`fitting.fit_many`), each as if alone. Each run writes
`probe/{variant}[_{ordering}]_k{K}_s{seed}/result.json` and `predictions.npz`.
Runs are found by content: a run whose fingerprint (model, config, variant,
the constant heads, seed) exists anywhere under `probe/` is reused, so a head
set two orderings reach trains once. Then `results.{json,csv,md}` and
`papa_curve.png`.
"""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from papa_jax import chance, parallel, results, uncertainty
from papa_jax.config import schema as config_schema
from papa_jax.probing import fitting, train
from papa_jax.workdir import storage, rules as workdir
from papa_jax.probing import features as features_lib
from papa_jax.attention import AttentionOverride
from papa_jax.workdir.layout import RELATIVE, Layout
from papa_jax.papa import means, orderings, schedule
from papa_jax.papa.sort import needs_ranking, static_head_counts
from papa_jax.errors import IncompleteWorkdir
from papa_jax.stage import Setup, Stage


def _features(setup: Setup, encoder: train.FrozenEncoder, name: str, k: int):
  """Cached train and eval features of one static-head set, shared by every seed."""
  cfg, folder = setup.config, features_lib.run_cache_folder(setup)
  compute = lambda d, split: features_lib.compute(
      encoder, d, setup.mesh, cfg.run.batch_size,
      features_lib.cache_path(folder, name, split), f"features {name} {split}")
  reused = setup.baseline_train_features if k == 0 else None
  if reused is not None:
    logging.info("features %s train: reusing the means pass's forward.", name)
  return (reused if reused is not None else compute(setup.train_data, "train"),
          compute(setup.eval_data, "eval"))


def finished_runs(setup: Setup) -> dict[str, dict]:
  """Every finished probing run of the workdir by fingerprint (its result row)."""
  out = {}
  for path in storage.glob(setup.layout.probe_result("*", "*", "*")):
    row = workdir.read_json(path)
    run = os.path.relpath(os.path.dirname(path), setup.workdir)
    out[row.get("fingerprint")] = dict(row, run=row.get("run", run))
  return out


def baseline_fit(setup: Setup, seed: int):
  """The baseline probe's module, encoder, optimizer and settings (k = 0, `seed`)."""
  cfg, mc = setup.config, setup.model.config
  heads = np.zeros((mc.num_layers, mc.num_heads), bool).tolist()
  fp = setup.result_fingerprint(stage="probe", variant="raw", k=0, heads=heads, seed=seed)
  encoder = train.FrozenEncoder(setup.model.params, None, mc, dropout=cfg.probe.encoder_dropout,
                                feature_dtype=cfg.probe.feature_dtype)
  fit = train.FitConfig.from_config(
      cfg, cfg.probe.epochs, seed, setup.layout.checkpoints(setup.layout.probe_run("raw", 0, seed)),
      fp)
  return (train.probe_module(setup.task, mc, cfg.probe), encoder,
          train.make_optimizer(cfg.probe), fit)


def restore_baseline(workdir_path: str, seed: int | None = None):
  """A finished workdir's baseline probe (no constant head; `seed`, default the first) for
  use as a metric: `(probe module, its parameters, the workdir's Setup)`. Its config is the
  workdir's own (`config.json` over today's defaults); its data files must be where the
  config says (the checkpoint is checked against their content)."""
  path = Layout(workdir_path).config
  if not storage.exists(path):
    raise IncompleteWorkdir(f"{path} does not exist: {workdir_path} is not a finished workdir.")
  config = config_schema.get_config()
  config.update(config_schema.migrate(workdir.read_json(path)))
  setup = Setup(config, workdir_path, inputs=("train", "eval"))
  seed = setup.seeds[0] if seed is None else seed
  if seed not in setup.seeds:
    # caller's argument
    raise ValueError(f"seed {seed}: {workdir_path} trained probes with seeds {setup.seeds}.")
  module, encoder, tx, fit = baseline_fit(setup, seed)
  params = fitting.restore_final(module, encoder, tx, fit, setup.max_length)["probe"]
  return module, jax.device_get(params), setup


def baseline_runs(setup: Setup) -> list[dict]:
  """The baseline probes (k = 0), trained unless they are done."""
  return probe_runs(setup, "raw", "lambda", 0, None, finished_runs(setup))


def fit_unit(setup: Setup, variant: str) -> dict:
  """What a probe on fitted constants depends on beyond the PAPA groups: the fit's own config
  (`optimal`); nothing for the other variants (their fingerprints stay as they were)."""
  if variant != "optimal":
    return {}
  return dict(optimal=config_schema.result_config(setup.config, ("optimal",)))


def probe_runs(setup: Setup, variant: str, ordering: str, k: int, ranking,
               done: dict[str, dict]) -> list[dict]:
  """The probing runs of one static-head set, per seed: the first k heads of `ranking`
  with the constants of `variant`. `done` (fingerprint -> row) is searched first and
  gets the new rows."""
  cfg, mc, layout, task = setup.config, setup.model.config, setup.layout, setup.task
  static = schedule.static_heads(ranking, k, mc.num_layers, mc.num_heads)
  todo, rows = [], {}
  for seed in setup.seeds:
    fp = setup.result_fingerprint(stage="probe", variant=variant, k=k, heads=static.tolist(),
                                  seed=seed, **fit_unit(setup, variant))
    if fp in done:
      logging.info("probe %s %s k=%d seed=%d: done before (%s).", variant, ordering, k, seed,
                   done[fp]["run"])
      rows[seed] = dict(done[fp], ordering=ordering)
    else:
      todo.append((seed, fp))
  if not todo:
    return [rows[seed] for seed in setup.seeds]
  override = None
  if k:
    override = AttentionOverride.constant(jnp.asarray(means.constant_matrices(setup, variant)),
                                          static)
  encoder = train.FrozenEncoder(setup.model.params, override, mc,
                                dropout=cfg.probe.encoder_dropout,
                                feature_dtype=cfg.probe.feature_dtype)
  train_data, eval_data = setup.train_data, setup.eval_data
  if cfg.probe.cache_features:  # Once per static-head set, shared by every seed.
    name = f"{variant}_k{k}" if ordering == "lambda" else f"{variant}_{ordering}_k{k}"
    train_data, eval_data = _features(setup, encoder, name, k)
  t0 = time.perf_counter()
  run_dirs = [layout.probe_run(variant, k, seed, ordering) for seed, _ in todo]
  fits = fitting.fit_many(
      f"probe {variant} {ordering} k={k}" + (f" seed={todo[0][0]}" if len(todo) == 1 else ""),
      train.probe_module(task, mc, cfg.probe), encoder, train.make_optimizer(cfg.probe),
      [train.FitConfig.from_config(cfg, cfg.probe.epochs, seed, layout.checkpoints(d), fp)
       for (seed, fp), d in zip(todo, run_dirs)],
      train_data, eval_data, train.scorer(task, setup.eval_data.labels), setup.mesh)
  seconds = (time.perf_counter() - t0) / len(todo)  # Probes trained together share the time.
  revision = workdir.git_revision()  # The code that trained these probes (results.json's
  # own git_revision names whichever run last wrote it, possibly passing over them).
  for (seed, fp), run_dir, (_, history, logits) in zip(todo, run_dirs, fits):
    metric = task.headline_metric
    row = dict(model=cfg.model.name, task=task.name, variant=variant, ordering=ordering,
               static_heads=k, total_heads=mc.total_heads, fraction=k / mc.total_heads,
               seed=seed, metric=metric, score=history[-1][metric],
               best_score=max(h[metric] for h in history),
               scores={m: history[-1][m] for m in task.metrics},
               examples=len(setup.train_data), eval_examples=len(setup.eval_data),
               epochs=len(history), seconds=seconds, trained_with=len(todo),
               git_revision=revision, history=history, fingerprint=fp,
               run=os.path.relpath(run_dir, setup.workdir))
    if parallel.is_main_process():
      results.save_predictions(layout.probe_predictions(variant, k, seed, ordering),
                               train.predictions(task.kind, logits), setup.eval_data.labels,
                               logits if task.kind != "tagging" else None)
      workdir.write_json(layout.probe_result(variant, k, seed, ordering), row)
    rows[seed] = done[fp] = row
  folder = features_lib.run_cache_folder(setup)
  if cfg.probe.cache_features and folder:
    del train_data, eval_data  # Their memory maps, before the files go.
    features_lib.remove_cache(folder, name)
  return [rows[seed] for seed in setup.seeds]


def _check_inputs(setup: Setup):
  """Ranking and means, checked before any probe trains (the cache budget is the stage's
  `check`, run before every stage)."""
  mc = setup.model.config
  ranking = None
  if needs_ranking(setup):
    ranking = schedule.load_ranking(setup.layout.ranking, mc.num_layers, mc.num_heads)
  if any(static_head_counts(setup)):
    for v in setup.variants:
      means.constant_matrices(setup, v)
  return ranking


def _check_cache_budget(setup: Setup) -> None:
  """The feature cache fits `run.cache_max_gb`: checked before any stage runs, so a model
  too large for the budget fails in seconds, not after the means and sorting runs."""
  if setup.config.probe.cache_features:
    mc = setup.model.config
    n = len(setup.train_data) + len(setup.eval_data)
    features_lib.check_budget(features_lib.cache_bytes(
        n, mc.num_hidden_states, setup.max_length, mc.hidden_size,
        setup.config.probe.feature_dtype), setup.config.run.cache_max_gb, f"{n} examples")


def runs(setup: Setup) -> list[tuple[str, str, int]]:
  """(variant, ordering, k) of every probing run: each variant with PAPA's ranking, each
  other ordering with the raw mean; one baseline (raw, lambda, 0) serves them all."""
  out = []
  for variant in setup.variants:
    for name in orderings.names(setup.config) if variant == "raw" else ("lambda",):
      out += [(variant, name, k) for k in static_head_counts(setup)
              if k or (variant, name) == ("raw", "lambda")]
  return out


def _run(setup: Setup) -> list[dict]:
  ranking = _check_inputs(setup)
  rankings = {name: ranking if name == "lambda" else orderings.load(setup, name)
              for name in orderings.names(setup.config)}
  done, rows = finished_runs(setup), []
  for variant, name, k in runs(setup):
    rows.extend(probe_runs(setup, variant, name, k, rankings[name], done))
    if k == 0:  # Only the baseline reuses the means pass's features: free them.
      setup.baseline_train_features = None
  meta = dict(config=setup.config.to_dict(), seeds=list(setup.seeds),
              label_names=list(setup.task.label_names), model_fingerprint=setup.model_fingerprint,
              input_files=setup.file_hashes(), **workdir.provenance())
  if parallel.is_main_process():
    clean = [{k: v for k, v in r.items() if k not in ("history", "fingerprint")} for r in rows]
    meta.update(check=_baseline_check(setup, clean), ranking_check=_ranking_check(setup))
    paths = results.write_all(setup.layout, clean, meta)
    logging.info("Results: %s\n%s", paths["md"], results.markdown(clean))
    for line in results.warnings(meta) + [results.optimal_warning(clean)]:
      if line:
        logging.warning("%s", line)
  return rows


def _baseline_check(setup: Setup, rows: list[dict]) -> dict | None:
  """Whether the baseline probe learned anything (`chance.probe_check` on its saved dev
  predictions, every seed; the report's bootstrap seed); None without a baseline."""
  preds, labels = {}, None
  for r in rows:
    if (r["variant"], r.get("ordering", "lambda"), r["static_heads"]) == ("raw", "lambda", 0):
      with np.load(storage.readable(setup.layout.row_predictions(r))) as z:
        preds[r["seed"]], labels = z["predictions"], z["labels"]
  if not preds:
    return None
  rep = setup.config.report
  return chance.probe_check(setup.task, labels, preds, level=rep.level, n_boot=rep.n_boot,
                            seed=uncertainty.task_seed(rep.seed, setup.task.name))


def _ranking_check(setup: Setup) -> dict | None:
  """The sorting run's learned-nothing check, when this run's constant heads follow its
  ranking (`sort/history.json`; None when no ranking was needed or it predates the check)."""
  if not needs_ranking(setup) or not storage.exists(setup.layout.sort_history):
    return None
  return workdir.read_json(setup.layout.sort_history).get("check")


STAGE = Stage(name="probe", run=_run, inputs=("train", "eval"),
              needs=("means", "optimal", "sort", "orderings"),
              writes=(RELATIVE.probe_result("*", "*", "*"), RELATIVE.results()),
              groups=config_schema.PAPA_GROUPS, check=_check_cache_budget, memory="probe",
              batch_size="probe.batch_size")
