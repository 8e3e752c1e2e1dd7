"""The experiment config: its defaults (from `config_fields`), which fields change results,
its checks.

Groups and what they mean for a workdir:
  * result groups (`RESULT_GROUPS`): every field changes some result; a stage
    declares the groups its results depend on (`stage.Stage.groups`), the
    workdir is bound to them while its outputs exist, and its fingerprints
    cover them, so a new field added to one of these groups is covered
    automatically;
  * `papa`: which probing runs exist (fractions, variants, seeds); extending
    it reuses finished runs, it never changes one;
  * `run`, `figures`, `explore`, `report`, `suite` and the top-level `stage` /
    `overwrite`: how and where to compute or show things; they never change a
    result.
Every check of a config that needs neither data nor the registry lives here
and raises `ConfigError` (`validate`); the checks that need the model or the
mesh follow it; `run.check_config` adds the task declaration and the stage name.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

import ml_collections

from papa_jax.config.fields import (ABLATIONS, DATA_FORMATS, EXPLORE_MIXING, FEATURE_DTYPES,
                                    FIELDS, KNOCKOUT_CLASSES, KNOCKOUT_RULES, MIXING_METHODS,
                                    ORDERINGS, PATCHING_SITES, VARIANTS, Group)
from papa_jax.errors import ConfigError

RESULT_GROUPS = ("model", "data", "sort", "optimal", "probe", "effective", "finetune",
                 "ablation", "knockout", "patching", "mixing")
OPTIMAL_OBJECTIVES = ("task", "hidden")  # What the optimal constant's fit minimises.
PAPA_GROUPS = ("model", "data", "sort", "probe")  # What means, sort and probe runs depend on.
NON_RESULT_GROUPS = ("papa", "run", "figures", "report", "suite", "explore")
NON_RESULT_FIELDS = ("stage", "overwrite")
# Fields that moved between groups (old dotted name -> new): `migrate` reads old workdirs.
MOVED = {"effective.other_model": "finetune.other_model",
         "effective.ablations": "ablation.kinds",
         "effective.example_index": "figures.example_index",
         "effective.figure_layer": "figures.layer",
         "effective.figure_head": "figures.head"}

SEED_PAIRINGS = ("paired", "independent")  # report.seed_pairing


def _build(fields: dict) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({
      k: _build(f.fields) if isinstance(f, Group) else f.default for k, f in fields.items()})


def get_config() -> ml_collections.ConfigDict:
  """The defaults (`config_fields.FIELDS`): the PAPA paper's probing recipe (docs/config.md)."""
  return _build(FIELDS)


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def changed_fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The fields of `config` whose values differ from the schema's defaults (and those the
  schema does not have, such as a suite's), flattened: 'probe.epochs' -> 15."""
  default = _flat(json.loads(get_config().to_json_best_effort()))
  return {k: v for k, v in _flat(json.loads(config.to_json_best_effort())).items()
          if k not in default or default[k] != v}


def result_config(config: ml_collections.ConfigDict | dict,
                  groups: tuple[str, ...] = RESULT_GROUPS) -> dict[str, Any]:
  """The flattened fields that decide results (of `groups`), nothing else."""
  d = config if isinstance(config, dict) else json.loads(config.to_json_best_effort())
  return _flat({k: v for k, v in d.items() if k in groups})


def migrate(saved: dict) -> dict:
  """A config.json of an earlier version with moved fields under their new names."""
  flat = _flat(saved)
  for old, new in MOVED.items():
    if old in flat:
      flat.setdefault(new, flat.pop(old))
  if "sort.gate_learning_rate" in flat and not any(k.startswith("optimal.") for k in flat):
    # Before the `optimal` group the fit ran at the sorting run's rate and epochs.
    flat.update({"optimal.learning_rate": flat["sort.gate_learning_rate"],
                 "optimal.epochs": -1, "optimal.probe_epochs": -1, "optimal.held_out": 0.2,
                 "optimal.objective": "task"})
  out: dict = {}
  for key, v in flat.items():
    node = out
    *parents, leaf = key.split(".")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return out


def unclassified_fields(config: ml_collections.ConfigDict) -> list[str]:
  """Top-level keys that are neither result nor non-result (a schema bug)."""
  known = set(RESULT_GROUPS) | set(NON_RESULT_GROUPS) | set(NON_RESULT_FIELDS)
  return sorted(set(config.keys()) - known)


