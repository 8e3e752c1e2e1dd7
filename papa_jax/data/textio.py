"""Text of data files: UTF-8 with or without a byte-order mark, any line end.

Every format reads its file through `read_text`, so a BOM never reaches a
header or a first token, and an undecodable byte or a NUL (UTF-16 read as
UTF-8, binary data) is reported with the file, line and absolute byte
offset. Lines end at LF, CRLF or a lone CR (Python's universal newlines, which
is also what the `csv` module splits on).
"""

from __future__ import annotations

import codecs
import io
from typing import Iterator

from papa_jax.data.errors import DataError


def _line_of(data: bytes, offset: int) -> int:
  """1-based line of byte `offset`, counting LF, CRLF and lone CR as line ends."""
  head = data[:offset]
  return head.count(b"\n") + head.count(b"\r") - head.count(b"\r\n") + 1


def _reject_nul(data: bytes, path: str) -> None:
  """DataError at the first NUL byte: no text format here holds one, and a file of
  UTF-16 or binary data would otherwise read as text with NULs inside its fields."""
  at = data.find(b"\x00")
  if at < 0:
    return
  hint = " Data files must be UTF-8 text."
  if data[:4096].count(b"\x00") * 3 >= len(data[:4096]):  # Every other byte, or more.
    hint = " The file looks like UTF-16 (without a byte-order mark): save it as UTF-8."
  raise DataError(f"{path}:{_line_of(data, at)}: byte offset {at}: a NUL byte (in "
                  f"{data[max(at - 20, 0):at + 20]!r}).{hint}")


def decode(data: bytes, path: str) -> str:
  """`data` as text, without a leading UTF-8 BOM; DataError at the first bad byte
  (not UTF-8, or NUL)."""
  skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
  try:
    text = data[skip:].decode("utf-8")
  except UnicodeDecodeError as e:
    start, end = e.start + skip, e.end + skip
    hint = ""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
      hint = " The file starts with a UTF-16 byte-order mark: save it as UTF-8."
    raise DataError(
        f"{path}:{_line_of(data, start)}: byte offset {start}: {data[start:end]!r} is not "
        f"valid UTF-8 (in {data[max(start - 20, 0):end + 20]!r}). Data files must be UTF-8 "
        f"(this one may be Latin-1 or Windows-1252).{hint}") from None
  _reject_nul(data, path)
  return text


def read_text(path: str) -> str:
  with open(path, "rb") as f:
    return decode(f.read(), path)


def lines(text: str) -> Iterator[tuple[int, str]]:
  """(1-based line number, line without its line end) of every line."""
  for number, line in enumerate(io.StringIO(text, newline=""), start=1):
    yield number, line.rstrip("\r\n")
