"""Periodic progress lines with rate and ETA, for long loops."""

from __future__ import annotations

import time

from absl import logging


def _fmt(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
  """Logs `desc: done/total (pct) rate unit/s ETA` every `every` updates."""

  def __init__(self, desc: str, total: int, unit: str = "ex", every: int = 20, start: int = 0):
    self.desc, self.total, self.unit, self.every = desc, total, unit, max(every, 1)
    self.done, self.start_done, self.updates = start, start, 0
    self.t0 = time.perf_counter()

  def update(self, n: int = 1, **extra) -> None:
    self.done += n
    self.updates += 1
    if self.updates % self.every == 0 or self.done >= self.total:
      self.log(**extra)

  def log(self, **extra) -> None:
    elapsed = time.perf_counter() - self.t0
    rate = (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0
    eta = (self.total - self.done) / rate if rate > 0 else float("nan")
    pct = 100.0 * self.done / self.total if self.total else 100.0
    tail = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in extra.items())
    logging.info("%s: %d/%d (%.0f%%) %.1f %s/s elapsed %s ETA %s %s", self.desc, self.done,
                 self.total, pct, rate, self.unit, _fmt(elapsed),
                 _fmt(eta) if eta == eta else "?", tail)

  @property
  def seconds(self) -> float:
    return time.perf_counter() - self.t0