# Tuple-of-names fields a user writes as `--config.papa.orderings=lambda,random`:
# `quote_name_lists` makes that a tuple literal before the flag parser sees it
# (ml_collections would read `lambda,...` as Python and fail on the keyword).
NAME_LISTS = ("papa.variants", "papa.orderings", "ablation.kinds", "knockout.classes",
              "patching.sites", "mixing.methods", "explore.mixing", "explore.figures")


def quote_name_lists(argv: list[str]) -> list[str]:
  """`--config.<name list>=a,b` -> `--config.<name list>=('a','b')` (already quoted or
  bracketed values are left alone)."""
  out = []
  for arg in argv:
    key, eq, value = arg.partition("=")
    if eq and key[len("--config."):] in NAME_LISTS and not any(c in value for c in "()[]'\""):
      names = [v.strip() for v in value.split(",") if v.strip()]
      arg = f"{key}=(" + "".join(f"{n!r}," for n in names) + ")"
    out.append(arg)
  return out


def launcher_argv(argv: list[str]) -> list[str]:
  """The launcher's flags as the flag parser must see them: name lists quoted; a flag of a
  moved field, or of no field, raises `ConfigError` naming the field (not absl's
  traceback)."""
  overrides = [a.split("=")[0][len("--config."):] for a in argv if a.startswith("--config.")]
  for path in overrides:
    if path in MOVED:
      raise ConfigError(f"--config.{path} was renamed: use --config.{MOVED[path]}.")
  if overrides:
    spec = [a[len("--config="):] for a in argv if a.startswith("--config=")]
    config = config_file(spec[-1]) if spec else get_config()
    if config is not None:
      check_fields(overrides, config)
  return quote_name_lists(argv)


