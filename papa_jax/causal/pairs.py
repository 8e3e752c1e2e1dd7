"""(clean, corrupt[, target]) pairs for patching, from a CSV, TSV or JSON Lines file.

The file is read by the data formats' own readers (`data/tables.py`: quoting, headers, bad
rows named by line), with the fields named `clean`, `corrupt` and optionally `target` (other
names by argument). `encode_pairs` tokenizes both sides to one length and refuses a pair that
the length limit would cut or, where positions are patched, whose two sides differ in length,
naming the file's line.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from papa_jax.data import tables
from papa_jax.data.errors import DataError

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl"}


@dataclasses.dataclass(frozen=True)
class Pair:
  """One row: its first line in the file, the two texts and the optional target."""

  line: int
  clean: str
  corrupt: str
  target: str | None


def read_pairs(path: str, fmt: str = "", *, clean: str = "clean", corrupt: str = "corrupt",
               target: str = "", header: bool = True, quoting: str = "") -> list[Pair]:
  """The pairs of `path` (`fmt`: csv, tsv or jsonl; default from the extension). Fields are
  header names (column numbers as strings without a header). Raises `DataError` naming the
  first malformed row and how many there are."""
  fmt = fmt or FORMATS.get(os.path.splitext(path)[1].lower(), "")
  if fmt not in FORMATS.values():
    raise DataError(f"{path}: pair files are {sorted(FORMATS)} (csv, tsv, jsonl); give the "
                    f"format for another extension.")
  label = target or corrupt  # The readers need a label field; without a target, unused.
  if fmt == "jsonl":
    rows = tables.read_jsonl(path, text_fields=(clean, corrupt), label_field=label)
  else:
    rows = tables.read_table(path, fmt, header=header, quoting=quoting,
                             text_fields=(clean, corrupt), label_field=label)
  rows = list(rows)
  bad = [r for r in rows if isinstance(r, DataError)]
  if bad:
    raise DataError(f"{bad[0]} ({len(bad)} malformed row{'s' * (len(bad) > 1)} in {path}).")
  if not rows:
    raise DataError(f"{path} holds no pairs.")
  return [Pair(r.line, r.texts[0], r.texts[1], r.label if target else None) for r in rows]


def encode_pairs(pairs: list[Pair], tokenizer, max_length: int, *, path: str = "",
                 equal_lengths: bool = True, pad_to: int = 0) -> tuple[dict, dict]:
  """(clean, corrupt) batches `input_ids`, `attention_mask` (and `token_type_ids`) `[N, L]`,
  padded to the longest pair (or to `pad_to`, e.g. a probe's input length). Raises naming the
  line of a side longer than `max_length` or, with `equal_lengths` (positions patched), of a
  pair whose sides differ in word pieces."""
  where = lambda p: f"{path or 'pairs'}:{p.line}"
  enc = [tokenizer([getattr(p, side) for p in pairs], add_special_tokens=True)["input_ids"]
         for side in ("clean", "corrupt")]
  for p, a, b in zip(pairs, *enc):
    for side, ids in (("clean", a), ("corrupt", b)):
      if len(ids) > max_length:
        raise DataError(f"{where(p)}: the {side} text has {len(ids)} word pieces, more than "
                        f"max_length {max_length}; cutting it would change the pair.")
    if equal_lengths and len(a) != len(b):
      raise DataError(f"{where(p)}: the clean text has {len(a)} word pieces and the corrupt "
                      f"{len(b)}; patching positions needs equal lengths (or "
                      "equal_lengths=False for whole-run sites).")
  length = max(pad_to, max(len(ids) for side in enc for ids in side))
  pad = tokenizer.pad_token_id or 0
  out = []
  for side in enc:
    ids = np.full((len(side), length), pad, np.int32)
    mask = np.zeros((len(side), length), np.int32)
    for i, row in enumerate(side):
      ids[i, :len(row)], mask[i, :len(row)] = row, 1
    out.append(dict(input_ids=ids, attention_mask=mask, token_type_ids=np.zeros_like(ids)))
  return out[0], out[1]


def token_ids(tokenizer, words: list[str], lines: list[int], path: str = "") -> np.ndarray:
  """Each word's single vocabulary id (a target for an MLM metric); raises naming the line of
  a word that is not one word piece."""
  out = []
  for word, line in zip(words, lines):
    ids = tokenizer(word, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
      raise DataError(f"{path or 'pairs'}:{line}: target {word!r} is {len(ids)} word pieces "
                      f"{tokenizer.convert_ids_to_tokens(ids)}; a target is one.")
    out.append(ids[0])
  return np.asarray(out, np.int32)
