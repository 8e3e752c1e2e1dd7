"""The checkpoint's own (fast) tokenizer, loaded from its model directory."""

from __future__ import annotations

import os

from papa_jax.models.config import EncoderConfig


def load_tokenizer(model_dir: str, config: EncoderConfig | None = None, **kwargs):
  """A Hugging Face fast tokenizer from `model_dir` (no network).

  Byte-level BPE tokenizers (RoBERTa, DeBERTa v1: `config.add_prefix_space`)
  get `add_prefix_space=True`, which pre-split (token-tagging) input needs.
  """
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel

  if config is not None and config.add_prefix_space:
    kwargs.setdefault("add_prefix_space", True)
  try:
    tok = AutoTokenizer.from_pretrained(model_dir, use_fast=True, local_files_only=True, **kwargs)
  except (OSError, ValueError) as e:
    raise FileNotFoundError(
        f"No usable tokenizer files in {model_dir!r} ({e}); the model "
        "directory needs tokenizer.json or vocab files next to config.json."
    ) from e
  if not getattr(tok, "is_fast", False):
    raise ValueError(f"The tokenizer in {model_dir!r} is not a fast tokenizer; "
                     "word alignment for token tasks needs one.")
  return tok
