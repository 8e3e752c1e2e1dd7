"""Compact storage of attention matrices for the explorer page.

Every matrix is quantised to 8 bits with its own scale: a matrix with no
negative entry as unsigned `q = round(x / s)`, `s = max(x) / 255`; a signed one
(effective attention) as `q = round(x / s)` in [-127, 127], `s = max|x| / 127`.
Decoding is `x' = q * s`, so `|x' - x| <= s / 2`: at most `max|x| / 510`
(unsigned) or `max|x| / 254` (signed) of the matrix's largest entry. The
quantised bytes are zlib-compressed (the browser's `DecompressionStream
("deflate")` format) and base64-encoded.
"""

from __future__ import annotations

import base64
import math
import zlib
from typing import Any

import numpy as np

UNSIGNED_LEVELS = 255
SIGNED_LEVELS = 127


def quantize(x: np.ndarray, *, signed: bool) -> tuple[np.ndarray, np.ndarray]:
  """8-bit codes and one scale per matrix (the last two axes).

  Args:
    x: `[..., n, m]` finite floats; must be non-negative unless `signed`.
    signed: int8 codes in [-127, 127] (else uint8 in [0, 255]).

  Returns:
    `(codes [..., n, m], scales [...] float32)` with `codes * scales` within
    `scales / 2` of `x`.
  """
  x = np.asarray(x, np.float64)
  if not np.all(np.isfinite(x)):
    raise ValueError("Cannot quantise non-finite values.")  # internal check
  if not signed and x.size and x.min() < 0:
    # internal check
    raise ValueError(f"Unsigned quantisation of a matrix with a negative entry ({x.min():g}).")
  levels = SIGNED_LEVELS if signed else UNSIGNED_LEVELS
  peak = np.abs(x).max(axis=(-2, -1)) if x.size else np.zeros(x.shape[:-2])
  # float32 scales, used for both coding and decoding, so the bound holds exactly
  # for the values the browser reconstructs.
  scales = np.where(peak > 0, peak / levels, 1.0).astype(np.float32)
  codes = np.rint(x / scales[..., None, None].astype(np.float64))
  codes = np.clip(codes, -levels if signed else 0, levels)
  return codes.astype(np.int8 if signed else np.uint8), scales


def dequantize(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
  return codes.astype(np.float32) * np.asarray(scales, np.float32)[..., None, None]


def encode_bytes(data: bytes, level: int = 9) -> str:
  """zlib (RFC 1950, the DecompressionStream 'deflate' format), then base64."""
  return base64.b64encode(zlib.compress(data, level)).decode("ascii")


def decode_bytes(text: str) -> bytes:
  return zlib.decompress(base64.b64decode(text))


def packed_matrices(x: np.ndarray, *, signed: bool | None = None) -> dict[str, Any]:
  """A JSON-ready record of quantised matrices, decoded by the page's JS.

  Args:
    x: `[..., n, m]`.
    signed: force the code type; default: signed iff `x` has a negative entry.
  """
  x = np.asarray(x)
  if signed is None:
    signed = bool(x.size and x.min() < 0)
  codes, scales = quantize(x, signed=signed)
  return dict(dtype="int8" if signed else "uint8", shape=list(codes.shape),
              scales=[float(s) for s in scales.reshape(-1)],
              data=encode_bytes(np.ascontiguousarray(codes).tobytes()))


def unpack_matrices(record: dict[str, Any]) -> np.ndarray:
  """The inverse of `packed_matrices` (the decoded float32 values)."""
  codes = np.frombuffer(decode_bytes(record["data"]), np.dtype(record["dtype"]))
  codes = codes.reshape(record["shape"])
  scales = np.asarray(record["scales"], np.float32).reshape(codes.shape[:-2])
  return dequantize(codes, scales)


def finite_or_none(obj: Any) -> Any:
  """Nested lists/dicts with NaN and infinities as None (JSON has no NaN)."""
  if isinstance(obj, dict):
    return {k: finite_or_none(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [finite_or_none(v) for v in obj]
  if isinstance(obj, np.ndarray):
    return finite_or_none(obj.tolist())
  if isinstance(obj, (float, np.floating)):
    return float(obj) if math.isfinite(obj) else None
  if isinstance(obj, np.integer):
    return int(obj)
  return obj