def config_file(spec: str) -> ml_collections.ConfigDict | None:
  """The config that `--config=spec` ('configs/x.py[:arg]') names, without overrides; None
  when it cannot be loaded (the flag parser then says why)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  from ml_collections import config_flags  # pylint: disable=import-outside-toplevel
  fv = flags.FlagValues()
  argv = ["main", f"--config={spec}"]
  holder = config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=argv)
  try:
    fv(argv)
    return holder.value
  except Exception:  # pylint: disable=broad-except
    return None


def check_field(path: str, config: ml_collections.ConfigDict | None = None) -> None:
  """`ConfigError` unless `path` ('probe.learning_rate') names a field or group of `config`
  (default: the schema's), naming the nearest fields and the group's own."""
  check_fields([path], config)


def check_fields(paths: list[str], config: ml_collections.ConfigDict | None = None) -> None:
  """`check_field` for each of `paths`, flattening `config` once."""
  leaves = _flat(json.loads((config or get_config()).to_json_best_effort()))
  groups = {leaf.rsplit(".", i)[0] for leaf in leaves for i in range(1, leaf.count(".") + 1)}
  for path in paths:
    if path in leaves or path in groups:
      continue
    near = difflib.get_close_matches(path, list(leaves), n=2, cutoff=0.85)
    group = path.rpartition(".")[0]
    own = [leaf[len(group) + 1:] for leaf in leaves if group in groups
           and leaf.startswith(group + ".") and "." not in leaf[len(group) + 1:]]
    raise ConfigError(
        f"--config.{path}: no such config field"
        + (f"; did you mean {' or '.join('--config.' + n for n in near)}?" if near else ".")
        + (f" The {group} group has {', '.join(own)}." if own else "")
        + " Every field: docs/config.md.")


def _names(config: ml_collections.ConfigDict, field: str, known: tuple[str, ...],
           first: str) -> tuple[str, ...]:
  """A `papa` tuple of names ('a,b' on the command line works too), checked against
  `known`, with `first` added in front when missing, without repeats."""
  given = tuple(config.papa[field])
  names = tuple(v.strip() for item in given for v in str(item).split(",") if v.strip())
  bad = [v for v in names if v not in known]
  if bad or not names:
    raise ConfigError(f"papa.{field}={given!r}: use a subset of {known}.")
  if first not in names:
    names = (first,) + names
  return tuple(dict.fromkeys(names))


def variants(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """`papa.variants`; raw is always there (the ranking and the baseline come from it)."""
  return _names(config, "variants", VARIANTS, "raw")


def orderings(config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """`papa.orderings`; lambda (PAPA's) is always there."""
  names = _names(config, "orderings", ORDERINGS, "lambda")
  if "random" in names and config.papa.random_draws < 1:
    raise ConfigError(f"papa.random_draws={config.papa.random_draws}: give at least 1 draw "
                      "for the random ordering.")
  return names


def explore_mixing(explore) -> tuple[str, ...]:
  """`explore.mixing` of an `explore` group (ConfigDict or dict; 'a,b' works too), checked
  against `EXPLORE_MIXING`, without repeats; () when absent or empty (no maps)."""
  given = () if explore is None else explore.get("mixing", ())
  given = (given,) if isinstance(given, str) else tuple(given)
  names = tuple(v.strip() for item in given for v in str(item).split(",") if v.strip())
  bad = [v for v in names if v not in EXPLORE_MIXING]
  if bad:
    raise ConfigError(f"explore.mixing={given!r}: {bad} unknown; use a subset of "
                      f"{EXPLORE_MIXING}, or () for none.")
  return tuple(dict.fromkeys(names))


def seeds(config: ml_collections.ConfigDict) -> tuple[int, ...]:
  s = tuple(config.papa.seeds)
  if not s or any(not isinstance(x, int) or isinstance(x, bool) for x in s):
    raise ConfigError(f"papa.seeds={s!r}: give a non-empty tuple of integers, e.g. (42, 43, 44).")
  if len(set(s)) != len(s):
    raise ConfigError(f"papa.seeds={s!r} repeats a seed.")
  return s


def fractions(config: ml_collections.ConfigDict) -> tuple[float, ...]:
  f = tuple(float(x) for x in config.papa.fractions)
  bad = [x for x in f if not 0.0 <= x <= 1.0]
  if bad or not f:
    raise ConfigError(f"papa.fractions={f!r}: give fractions in [0, 1].")
  return f


def validate(config: ml_collections.ConfigDict) -> None:
  """Every check that needs neither data nor model; raises `ConfigError`."""
  if unclassified_fields(config):
    raise ConfigError(f"Config has top-level fields {unclassified_fields(config)} that "
                      "config_schema does not classify as result or non-result fields.")
  if config.model.dtype not in ("auto", "float32", "bfloat16"):
    raise ConfigError(f"model.dtype={config.model.dtype!r}; use auto, float32 or bfloat16.")
  if config.data.source not in ("local", "tfds"):
    raise ConfigError(f"data.source={config.data.source!r}; use 'local' or 'tfds'.")
  if config.data.max_length < 4:
    raise ConfigError(f"data.max_length={config.data.max_length} is too short (need >= 4).")
  variants(config)
  orderings(config)
  seeds(config)
  fractions(config)
  p = config.probe
  if p.feature_dtype not in FEATURE_DTYPES:
    raise ConfigError(f"probe.feature_dtype={p.feature_dtype!r}; use one of {FEATURE_DTYPES}.")
  if p.cache_features and p.encoder_dropout:
    raise ConfigError("probe.cache_features needs a deterministic encoder: set "
                      "probe.encoder_dropout=False (cached features cannot vary per epoch).")
  for name, v in (("probe.epochs", p.epochs), ("probe.batch_size", p.batch_size),
                  ("sort.epochs", config.sort.epochs), ("run.batch_size", config.run.batch_size),
                  ("run.log_every_steps", config.run.log_every_steps)):
    if v < 1:
      raise ConfigError(f"{name}={v} must be >= 1.")
  if not p.learning_rate > 0:
    raise ConfigError(f"probe.learning_rate={p.learning_rate} must be > 0.")
  for name in ("checkpoint_every_batches", "checkpoint_every_steps"):
    if config.run[name] < 0:
      raise ConfigError(f"run.{name} must be >= 0 (0: never / at epoch ends only).")
  if config.run.cache_max_gb <= 0 or config.run.cache_memory_gb < 0:
    raise ConfigError("run.cache_max_gb must be > 0 and run.cache_memory_gb >= 0.")
  if "://" in config.run.cache_dir:
    raise ConfigError(f"run.cache_dir={config.run.cache_dir!r} must be a local folder (cached "
                      "features are memory-mapped); the workdir itself may be on gs://.")
  if not config.run.lease_stale_seconds > 0:
    raise ConfigError("run.lease_stale_seconds must be > 0.")
  if not (config.report.n_boot >= 100 and 0.5 < config.report.level < 1):
    raise ConfigError("report.n_boot must be >= 100 and report.level in (0.5, 1).")
  if config.report.seed_pairing not in SEED_PAIRINGS:
    raise ConfigError(f"report.seed_pairing={config.report.seed_pairing!r}: use one of "
                      f"{SEED_PAIRINGS}.")
  o = config.optimal
  for name in ("probe_epochs", "epochs"):
    if getattr(o, name) < 1 and getattr(o, name) != -1:
      raise ConfigError(f"optimal.{name}={getattr(o, name)}: use >= 1, or -1 for sort.epochs.")
  if not o.learning_rate >= 0:
    raise ConfigError(f"optimal.learning_rate={o.learning_rate}: use >= 0 (0 keeps the mean).")
  if not 0 < o.held_out < 1:
    raise ConfigError(f"optimal.held_out={o.held_out}: use a share in (0, 1).")
  if o.objective not in OPTIMAL_OBJECTIVES:
    raise ConfigError(f"optimal.objective={o.objective!r}: use one of {OPTIMAL_OBJECTIVES}.")
  bad = set(config.ablation.kinds) - set(ABLATIONS)
  if bad or not config.ablation.kinds:
    raise ConfigError(f"ablation.kinds={tuple(config.ablation.kinds)!r}: use a non-empty "
                      f"subset of {ABLATIONS}.")
  k = config.knockout
  if k.rule not in KNOCKOUT_RULES:
    raise ConfigError(f"knockout.rule={k.rule!r}: use one of {KNOCKOUT_RULES}.")
  bad = set(k.classes) - set(KNOCKOUT_CLASSES)
  if bad or not k.classes:
    raise ConfigError(f"knockout.classes={tuple(k.classes)!r}: use a non-empty subset of "
                      f"{KNOCKOUT_CLASSES}.")
  p = config.patching
  bad = set(p.sites) - set(PATCHING_SITES)
  if bad or not p.sites:
    raise ConfigError(f"patching.sites={tuple(p.sites)!r}: use a non-empty subset of "
                      f"{PATCHING_SITES}.")
  if p.max_pairs < 1 or p.chunk < 1:
    raise ConfigError(f"patching.max_pairs={p.max_pairs}, patching.chunk={p.chunk}: use >= 1.")
  bad = set(config.mixing.methods) - set(MIXING_METHODS)
  if bad:
    raise ConfigError(f"mixing.methods={tuple(config.mixing.methods)!r}: use a subset of "
                      f"{MIXING_METHODS}.")
  if config.mixing.alti_chunk < 1 or config.mixing.vz_chunk < 1:
    raise ConfigError("mixing.alti_chunk and mixing.vz_chunk must be >= 1.")
  explore_mixing(config.explore)
  if config.effective.split not in ("train", "validation", "test"):
    raise ConfigError(f"effective.split={config.effective.split!r}; use train, validation or test.")


def compute_dtype(config: ml_collections.ConfigDict, backend: str) -> str:
  """`model.dtype` resolved for a backend ("auto": float32 on CPU, else bfloat16)."""
  if config.model.dtype != "auto":
    return config.model.dtype
  return "float32" if backend == "cpu" else "bfloat16"


def validate_for_model(config: ml_collections.ConfigDict, model_config) -> None:
  """Checks that need the loaded model's `EncoderConfig`."""
  if config.data.max_length > model_config.max_length:
    raise ConfigError(f"data.max_length={config.data.max_length} exceeds the model's "
                      f"{model_config.max_length} positions.")
  if not 1 <= config.knockout.window <= model_config.num_layers:
    raise ConfigError(f"knockout.window={config.knockout.window}: use 1 to the model's "
                      f"{model_config.num_layers} layers.")
  f = config.figures
  for name, v, hi in (("figures.layer", f.layer, model_config.num_layers),
                      ("figures.head", f.head, model_config.num_heads)):
    if not -1 <= v < hi:
      raise ConfigError(f"{name}={v} does not exist in this model ({hi} of them; -1 picks "
                        "the head with the largest null part).")


def validate_for_mesh(config: ml_collections.ConfigDict, mesh_size: int) -> None:
  """Global batch sizes must split evenly over the devices of the mesh."""
  for name, bs in (("probe.batch_size", config.probe.batch_size),
                   ("run.batch_size", config.run.batch_size)):
    if bs % mesh_size:
      raise ConfigError(f"{name}={bs} is not divisible by the {mesh_size} devices of the "
                        "mesh; choose a multiple (the last batch is padded anyway).")
