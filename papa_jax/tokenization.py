"""The checkpoint's own (fast) tokenizer, and checks that it fits the model.

A model directory without tokenizer files can still yield a tokenizer (a
near-empty vocabulary that maps every word to [UNK]), and a tokenizer from
another checkpoint can address rows the embedding table does not have: both
give a silent wrong number, so `check_tokenizer` refuses them before any work.

The vocabulary may be smaller than the embedding table only by padding: at most
`unused_rows_allowed(rows)` = the larger of 1% of the table and (2^k - 1) rows,
2^k being the table's largest power-of-two factor up to 128 (a table rounded up
to a multiple of 2^k). That accepts every real checkpoint we know (BERT, RoBERTa,
XLM-R, ELECTRA, DistilBERT, MPNet, MiniLM: exact; ModernBERT 50280 tokens in
50368 rows; DeBERTa-v3 128001 in 128100; mDeBERTa-v3 250102 in 251000) and
refuses a truncated or foreign one (a 20000-line vocab.txt for 30522 rows).

`load_tokenizer` also refuses a tokenizer.json whose token -> id map (its model
vocabulary plus its added tokens) disagrees with the vocab.txt or vocab.json in
the same folder: Hugging Face would silently use tokenizer.json. A sentencepiece
model (spm.model, sentencepiece.bpe.model) is not compared: its ids are offset
and its special tokens renamed per family, and reading it needs `sentencepiece`.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Sequence

from papa_jax.errors import PapaError
from papa_jax.models.config import EncoderConfig

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "spm.model",
                   "sentencepiece.bpe.model", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json")
VOCAB_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spm.model",
               "sentencepiece.bpe.model")
MAX_UNKNOWN = 0.2  # Refuse when more word pieces than this are [UNK] in the data.
MAX_UNUSED_PERCENT = 1  # Embedding rows without a token: up to 1% of the table...
MAX_ALIGNMENT = 128  # ...or the rounding up to a multiple of a power of two up to this.


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


def _read_vocab_txt(path: str) -> dict[str, int]:
  """vocab.txt as transformers reads it: line i is id i, a repeated line keeps its last id."""
  with open(path, encoding="utf-8") as f:
    return {token.rstrip("\n"): i for i, token in enumerate(f.readlines())}


def _read_vocab_json(path: str) -> dict[str, int]:
  with open(path, encoding="utf-8") as f:
    vocab = json.load(f)
  return vocab if isinstance(vocab, dict) else {}


def _id(value: int | None) -> str:
  return "absent" if value is None else f"id {value}"


def check_vocab_files_agree(model_dir: str) -> None:
  """Refuses a tokenizer.json whose token -> id map differs from the folder's vocab.txt or
  vocab.json, naming the first disagreeing token (in the file's id order); unreadable
  files are left to the loader's own error."""
  path = os.path.join(model_dir, "tokenizer.json")
  others = [(name, read) for name, read in (("vocab.txt", _read_vocab_txt),
                                            ("vocab.json", _read_vocab_json))
            if os.path.isfile(os.path.join(model_dir, name))]
  if not others or not os.path.isfile(path):
    return
  try:
    with open(path, encoding="utf-8") as f:
      spec = json.load(f)
    vocab = (spec.get("model") or {}).get("vocab")
    if isinstance(vocab, list):  # Unigram: [piece, score] pairs, the index is the id.
      vocab = {piece[0]: i for i, piece in enumerate(vocab)}
    added = {t["content"]: t["id"] for t in spec.get("added_tokens") or ()}
  except (ValueError, OSError, AttributeError, TypeError, KeyError, IndexError):
    return  # Not a tokenizer.json this can read: the loader says what is wrong.
  if not isinstance(vocab, dict):
    return
  in_json = {**vocab, **added}
  for name, read in others:
    try:
      in_file = read(os.path.join(model_dir, name))
    except (ValueError, UnicodeDecodeError, OSError):
      continue
    by_id = {i: t for t, i in in_file.items()}
    # An added token the file lacks is an addition, unless the file gives its id to another.
    extra = {t for t, i in added.items() if t not in in_file and i in by_id}
    # In the file's order (line order of vocab.txt), then tokenizer.json's for the rest.
    differ = sorted((in_json[t] if in_file.get(t) is None else in_file[t], t)
                    for t in in_file.keys() | vocab.keys() | extra
                    if in_json.get(t) != in_file.get(t))
    if differ:
      token = differ[0][1]
      clash = (f" (which {name} gives to {by_id[in_json[token]]!r})"
               if in_file.get(token) is None and in_json.get(token) in by_id else "")
      raise TokenizerError(
          f"tokenizer.json and {name} in {model_dir!r} disagree on {len(differ)} token ids, "
          f"first {token!r}: {_id(in_json.get(token))} in tokenizer.json, "
          f"{_id(in_file.get(token))} in {name}{clash}; Hugging Face would silently use "
          f"tokenizer.json: copy both files from the checkpoint the weights come from (or "
          f"delete the one that does not belong).")


def load_tokenizer(model_dir: str, config: EncoderConfig | None = None, **kwargs):
  """A Hugging Face fast tokenizer from `model_dir` (no network).

  Its tokenizer.json must agree with the folder's vocab.txt / vocab.json
  (`check_vocab_files_agree`). Byte-level BPE tokenizers (RoBERTa, DeBERTa v1:
  `config.add_prefix_space`) get `add_prefix_space=True`, which pre-split
  (token-tagging) input needs.
  """
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel

  if not any(os.path.isfile(os.path.join(model_dir, f)) for f in VOCAB_FILES):
    present = sorted(os.listdir(model_dir)) if os.path.isdir(model_dir) else []
    raise TokenizerError(
        f"{model_dir!r} has no tokenizer vocabulary (none of {list(VOCAB_FILES)}; it holds "
        f"{present}). Copy the checkpoint's tokenizer files next to config.json (or the "
        ".onnx file), or pass load_pretrained(..., tokenizer_dir=...).")
  check_vocab_files_agree(model_dir)
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


def unused_rows_allowed(rows: int) -> int:
  """How many embedding rows may have no token: 1% of the table, or the padding of a
  table rounded up to a multiple of 2^k (its largest power-of-two factor, up to 128)."""
  return max(rows * MAX_UNUSED_PERCENT // 100, min(MAX_ALIGNMENT, rows & -rows) - 1)


def check_tokenizer(tok, config: EncoderConfig, where: str = "") -> None:
  """The vocabulary must fit the embedding table (up to `unused_rows_allowed` rows of
  padding) and the model's special ids."""
  size, rows = len(tok), config.vocab_size
  if size > rows:
    raise TokenizerError(
        f"The tokenizer in {where!r} has {size} tokens but the model's embedding table "
        f"has {rows} rows: ids past the table would index nothing. The "
        "tokenizer belongs to another checkpoint.")
  allowed = unused_rows_allowed(rows)
  if rows - size > allowed:
    files = [f for f in VOCAB_FILES if where and os.path.isfile(os.path.join(where, f))]
    raise TokenizerError(
        f"The tokenizer in {where!r} ({', '.join(files) or 'no vocabulary file'}) knows "
        f"{size} tokens but the model's embedding table has {rows} rows: {rows - size} rows "
        f"have no token, more than the {allowed} that padding may leave (1% of the table, or "
        f"rounding up to a multiple of {min(MAX_ALIGNMENT, rows & -rows)}); the vocabulary "
        "is truncated or belongs to another checkpoint: use the checkpoint's own tokenizer "
        "files (or load_pretrained(..., tokenizer_dir=...)).")
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


__all__: Sequence[str] = ("TokenizerError", "check_tokenizer", "check_unknown_rate",
                          "check_vocab_files_agree", "load_tokenizer", "tokenizer_fingerprint",
                          "unused_rows_allowed")
