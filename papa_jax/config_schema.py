"""The experiment config: its defaults, which fields change results, its checks.

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

import json
from typing import Any

import ml_collections

from papa_jax.errors import ConfigError

VARIANTS = ("raw", "effective", "uniform", "row_mean", "compressed")  # papa/constants.py
FEATURE_DTYPES = ("float32", "bfloat16")
ABLATIONS = ("uniform", "constant", "effective")
ORDERINGS = ("lambda", "random", "entropy", "variance", "kl", "gradient", "ablation")
# Per-layer context-mixing maps the explorer can store per example (`api.context_mixing`).
EXPLORE_MIXING = ("attention", "attention_rollout", "attn", "attnres", "attnresln", "globenc",
                  "globenc_rollout", "alti", "alti_rollout", "value_zeroing",
                  "value_zeroing_rollout")
RESULT_GROUPS = ("model", "data", "sort", "probe", "effective", "finetune", "ablation",
                 "mixing")
PAPA_GROUPS = ("model", "data", "sort", "probe")  # What means, sort and probe runs depend on.
NON_RESULT_GROUPS = ("papa", "run", "figures", "report", "suite", "explore")
NON_RESULT_FIELDS = ("stage", "overwrite")
# Fields that moved between groups (old dotted name -> new): `migrate` reads old workdirs.
MOVED = {"effective.other_model": "finetune.other_model",
         "effective.ablations": "ablation.kinds",
         "effective.example_index": "figures.example_index",
         "effective.figure_layer": "figures.layer",
         "effective.figure_head": "figures.head"}


def get_config() -> ml_collections.ConfigDict:
  """The defaults: the PAPA paper's recipe (`shared/spec/papa.md` §7.3)."""
  c = ml_collections.ConfigDict()
  c.stage = "all"  # A stage of papa_jax/registry.py (all: means, sort, probe) or a command.
  c.overwrite = False  # Replace results of a different config in the workdir.

  c.model = ml_collections.ConfigDict(dict(
      name="bert-base-uncased",  # Hub id, packaged model id, or local directory.
      # Matmul dtype: float32, bfloat16 (float32 parameters, residuals, LayerNorms,
      # softmax and attention sums), or auto: float32 on CPU, bfloat16 on GPU/TPU.
      dtype="auto",
  ))
  c.data = ml_collections.ConfigDict(dict(
      # A built-in task (cola sst2 mrpc qqp stsb mnli qnli rte wnli ner pos chunk udpos),
      # or 'custom': the task declared in data.custom below (docs/tasks.md).
      task="sst2",
      source="local",  # local (the task's files, read directly) | tfds (catalog, built-ins)
      # Local files; '' means $PAPA_SHARED/data/<task folder> (udpos: required, a UD
      # treebank directory; custom: the working directory).
      data_dir="",
      max_length=64,
      papa_layout=True,  # Fixed positional layout (spec §3).
      faithful_segment_ids=True,  # Keep the original code's segment ids (spec §10.3).
      max_train_examples=-1,  # Seeded random subset of the train split; -1: all.
      max_eval_examples=-1,
      subsample_seed=0,
      skip_malformed=False,  # Skip (and count) malformed rows instead of failing.
      # Read only when task='custom'. Tuples are Python literals on the command line:
      # --config.data.custom.text_fields="('question', 'answer')".
      custom=ml_collections.ConfigDict(dict(
          name="",  # Shown in results; '' means 'custom'. Not a built-in task's name.
          format="",  # csv | tsv | jsonl | conll | conllu
          kind="classification",  # classification | regression | tagging (conll, conllu)
          # Split files, relative to data_dir (or absolute); test is optional.
          train="", validation="", test="",
          header=True,  # csv/tsv: the first row names the columns.
          quoting="",  # csv/tsv: '' = the format's (csv: rfc4180, tsv: none) | rfc4180 | none
          # csv/tsv/jsonl: the one (single text) or two (pair) text fields and the label:
          # header names or JSON keys; with header=False, 0-based column numbers as
          # strings, e.g. ('3',) and '1'.
          text_fields=(),
          label_field="",
          # Labels (tags) in label-id order, spelled as in the files; () collects them
          # from the train split, sorted (numerically if all are integers).
          label_names=(),
          # () = per kind: classification accuracy; regression pearson, spearman;
          # tagging entity f1, precision, recall, accuracy if the tags are IOB-like,
          # else token accuracy. The first is the headline. Classification: accuracy,
          # f1 (binary, of the second label), matthews_correlation. Tagging: a subset
          # of (f1, precision, recall, accuracy) with f1 (entities), or ('accuracy',).
          metrics=(),
          token_column=0,  # conll: the token's column (0-based).
          tag_column=-1,  # conll: the tag's column; negative counts from the last.
          separator="whitespace",  # conll: whitespace (spaces and tabs) | tab
          tag_field="upos",  # conllu: upos | xpos
      )),
  ))
  c.papa = ml_collections.ConfigDict(dict(
      fractions=(0.0, 0.5, 0.875, 0.9375, 1.0),  # Of all heads, taken in sorted order.
      # Constants (papa/constants.py): raw (PAPA's mean), effective (its mean of effective
      # attention), and the controls uniform, row_mean, compressed.
      variants=("raw",),
      seeds=(42,),  # Probe seeds: every run (the baseline too) is repeated per seed.
      # Head orderings (papa/orderings.py): lambda (PAPA's gates), random, entropy,
      # variance, kl, gradient, ablation. Every variant runs with lambda; the other
      # orderings run with the raw mean.
      orderings=("lambda",),
      random_draws=5,  # Seeded permutations when orderings has "random".
  ))
  c.sort = ml_collections.ConfigDict(dict(
      epochs=15,  # The paper's sorting run uses the probing recipe.
      gate_learning_rate=2e-5,
      max_train_examples=-1,  # Sort on a seeded subset of the train data; -1: all of it.
      seed=42,  # Probe initialisation and data order of the sorting run.
  ))
  c.probe = ml_collections.ConfigDict(dict(
      learning_rate=2e-5, epochs=15, batch_size=16,
      weight_decay=0.0, adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8, grad_clip_norm=1.0,
      encoder_dropout=True,  # The frozen backbone stays in train mode (as the paper).
      probe_dropout=-1.0,  # -1: the checkpoint's recipe (hidden dropout; 0 for RoBERTa).
      cache_features=False,  # Compute encoder outputs once (needs encoder_dropout=False).
      feature_dtype="float32",  # Dtype of encoder outputs fed to the probe (cache dtype).
  ))
  c.effective = ml_collections.ConfigDict(dict(  # The analysis stages' split and options.
      split="validation",
      max_examples=-1,
      rtol=-1.0,  # Rank tolerance relative to sigma_max; -1: max(n, d) * eps.
      min_valid_tokens=0,  # Only examples with more real tokens than this.
  ))
  c.finetune = ml_collections.ConfigDict(dict(
      other_model="",  # The fine-tuned (or other) checkpoint compared with model.name.
  ))
  c.ablation = ml_collections.ConfigDict(dict(
      kinds=ABLATIONS,  # Head replacements, each a map of score changes.
  ))
  c.mixing = ml_collections.ConfigDict(dict(  # stage=mixing (papa_jax/mixing.py).
      # norms (K20/K21), alti, globenc, value_zeroing; attention rollout always.
      methods=("norms", "alti", "globenc", "value_zeroing"),
      alti_chunk=16,  # Query rows per ALTI chunk (memory: batch x chunk x L x D floats).
      vz_chunk=8,  # Zeroed tokens per value-zeroing chunk (batch x L x chunk x FFN floats).
      reference_quirks=False,  # ALTI as mt-upc's code computes it (LN scale, L1 shift).
      allow_low_precision=False,  # Run on a bfloat16 model (identities to about 1e-2).
  ))
  c.figures = ml_collections.ConfigDict(dict(  # What the effective stage's example shows.
      example_index=0,  # Which long example of the analysis split.
      layer=-1,  # Layer and head; -1: the largest null part.
      head=-1,
  ))
  c.explore = ml_collections.ConfigDict(dict(
      examples=(0, 1, 2),  # Dev indices (whole validation split, file order) shown first.
      max_examples=8,  # Stored in all, padded with the next dev examples; <= 0: just `examples`.
      output="explorer.html",  # Under the workdir.
      # Context-mixing maps per shown example and layer (EXPLORE_MIXING, papa_jax/mixing.py);
      # () = none. value_zeroing costs every layer's FFN once per token (tens of forward
      # passes). Needs a float32 model (model.dtype); else skipped with a warning.
      mixing=("attention_rollout", "attnresln", "globenc", "alti", "alti_rollout",
              "value_zeroing"),
  ))
  c.report = ml_collections.ConfigDict(dict(
      n_boot=10_000,  # Bootstrap resamples (over dev examples and probe seeds).
      seed=0,
      level=0.95,  # Interval coverage.
  ))
  c.run = ml_collections.ConfigDict(dict(
      log_every_steps=100,
      batch_size=32,  # Global batch of every forward-only pass (means, features, eval).
      checkpoint_every_batches=200,  # Means partial sums saved for resuming; 0: never.
      checkpoint_every_steps=0,  # Probe checkpoints within an epoch; 0: at epoch ends only.
      num_devices=-1,  # Devices of the data mesh; -1: every device.
      cache_dir="",  # '' keeps cached features in memory; else a folder for .npy files.
      cache_max_gb=8.0,
      # A workdir on object storage (gs://) is locked by a lease object; one whose
      # heartbeat is older than this many seconds is taken over (papa_jax/lease.py).
      lease_stale_seconds=120.0,
      distributed=ml_collections.ConfigDict(dict(
          enabled=False,  # jax.distributed.initialize() for multi-host (TPU pod) runs.
          coordinator_address="", num_processes=-1, process_id=-1, local_device_count=-1,
          cpu_collectives="",  # 'gloo' for CPU multi-process runs.
          # Every process all-gathers its SIGTERM flag at every N-th check of the loops,
          # so all stop at the same step (papa_jax/preemption.py).
          preemption_check_every=10,
      )),
  ))
  return c


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


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
NAME_LISTS = ("papa.variants", "papa.orderings", "ablation.kinds", "mixing.methods",
              "explore.mixing")


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
  if config.run.cache_max_gb <= 0:
    raise ConfigError("run.cache_max_gb must be > 0.")
  if "://" in config.run.cache_dir:
    raise ConfigError(f"run.cache_dir={config.run.cache_dir!r} must be a local folder (cached "
                      "features are memory-mapped); the workdir itself may be on gs://.")
  if not config.run.lease_stale_seconds > 0:
    raise ConfigError("run.lease_stale_seconds must be > 0.")
  if not (config.report.n_boot >= 100 and 0.5 < config.report.level < 1):
    raise ConfigError("report.n_boot must be >= 100 and report.level in (0.5, 1).")
  bad = set(config.ablation.kinds) - set(ABLATIONS)
  if bad or not config.ablation.kinds:
    raise ConfigError(f"ablation.kinds={tuple(config.ablation.kinds)!r}: use a non-empty "
                      f"subset of {ABLATIONS}.")
  bad = set(config.mixing.methods) - {"norms", "alti", "globenc", "value_zeroing"}
  if bad:
    raise ConfigError(f"mixing.methods={tuple(config.mixing.methods)!r}: use a subset of "
                      "('norms', 'alti', 'globenc', 'value_zeroing').")
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
