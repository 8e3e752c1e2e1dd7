"""The one base config every experiment config derives from.

Defaults are the PAPA paper's recipe (`shared/spec/papa.md` §7.3): probes on
the frozen encoder with AdamW at a constant 2e-5, 15 epochs, batch 16, global
gradient-norm clipping at 1.0, the encoder's dropout kept on during training,
the PAPA positional layout, and the constant matrices averaged over the whole
training split.
"""

from __future__ import annotations

import ml_collections

# Single-sentence tasks fit in 64 tokens (as the paper's CoLA command);
# pair and tagging tasks get 128, since the layout halves each segment's room.
MAX_LENGTH = {"cola": 64, "sst2": 64}
MODELS = {
    "bert": "bert-base-uncased", "bert_large": "bert-large-uncased",
    "roberta": "roberta-base", "roberta_large": "roberta-large",
    "deberta": "microsoft/deberta-base", "deberta_large": "microsoft/deberta-large",
}


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.stage = "all"  # means | sort | probe | all | effective
  c.overwrite = False  # Replace results of a different config in the workdir.
  c.log_every_steps = 100

  c.model = ml_collections.ConfigDict(dict(
      name="bert-base-uncased",  # Hub id, packaged model id, or local directory.
  ))
  c.data = ml_collections.ConfigDict(dict(
      task="sst2",
      source="local",  # local (official files via the project's TFDS builder) | tfds (catalog)
      data_dir="",  # Local files; '' means $PAPA_SHARED/data/<task folder>.
      tfds_dir="",  # Prepared TFDS data; '' means $PAPA_CACHE/tfds (~/.cache/papa_jax).
      max_length=64,
      papa_layout=True,  # Fixed positional layout (spec §3).
      faithful_segment_ids=True,  # Keep the original code's segment ids (spec §10.3).
      max_train_examples=-1,  # Seeded random subset of the train split; -1: all.
      max_eval_examples=-1,
      subsample_seed=0,
      skip_malformed=False,  # Skip (and count) malformed rows instead of failing.
  ))
  c.mesh = ml_collections.ConfigDict(dict(num_devices=-1))  # -1: every device.
  c.distributed = ml_collections.ConfigDict(dict(
      enabled=False,  # jax.distributed.initialize() for multi-host (TPU pod) runs.
      coordinator_address="", num_processes=-1, process_id=-1, local_device_count=-1,
      cpu_collectives="",  # 'gloo' for CPU multi-process runs.
  ))
  c.means = ml_collections.ConfigDict(dict(
      batch_size=32,  # Does not change the result.
      checkpoint_every_batches=200,  # Partial sums saved for resuming; 0: never.
  ))
  c.papa = ml_collections.ConfigDict(dict(
      fractions=(0.0, 0.5, 0.875, 0.9375, 1.0),  # Of all heads, taken in sorted order.
      variants="raw",  # Constant = mean of 'raw' attention; add ',effective' for PAPA-eff.
  ))
  c.sort = ml_collections.ConfigDict(dict(
      epochs=15,  # The paper's sorting run uses the probing recipe.
      gate_learning_rate=2e-5,
      max_train_examples=-1,  # Sort on a seeded subset of the train data; -1: all of it.
  ))
  c.probe = ml_collections.ConfigDict(dict(
      learning_rate=2e-5, epochs=15, batch_size=16, eval_batch_size=32,
      weight_decay=0.0, adam_b1=0.9, adam_b2=0.999, adam_eps=1e-8, grad_clip_norm=1.0,
      seed=42,
      encoder_dropout=True,  # The frozen backbone stays in train mode (as the paper).
      probe_dropout=-1.0,  # -1: the model's hidden dropout (0 for RoBERTa, as the paper).
      cache_features=False,  # Compute encoder outputs once (needs encoder_dropout=False).
      cache_dir="",  # '' keeps the cache in memory; else a folder for memmapped .npy files.
      cache_max_gb=8.0,
      feature_dtype="float32",  # Dtype of encoder outputs fed to the probe (cache dtype).
  ))
  c.effective = ml_collections.ConfigDict(dict(
      split="validation",
      max_examples=-1,
      batch_size=16,
      rtol=-1.0,  # Rank tolerance relative to sigma_max; -1: max(n, d) * eps.
      example_index=0,  # Which long example the attention-map figure shows.
      figure_layer=-1,  # Layer and head of that figure; -1: the largest null part.
      figure_head=-1,
      min_valid_tokens=0,  # Only examples with more real tokens than this.
  ))
  c.explore = ml_collections.ConfigDict(dict(
      examples=(0, 1, 2),  # Dev indices (whole validation split, file order) shown first.
      max_examples=8,  # Stored in all, padded with the next dev examples; <= 0: just `examples`.
      output="explorer.html",  # Under the workdir.
  ))
  return c


def papa_config(model: str, task: str) -> ml_collections.ConfigDict:
  """The paper's run of `model` (a key of MODELS) on `task`."""
  c = get_config()
  c.model.name = MODELS[model]
  c.data.task = task
  c.data.max_length = MAX_LENGTH.get(task, 128)
  return c


def effective_config(model_name: str, task: str) -> ml_collections.ConfigDict:
  """Raw vs effective attention (Sun & Marasovic) of `model_name` on `task`'s dev split.

  Standard layout up to 128 tokens, so that sentences longer than the head
  dimension keep all their tokens (the reference setting).
  """
  c = get_config()
  c.stage = "effective"
  c.model.name = model_name
  c.data.task = task
  c.data.max_length = 128
  c.data.papa_layout = False
  c.effective.split = "validation"
  return c
