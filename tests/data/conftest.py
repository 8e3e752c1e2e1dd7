"""Helpers for the data tests: small files and data configs."""

from __future__ import annotations

import pathlib

from configs import base


def write(directory: pathlib.Path, name: str, content: str | bytes) -> pathlib.Path:
  """Writes `content` byte for byte (str as UTF-8, line ends untouched)."""
  path = directory / name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
  return path


def variants(text: str) -> dict[str, bytes]:
  """The same LF text as UTF-8 with and without a BOM, with LF, CRLF or a final lone CR."""
  assert "\r" not in text and text.endswith("\n")
  crlf = text.replace("\n", "\r\n")
  return {"lf": text.encode(), "bom": b"\xef\xbb\xbf" + text.encode(),
          "crlf": crlf.encode(), "bom_crlf": b"\xef\xbb\xbf" + crlf.encode(),
          "final_cr": (text[:-1] + "\r").encode(), "no_final_newline": text[:-1].encode()}


def custom_config(data_dir, **custom):
  """`config.data` of the base config with task='custom' and these custom fields."""
  c = base.get_config().data
  c.task = "custom"
  c.data_dir = str(data_dir)
  c.custom.update(custom)
  return c
