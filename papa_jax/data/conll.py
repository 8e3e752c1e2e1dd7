"""Token-tagging formats: CoNLL column files and CoNLL-U.

Each reader yields a `TagSentence` per sentence, or one `DataError` for a
malformed sentence (the caller raises it or, with `skip_malformed`, drops the
sentence and counts it). Sentences end at blank lines or the end of the file.

CoNLL column files (CoNLL-2000/2003): one token per line, columns separated by
spaces and/or tabs (or by tabs only), `-DOCSTART-` lines skipped; every token
line has as many columns as the file's first token line.

CoNLL-U (universaldependencies.org/format.html): ten tab-separated fields
(FORM may contain spaces); `#` comment lines; multiword-token ranges (`1-2`)
and empty nodes (`8.1`) are skipped; word IDs must run 1..n in a sentence.

In both, tags are stripped of surrounding spaces (as every label is), so
`B-ORG ` is the tag `B-ORG`, and a token or FORM of spaces only is an error.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterator

from papa_jax.data import textio
from papa_jax.data.errors import DataError

CONLLU_FIELDS = ("ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS", "MISC")
CONLLU_TAG_FIELDS = {"upos": 3, "xpos": 4}
SEPARATORS = ("whitespace", "tab")
_WORD_ID = re.compile(r"[1-9][0-9]*")
_RANGE_ID = re.compile(r"[1-9][0-9]*-[1-9][0-9]*")
_EMPTY_ID = re.compile(r"[0-9]+\.[1-9][0-9]*")


@dataclasses.dataclass(frozen=True)
class TagSentence:
  """One sentence: its first token line, tokens, raw tags and each tag's line."""

  line: int
  tokens: tuple[str, ...]
  tags: tuple[str, ...]
  tag_lines: tuple[int, ...]


class _Sentences:
  """Collects token lines into sentences; a malformed one becomes one DataError."""

  def __init__(self):
    self._reset()

  def _reset(self) -> None:
    self.tokens, self.tags, self.lines, self.error = [], [], [], None

  def add(self, line: int, token: str, tag: str) -> None:
    self.tokens.append(token)
    self.tags.append(tag)
    self.lines.append(line)

  def fail(self, error: DataError) -> None:
    self.error = self.error or error

  def close(self) -> TagSentence | DataError | None:
    out = self.error
    if out is None and self.tokens:
      out = TagSentence(self.lines[0], tuple(self.tokens), tuple(self.tags), tuple(self.lines))
    self._reset()
    return out


def _split(line: str, separator: str) -> list[str]:
  # Only ASCII spaces and tabs separate columns: str.split() would also split
  # tokens at no-break and other Unicode spaces.
  if separator == "tab":
    return line.split("\t")
  return [f for f in line.replace("\t", " ").split(" ") if f]


def read_conll(path: str, *, token_column: int, tag_column: int,
               separator: str = "whitespace") -> Iterator[TagSentence | DataError]:
  """Sentences of a CoNLL column file; negative columns count from the last."""
  sent = _Sentences()
  width, first = 0, 0  # Columns of the first token line, and its line number.
  for number, line in textio.lines(textio.read_text(path)):
    fields = _split(line, separator) if line.strip(" \t") else []
    if not fields or fields[0] == "-DOCSTART-":
      if (out := sent.close()) is not None:
        yield out
      continue
    if not width:
      width, first = len(fields), number
      for name, col in (("token_column", token_column), ("tag_column", tag_column)):
        if not -width <= col < width:
          raise DataError(f"{path}:{number}: {name}={col} but the first token line has "
                          f"{width} columns.")
      if token_column % width == tag_column % width:
        raise DataError(f"{path}:{number}: token_column={token_column} and "
                        f"tag_column={tag_column} name the same of its {width} columns.")
    if len(fields) != width:
      sent.fail(DataError(f"{path}:{number}: found {len(fields)} columns; the first token "
                          f"line (line {first}) has {width}."))
    elif not fields[token_column].strip() or not fields[tag_column].strip():
      sent.fail(DataError(f"{path}:{number}: empty token or tag column."))
    else:
      sent.add(number, fields[token_column], fields[tag_column].strip())
  if (out := sent.close()) is not None:
    yield out


def _conllu_word(fields: list[str], expected: int, tag_index: int) -> str | None:
  """Why a word line is malformed, or None."""
  if not _WORD_ID.fullmatch(fields[0]) or int(fields[0]) != expected:
    return f"word ID {fields[0]!r} where {expected} was expected (IDs run 1..n in a sentence)"
  if not fields[1].strip():
    return f"FORM {fields[1]!r} is not a word"
  tag = fields[tag_index].strip()
  if tag in ("", "_"):
    name = CONLLU_FIELDS[tag_index]
    return (f"{name} is {tag!r}: this file has no {name} tag for the word "
            f"{fields[1]!r}" + (" (try tag_field='upos')" if name == "XPOS" else ""))
  return None


def read_conllu(path: str, *, tag_field: str = "upos") -> Iterator[TagSentence | DataError]:
  """Sentences of a CoNLL-U file, tagged with their UPOS or XPOS field."""
  tag_index = CONLLU_TAG_FIELDS[tag_field]
  sent = _Sentences()
  forms = set()
  for number, line in textio.lines(textio.read_text(path)):
    if not line.strip():
      if (out := sent.close()) is not None:
        yield out
      continue
    if line.startswith("#"):
      continue
    where = f"{path}:{number}"
    fields = line.split("\t")
    if len(fields) != len(CONLLU_FIELDS):
      hint = " (fields are separated by tabs)" if len(fields) < len(CONLLU_FIELDS) else ""
      sent.fail(DataError(f"{where}: found {len(fields)} tab-separated fields, CoNLL-U has "
                          f"{len(CONLLU_FIELDS)}{hint}."))
    elif _RANGE_ID.fullmatch(fields[0]) or _EMPTY_ID.fullmatch(fields[0]):
      continue  # Multiword tokens and empty nodes are not words of the sentence.
    elif (why := _conllu_word(fields, len(sent.tokens) + 1, tag_index)) is not None:
      sent.fail(DataError(f"{where}: {why}."))
    else:
      sent.add(number, fields[1], fields[tag_index].strip())
      forms.add(fields[1])
  if (out := sent.close()) is not None:
    yield out
  if forms == {"_"}:
    raise DataError(f"{path}: every FORM is '_': this treebank is distributed without its "
                    "text (see its README for how to add it).")
