"""The checkpoint's own (fast) tokenizer, and checks that it fits the model.

A model directory without tokenizer files can still yield a tokenizer (a
near-empty vocabulary that maps every word to [UNK]), and a tokenizer from
another checkpoint can address rows the embedding table does not have: both
give a silent wrong number, so `check_tokenizer` refuses them before any work.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from typing import Sequence

from papa_jax.errors import PapaError
from papa_jax.models.config import EncoderConfig

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "spm.model",
                   "sentencepiece.bpe.model", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json")
VOCAB_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spm.model",
               "sentencepiece.bpe.model")
MAX_UNKNOWN = 0.2  # Refuse when more word pieces than this are [UNK] in the data.


class TokenizerError(PapaError, ValueError):
  """A tokenizer that does not fit the model it is used with."""


def _bad_json(model_dir: str) -> str:
  """'; in FILE' for the first of the directory's JSON files that does not parse."""
  for name in sorted(os.listdir(model_dir)):
    if name.endswith(".json"):
      try:
        with open(os.path.join(model_dir, name), encoding="utf-8") as f:
          json.load(f)
      except (ValueError, UnicodeDecodeError) as e:
        return f"; in {name}: {e}"
  return ""

def load_tokenizer(model_dir: str, config: EncoderConfig | None = None, **kwargs):
  """A Hugging Face fast tokenizer from `model_dir` (no network).

  Byte-level BPE tokenizers (RoBERTa, DeBERTa v1: `config.add_prefix_space`)
  get `add_prefix_space=True`, which pre-split (token-tagging) input needs.
  """
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel

  if not any(os.path.isfile(os.path.join(model_dir, f)) for f in VOCAB_FILES):
    present = sorted(os.listdir(model_dir)) if os.path.isdir(model_dir) else []
    raise TokenizerError(
        f"{model_dir!r} has no tokenizer vocabulary (none of {list(VOCAB_FILES)}; it holds "
        f"{present}). Copy the checkpoint's tokenizer files next to config.json (or the "
        ".onnx file), or pass load_pretrained(..., tokenizer_dir=...).")
  if config is not None and config.add_prefix_space:
    kwargs.setdefault("add_prefix_space", True)
  try:
    tok = AutoTokenizer.from_pretrained(model_dir, use_fast=True, local_files_only=True, **kwargs)
  except (OSError, ValueError) as e:
    raise TokenizerError(
        f"No usable tokenizer files in {model_dir!r} ({e}{_bad_json(model_dir)}); the model "
        "directory needs tokenizer.json or vocab files next to config.json.") from e
  if not getattr(tok, "is_fast", False):
    raise TokenizerError(f"The tokenizer in {model_dir!r} is not a fast tokenizer; "
                         "word alignment for token tasks needs one.")
  if config is not None:
    check_tokenizer(tok, config, where=model_dir)
  return tok


def check_tokenizer(tok, config: EncoderConfig, where: str = "") -> None:
  """The vocabulary must fit the embedding table and the model's special ids."""
  size = len(tok)
  if size > config.vocab_size:
    raise TokenizerError(
        f"The tokenizer in {where!r} has {size} tokens but the model's embedding table "
        f"has {config.vocab_size} rows: ids past the table would index nothing. The "
        "tokenizer belongs to another checkpoint.")
  if size < config.vocab_size // 2:
    raise TokenizerError(
        f"The tokenizer in {where!r} knows {size} tokens, the model's embedding table "
        f"{config.vocab_size}: its vocabulary is missing or belongs to another checkpoint.")
  for name in ("cls_token_id", "sep_token_id", "pad_token_id", "unk_token_id", "mask_token_id"):
    value = getattr(tok, name, None)
    if value is not None and not 0 <= value < config.vocab_size:
      raise TokenizerError(f"The tokenizer's {name}={value} is outside the model's "
                           f"{config.vocab_size} embeddings.")
  if tok.sep_token_id is None or tok.cls_token_id is None:
    raise TokenizerError(f"The tokenizer in {where!r} has no [CLS]/[SEP]-style special "
                         "tokens; PAPA's layout and probes need both.")
  if config.position_ids == "from_padding" and tok.pad_token_id != config.pad_token_id:
    raise TokenizerError(
        f"The tokenizer pads with id {tok.pad_token_id} but the model's positions count "
        f"from pad_token_id={config.pad_token_id}: positions would be shifted.")


def check_unknown_rate(tok, input_ids, attention_mask, what: str) -> float:
  """Refuses data whose real word pieces are mostly [UNK] (wrong tokenizer or language)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  unk = tok.unk_token_id
  if unk is None:
    return 0.0
  real = np.asarray(attention_mask) > 0
  special = np.isin(np.asarray(input_ids), [i for i in (tok.cls_token_id, tok.sep_token_id)
                                            if i is not None])
  words = real & ~special
  rate = float((np.asarray(input_ids)[words] == unk).mean()) if words.any() else 0.0
  if rate > MAX_UNKNOWN:
    raise TokenizerError(
        f"{100 * rate:.0f}% of the word pieces of {what} are the unknown token "
        f"{tok.unk_token!r}: the tokenizer does not fit this data (another model's or "
        "language's vocabulary?).")
  return rate


PROBE_TEXTS = ("The quick brown fox jumps over the lazy dog.",
               "Ünïcödé ÀÉÎ naïve café, 2.5%!",
               "un-believable isn't it?  Tabs\tand  spaces",
               "数据 données Daten δεδομένα")


def tokenization_difference(tok_a, tok_b) -> str | None:
  """Why two tokenizers would give the same text different ids, or None."""
  if tok_a.get_vocab() != tok_b.get_vocab():
    return "their vocabularies differ"
  for name in ("cls_token_id", "sep_token_id", "pad_token_id", "unk_token_id"):
    if getattr(tok_a, name) != getattr(tok_b, name):
      return f"{name} differs ({getattr(tok_a, name)} vs {getattr(tok_b, name)})"
  for text in PROBE_TEXTS:
    a, b = tok_a(text)["input_ids"], tok_b(text)["input_ids"]
    if a != b:
      return f"they tokenize {text!r} differently ({a} vs {b})"
  return None


def tokenizer_fingerprint(model_dir: str) -> str:
  """Hash of the tokenizer files: a different vocabulary gives different inputs."""
  h = hashlib.sha256()
  for path in sorted(glob.glob(os.path.join(model_dir, "*"))):
    if os.path.basename(path) in TOKENIZER_FILES and os.path.isfile(path):
      h.update(os.path.basename(path).encode())
      with open(path, "rb") as f:
        h.update(f.read())
  return h.hexdigest()[:16]


__all__: Sequence[str] = ("TokenizerError", "load_tokenizer", "check_tokenizer",
                          "check_unknown_rate", "tokenizer_fingerprint")
