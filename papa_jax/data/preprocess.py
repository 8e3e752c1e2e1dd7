"""Tokenization to fixed-length arrays, with PAPA's positional layout.

PAPA layout (`shared/spec/papa.md` §3): after tokenizing to `L` tokens, [CLS]
and the first segment go to the first half (at most L//2 - 1 word pieces), the
first separator sits at L//2 followed by the second segment, and the final
separator sits at L - 1. Token tagging keeps the tokens in place and moves the
separator to L - 1. Position i then plays the same structural role in every
example, which is what makes per-position average attention meaningful.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from papa_jax.data.errors import DataError
from papa_jax.data.tasks import Task
from papa_jax.errors import ConfigError

IGNORE = -100  # Label of positions that are not scored (HF convention).


@dataclasses.dataclass
class Encoded:
  """A split as fixed-shape arrays.

  Attributes:
    input_ids, attention_mask, token_type_ids: `[N, L]` int32.
    labels: `[N]` (int32 classes or float32 scores) or `[N, L]` int32 tags
      with `IGNORE` where a position is not scored.
    truncated: examples that lost word pieces to `max_length` or the layout.
    unpieced: tagging words (sentence tasks: texts) the tokenizer gave no word piece (a
      soft hyphen, a zero-width space): their tags are not scored (the example is only
      special tokens); up to five shown in `unpieced_words`.
  """

  input_ids: np.ndarray
  attention_mask: np.ndarray
  token_type_ids: np.ndarray
  labels: np.ndarray
  truncated: int = 0
  unpieced: int = 0
  unpieced_words: tuple[str, ...] = ()

  def __len__(self) -> int:
    return len(self.input_ids)

  @property
  def max_length(self) -> int:
    return self.input_ids.shape[1]

  def arrays(self) -> dict[str, np.ndarray]:
    return dict(input_ids=self.input_ids, attention_mask=self.attention_mask,
                token_type_ids=self.token_type_ids, labels=self.labels)

  def take(self, idx: np.ndarray) -> Encoded:
    return Encoded(**{k: v[idx] for k, v in self.arrays().items()},
                   truncated=self.truncated, unpieced=self.unpieced,
                   unpieced_words=self.unpieced_words)


def papa_sentence_layout(ids: Sequence[int], types: Sequence[int], sep_id: int,
                         pad_id: int, max_length: int, faithful_segment_ids: bool):
  """Re-lays one tokenized (truncated, unpadded) example; see module doc.

  Returns:
    (ids, mask, token_type_ids, dropped): arrays of length `max_length` and
    whether word pieces were dropped by the layout.
  """
  L, half = max_length, max_length // 2
  ids = list(ids)
  seps = [i for i, t in enumerate(ids) if t == sep_id]
  if not seps:
    raise DataError("tokenized example has no separator token; PAPA layout needs one.")
  fs, ls = seps[0], seps[-1]
  new_ids = np.full(L, pad_id, np.int32)
  mask = np.zeros(L, np.int32)
  n1 = min(fs, half)
  new_ids[:n1], mask[:n1] = ids[:n1], 1
  seg2 = ids[fs:ls]
  n2 = min(len(seg2), L - 1 - half)
  new_ids[half:half + n2], mask[half:half + n2] = seg2[:n2], 1
  new_ids[L - 1], mask[L - 1] = ids[ls], 1
  dropped = fs > n1 or len(seg2) > n2
  if faithful_segment_ids:  # The original code keeps the old per-position ids.
    tt = np.zeros(L, np.int32)
    tt[:len(types)] = types
  else:  # 0 for [CLS], segment 1 and the separator at L//2; 1 after it.
    tt = np.zeros(L, np.int32)
    if fs != ls:
      tt[half + 1:] = 1
  return new_ids, mask, tt, dropped


def encode_sentences(task: Task, records: list[dict], tokenizer, max_length: int, *,
                     papa_layout: bool, faithful_segment_ids: bool,
                     type_vocab_size: int) -> Encoded:
  a = [r["text_a"] for r in records]
  b = [r["text_b"] for r in records] if task.is_pair else None
  enc = tokenizer(a, b, truncation=True, max_length=max_length,
                  return_token_type_ids=True, return_attention_mask=False)
  full = tokenizer(a, b, truncation=False, return_token_type_ids=False,
                   return_attention_mask=False)
  truncated = np.array([len(f) > max_length for f in full["input_ids"]])
  n, L = len(records), max_length
  ids = np.full((n, L), tokenizer.pad_token_id, np.int32)
  mask = np.zeros((n, L), np.int32)
  types = np.zeros((n, L), np.int32)
  for i, (x, t) in enumerate(zip(enc["input_ids"], enc["token_type_ids"])):
    if papa_layout:
      ids[i], mask[i], types[i], dropped = papa_sentence_layout(
          x, t, tokenizer.sep_token_id, tokenizer.pad_token_id, L, faithful_segment_ids)
      truncated[i] |= dropped
    else:
      ids[i, :len(x)], mask[i, :len(x)], types[i, :len(x)] = x, 1, t
  if type_vocab_size <= 1:
    types[:] = 0
  dtype = np.float32 if task.kind == "regression" else np.int32
  labels = np.array([r["label"] for r in records], dtype)
  # A text without a word piece has no position of its sequence id in the full encoding.
  present = [set(full.sequence_ids(i)) for i in range(n)]
  empty = [t[i] for s, t in enumerate((a, b) if b else (a,)) for i in range(n)
           if s not in present[i]]
  return Encoded(ids, mask, types, labels, truncated=int(truncated.sum()),
                 unpieced=len(empty), unpieced_words=tuple(empty[:5]))


def encode_tags(task: Task, records: list[dict], tokenizer, max_length: int, *,
                papa_layout: bool) -> Encoded:
  for r in records:
    if len(r["tokens"]) != len(r["tags"]):
      raise DataError(f"{task.name} example {r['idx']}: {len(r['tokens'])} tokens "
                      f"but {len(r['tags'])} tags.")
  words = [r["tokens"] for r in records]
  enc = tokenizer(words, is_split_into_words=True, truncation=True,
                  max_length=max_length, padding="max_length",
                  return_token_type_ids=True)
  n, L = len(records), max_length
  ids = np.asarray(enc["input_ids"], np.int32)
  mask = np.asarray(enc["attention_mask"], np.int32)
  types = np.zeros((n, L), np.int32)
  labels = np.full((n, L), IGNORE, np.int32)
  truncated, unpieced = 0, []
  for i, r in enumerate(records):
    seen = set()
    for pos, w in enumerate(enc.word_ids(i)):
      if w is not None and w not in seen:
        seen.add(w)
        labels[i, pos] = r["tags"][w]
    # Words after the last one placed were cut off if the sequence is full; any other
    # missing word had no word piece at all.
    full = mask[i].sum() == L
    last = max(seen, default=-1)
    missing = [w for w in range(len(r["tokens"])) if w not in seen and (w < last or not full)]
    unpieced += [r["tokens"][w] for w in missing]
    truncated += full and last < len(r["tokens"]) - 1
    if papa_layout:
      sep = np.flatnonzero(ids[i] == tokenizer.sep_token_id)
      if not len(sep):
        raise DataError("tokenized example has no separator token; PAPA layout needs one.")
      ids[i, sep[0]], mask[i, sep[0]] = tokenizer.pad_token_id, 0
      ids[i, L - 1], mask[i, L - 1], labels[i, L - 1] = tokenizer.sep_token_id, 1, IGNORE
  return Encoded(ids, mask, types, labels, truncated=int(truncated), unpieced=len(unpieced),
                 unpieced_words=tuple(unpieced[:5]))


def encode(task: Task, records: list[dict], tokenizer, max_length: int, *,
           papa_layout: bool = True, faithful_segment_ids: bool = True,
           type_vocab_size: int = 2) -> Encoded:
  """Tokenizes records to `max_length` arrays (see module doc for the layout)."""
  if max_length < 4:
    raise ConfigError(f"max_length={max_length} is too short (need >= 4).")
  if not records:
    raise DataError(f"No {task.name} examples to encode.")
  if task.kind == "tagging":
    return encode_tags(task, records, tokenizer, max_length, papa_layout=papa_layout)
  return encode_sentences(task, records, tokenizer, max_length, papa_layout=papa_layout,
                          faithful_segment_ids=faithful_segment_ids,
                          type_vocab_size=type_vocab_size)
