"""Every config field: its default and what it changes, held as data.

`config_schema.get_config()` builds the default `ConfigDict` from `FIELDS`, and
`config_doc` writes docs/config.md from the same records, so a field's default
and its description have one home. Which groups change results is the schema's
rule (`config_schema.RESULT_GROUPS`); the checks live in `config_schema.validate`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

# Copies of analysis/knockout.py's CLASSES and interventions.KNOCKOUT_RULES (a test compares).
KNOCKOUT_CLASSES = ("cls", "sep", "punctuation", "other", "previous", "next")
# The patching stage's sites: per head ("context") or per position (the others).
PATCHING_SITES = ("context", "residual_in", "residual_out", "attention_output", "mlp_output")
KNOCKOUT_RULES = ("renormalize", "zero")
VARIANTS = ("raw", "effective", "uniform", "row_mean", "compressed", "optimal")  # papa/constants.py
FEATURE_DTYPES = ("float32", "bfloat16")
ABLATIONS = ("uniform", "constant", "effective")
ORDERINGS = ("lambda", "random", "entropy", "variance", "kl", "gradient", "ablation")
DATA_FORMATS = ("csv", "tsv", "jsonl", "conll", "conllu")  # papa_jax/data/formats.py
# The mixing stage's methods (papa_jax/measures/mixing_methods.py, STAGE_METHODS), in the order of
# mixing.methods' default, a results field.
MIXING_METHODS = ("norms", "alti", "globenc", "value_zeroing")
# Per-layer context-mixing maps the explorer can store per example (`api.context_mixing`;
# papa_jax/measures/mixing_methods.py, LABELS).
EXPLORE_MIXING = ("attention", "attention_rollout", "attn", "attnres", "attnresln", "globenc",
                  "globenc_rollout", "alti", "alti_rollout", "value_zeroing",
                  "value_zeroing_rollout")


@dataclasses.dataclass(frozen=True)
class Field:
  """One field: `default` (its type is the field's type) and `doc`, what it changes."""

  default: Any
  doc: str


@dataclasses.dataclass(frozen=True)
class Group:
  """A block of fields (`config.<name>`), with what the block is for."""

  doc: str
  fields: dict[str, Union[Field, "Group"]]


F, G = Field, Group

FIELDS: dict[str, Field | Group] = dict(
    stage=F("all", "What to run: a stage of papa_jax/registry.py (after the stages it needs; "
            "all: means, optimal, sort, orderings, probe) or a command (suite, report, explore)."),
    overwrite=F(False, "Replace the results of a different config (or of edited input files) "
                "in the workdir instead of refusing."),
    model=G("The encoder.", dict(
        name=F("bert-base-uncased", "Hub id, packaged model key (e.g. minilm) or local model "
               "directory."),
        dtype=F("auto", "Matmul dtype: float32, bfloat16 (float32 parameters, residuals, "
                "LayerNorms, softmax and attention sums), or auto: float32 on CPU, bfloat16 on "
                "GPU/TPU."),
    )),
    data=G("The task, its files and how inputs are encoded (docs/tasks.md).", dict(
        task=F("sst2", "A built-in task (cola sst2 mrpc qqp stsb mnli qnli rte wnli ner pos "
               "chunk udpos), or custom: the task declared in data.custom."),
        source=F("local", "local: the task's files, read directly; tfds: the TFDS catalog "
                 "(built-in GLUE and CoNLL-2003 tasks)."),
        data_dir=F("", "Folder of the task's files; '' means $PAPA_SHARED/data/<task folder> "
                   "(udpos: required, a UD treebank directory; custom: the working directory)."),
        max_length=F(64, "Tokens per input (padded or truncated; truncations are counted)."),
        papa_layout=F(True, "PAPA's fixed positional layout: [CLS] and the first segment from "
                      "position 0, the second from L/2, the last separator at L-1, so a head's "
                      "mean attention is over aligned positions. False: the standard layout."),
        faithful_segment_ids=F(True, "PAPA layout: token type ids stay where the tokenizer put "
                               "them before the re-layout (as PAPA's code does); False: 0 up "
                               "to the separator at L/2, 1 after it."),
        max_train_examples=F(-1, "Seeded random subset of the train split; -1: all."),
        max_eval_examples=F(-1, "Seeded random subset of the evaluation split; -1: all."),
        subsample_seed=F(0, "Seed of those subsets (and of the sorting run's and the random "
                         "orderings' draws)."),
        skip_malformed=F(False, "Skip (and count) malformed rows instead of failing; an "
                         "unknown label only in train."),
        custom=G("The task declared in the config; read only when data.task=custom. Tuples "
                 "are Python literals on the command line: "
                 "--config.data.custom.text_fields=\"('question', 'answer')\".", dict(
                     name=F("", "Shown in results; '' means 'custom'. Not a built-in task's "
                            "name."),
                     format=F("", f"{', '.join(DATA_FORMATS[:-1])} or {DATA_FORMATS[-1]}."),
                     kind=F("classification", "classification or regression (csv, tsv, "
                            "jsonl); tagging (conll, conllu)."),
                     train=F("", "The train split's file, relative to data.data_dir (the working "
                             "directory when that is empty) or absolute."),
                     validation=F("", "The validation split's file (scores are reported on "
                                  "it)."),
                     test=F("", "The test split's file; optional."),
                     header=F(True, "csv/tsv: the first row names the columns."),
                     quoting=F("", "csv/tsv: '' = the format's (csv: rfc4180, tsv: none), "
                               "rfc4180 or none."),
                     text_fields=F((), "csv/tsv/jsonl: the one (single text) or two (pair) "
                                   "text fields: header names or JSON keys; with header=False, "
                                   "0-based column numbers as strings, e.g. ('3',)."),
                     label_field=F("", "csv/tsv/jsonl: the label's header name, JSON key or "
                                   "column number (a string, e.g. '1')."),
                     label_names=F((), "Labels (tags) in label-id order, spelled as in the "
                                   "files; () collects them from the train split, sorted "
                                   "(numerically if all are integers)."),
                     metrics=F((), "The first is the headline. () = per kind: classification "
                               "accuracy; regression pearson, spearman; tagging entity f1, "
                               "precision, recall, accuracy if the tags are IOB-like, else "
                               "token accuracy (docs/tasks.md, Metrics)."),
                     token_column=F(0, "conll: the token's column (0-based)."),
                     tag_column=F(-1, "conll: the tag's column; negative counts from the "
                                  "last."),
                     separator=F("whitespace", "conll: whitespace (runs of spaces and tabs) or "
                                 "tab (tabs only, so tokens may hold spaces)."),
                     tag_field=F("upos", "conllu: upos or xpos."),
                 )),
    )),
    papa=G("Which PAPA probing runs exist.", dict(
        fractions=F((0.0, 0.5, 0.875, 0.9375, 1.0), "Fractions of all heads made constant, "
                    "taken in sorted order (0.0 is the baseline)."),
        variants=F(("raw",), "Constants (papa/constants.py): raw (PAPA's mean), effective "
                   "(its mean of effective attention), the controls uniform, row_mean, "
                   "compressed, and optimal (the loss-optimal constant, fitted with a probe: "
                   "papa/optimal.py). raw is always run."),
        seeds=F((42,), "Probe seeds: every run (the baseline too) is repeated per seed."),
        orderings=F(("lambda",), "Head orderings (papa/orderings.py): lambda (PAPA's gates), "
                    "random, entropy, variance, kl, gradient, ablation. Every variant runs "
                    "with lambda; the other orderings run with the raw mean."),
        random_draws=F(5, "Seeded permutations when orderings has random."),
    )),
    sort=G("The sorting run: a probe trained with one gate per head, which ranks the heads.", dict(
        epochs=F(15, "Epochs of the sorting run (the paper's recipe: as many as a probe's)."),
        gate_learning_rate=F(2e-5, "AdamW learning rate of the head gates (the probe uses "
                             "probe.learning_rate)."),
        max_train_examples=F(-1, "Sort on a seeded subset of the train data; -1: all of it."),
        seed=F(42, "Probe initialisation and data order of the sorting run."),
    )),
    optimal=G("The loss-optimal constant's fit (papa.variants optimal; "
              "papa_jax/papa/optimal.py), on the sorting run's train examples.", dict(
        probe_epochs=F(-1, "Epochs of its first part, a probe trained on PAPA's mean alone; "
                       "-1: sort.epochs."),
        epochs=F(-1, "Epochs of its second part, that probe and the constants' logits "
                 "together; -1: sort.epochs."),
        learning_rate=F(0.005, "AdamW learning rate of the constants' logits (the probe uses "
                        "probe.learning_rate); 0 keeps PAPA's mean."),
        held_out=F(0.2, "Share of its train examples kept out to choose its epoch (0 = the "
                   "mean) by their loss."),
        objective=F("task", "task (the constant best for a probe on this task, fitted jointly "
                    "with one) or hidden (task-free: the constant whose encoder best "
                    "reproduces the unmodified last hidden states; no probe, no labels)."),
    )),
    probe=G("The probe on the frozen encoder, trained with AdamW at a constant rate.", dict(
        learning_rate=F(2e-5, "AdamW learning rate."),
        epochs=F(15, "Training epochs per probe."),
        batch_size=F(16, "Global training batch (a multiple of the device count)."),
        weight_decay=F(0.0, "AdamW weight decay."),
        adam_b1=F(0.9, "AdamW beta1."),
        adam_b2=F(0.999, "AdamW beta2."),
        adam_eps=F(1e-8, "AdamW epsilon."),
        grad_clip_norm=F(1.0, "Clip the gradients' global norm to this; <= 0: no "
                         "clipping."),
        encoder_dropout=F(True, "The frozen backbone stays in train mode, dropout on "
                          "(as the paper)."),
        probe_dropout=F(-1.0, "Dropout before a sentence probe's classifier (tagging probes "
                        "have none); -1: the checkpoint's recipe (hidden dropout; 0 for "
                        "RoBERTa)."),
        cache_features=F(False, "Compute encoder outputs once and reuse them every "
                         "epoch (needs encoder_dropout=False)."),
        feature_dtype=F("float32", "Dtype of the encoder outputs fed to the probe (and "
                        "cached): float32 or bfloat16."),
    )),
    effective=G("The split and options of the analysis stages.", dict(
        split=F("validation", "The analysed split: train, validation or test."),
        max_examples=F(-1, "Seeded random subset of the analysed split; -1: all."),
        rtol=F(-1.0, "Rank tolerance of effective attention, relative to "
               "sigma_max; -1: max(n, d) * eps."),
        min_valid_tokens=F(0, "Only examples with more real tokens than this."),
    )),
    finetune=G("The finetune stage.", dict(
        other_model=F("", "The fine-tuned (or other) checkpoint compared with model.name."),
    )),
    ablation=G("The ablation stage.", dict(
        kinds=F(ABLATIONS, "Head replacements, each a map of score changes: uniform (over the "
                "real tokens), constant (the head's dataset mean), effective (its effective "
                "attention)."),
    )),
    knockout=G("The knockout stage: attention edges blocked per layer window and key class "
               "(papa_jax/analysis/knockout.py).", dict(
        window=F(1, "Layers per window (consecutive; every window from the first layer)."),
        rule=F("renormalize", "renormalize (a row that lost keys is renormalised over the "
               "rest, as -inf scores before the softmax) or zero (blocked probabilities set "
               "to 0)."),
        classes=F(KNOCKOUT_CLASSES, "Key positions whose edges are blocked, each a column: "
                  "cls, sep, punctuation, other (every other real token), previous, next."),
    )),
    patching=G("The patching stage: activation and attribution patching of (clean, corrupt) "
               "pairs, scored by the ablation stage's probe "
               "(papa_jax/analysis/patching_stage.py).", dict(
        pairs=F("", "A pair file (csv, tsv or jsonl with fields clean and corrupt); empty: "
                "pairs built from the analysis split by sentiment-word substitution."),
        sites=F(("context", "residual_in"), "Sites patched: context (per layer and head) and "
                "residual_in, residual_out, attention_output, mlp_output (per layer and "
                "position)."),
        max_pairs=F(64, "At most this many pairs (the file's first, or the split's first "
                    "sentences with a substitution word)."),
        chunk=F(16, "Targets per patched forward call (rows: targets x pairs; memory)."),
    )),
    mixing=G("The mixing stage: context mixing beyond attention "
             "(papa_jax/measures/mixing.py).", dict(
        methods=F(MIXING_METHODS, "Measures: norms (Kobayashi 2020/2021), alti, globenc, "
                  "value_zeroing; attention rollout always."),
        alti_chunk=F(16, "Query rows per ALTI chunk (memory: batch x chunk x L x D floats)."),
        vz_chunk=F(8, "Zeroed tokens per value-zeroing chunk (batch x L x chunk x FFN "
                   "floats)."),
        reference_quirks=F(False, "ALTI as mt-upc's code computes it (LN scale, L1 shift)."),
        allow_low_precision=F(False, "Run on a bfloat16 model (identities hold to about "
                              "1e-2)."),
    )),
    figures=G("What the effective stage's example figure shows.", dict(
        example_index=F(0, "Which long example of the analysis split."),
        layer=F(-1, "Layer shown; -1: the head with the largest null part."),
        head=F(-1, "Head shown; -1: the head with the largest null part."),
    )),
    explore=G("The explorer page (stage=explore; docs/explorer.md).", dict(
        examples=F((0, 1, 2), "Dev indices (whole validation split, file order) shown first."),
        max_examples=F(8, "Stored in all, padded with the next dev examples; <= 0: just "
                       "examples."),
        output=F("explorer.html", "The page's file, under the workdir."),
        mixing=F(("attention_rollout", "attnresln", "globenc", "alti", "alti_rollout",
                  "value_zeroing"),
                 "Context-mixing maps per shown example and layer (a subset of "
                 f"{', '.join(EXPLORE_MIXING)}); () = none. value_zeroing costs every layer's "
                 "FFN once per token; needs a float32 model, else skipped with a warning."),
        figures=F((), "Also write the page's panels as figure files (a subset of svg, png; "
                  "matplotlib) beside the page, in explorer_figures/ for explorer.html; () = "
                  "none. The page exports any panel itself from its SVG/PNG buttons."),
    )),
    report=G("The report's intervals (stage=report, suite).", dict(
        n_boot=F(10_000, "Bootstrap resamples (over dev examples and probe seeds); >= 100."),
        seed=F(0, "Seed of the bootstrap resamples."),
        level=F(0.95, "Interval coverage, in (0.5, 1)."),
        seed_pairing=F("paired", "How probe seeds are resampled across conditions: 'paired' "
                       "(the same seed draws for every condition run with the same seeds: a "
                       "seed fixes the probe's initialisation, data order and dropout in each) "
                       "or 'independent' (a draw per condition; wider)."),
    )),
    run=G("How and where to compute.", dict(
        log_every_steps=F(100, "Log the training loss every this many steps."),
        batch_size=F(32, "Global batch of every forward-only pass (means, features, eval, "
                     "analyses)."),
        checkpoint_every_batches=F(200, "Partial sums of the means and analysis passes saved "
                                   "for resuming every this many batches; 0: never."),
        checkpoint_every_steps=F(0, "Probe checkpoints within an epoch; 0: at epoch ends "
                                 "only."),
        num_devices=F(-1, "Devices of the data mesh; -1: every device."),
        cache_dir=F("", "'' keeps cached probe features in memory up to "
                    "run.cache_memory_gb (over it, in a temporary local folder); else a local "
                    "folder for .npy files, each static-head set's removed once its probes "
                    "are trained (kept while they train, for a resumed run). Probes train "
                    "from files by reading each batch's rows (one-device runs: host memory "
                    "holds batches, not the split)."),
        cache_memory_gb=F(2.0, "With run.cache_dir='', one static-head set's cached "
                          "features (train and eval) over this many GiB go to files in a "
                          "temporary local folder, not memory (host memory stays bounded)."),
        cache_max_gb=F(8.0, "The feature cache's budget in GB, checked before any stage "
                       "runs."),
        device_memory_gb=F(0.0, "Memory of one device in GiB that each stage's planned "
                           "memory (papa_jax/memory_plan.py) is checked against before any "
                           "work; 0: the device's own reported limit (none on CPU: no "
                           "check); -1: no check."),
        lease_stale_seconds=F(120.0, "A gs:// workdir's lease without a heartbeat for this "
                              "many seconds, unchanged while watched for half of it, is "
                              "taken over (papa_jax/workdir/lease.py)."),
        distributed=G("Multi-host runs (papa_jax/parallel.py).", dict(
            enabled=F(False, "Call jax.distributed.initialize() (multi-host, TPU pod runs)."),
            coordinator_address=F("", "HOST:PORT of process 0; '' lets JAX find it (TPU, "
                                  "SLURM)."),
            num_processes=F(-1, "Number of processes; -1: found by JAX."),
            process_id=F(-1, "This process's index; -1: found by JAX."),
            local_device_count=F(-1, "Use the first N local devices; -1: all."),
            cpu_collectives=F("", "gloo for CPU multi-process runs; '' for accelerators."),
            preemption_check_every=F(10, "Every process all-gathers its SIGTERM flag at every "
                                     "N-th check of the loops, so all stop at the same step "
                                     "(papa_jax/preemption.py)."),
        )),
    )),
)
