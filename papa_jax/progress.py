"""Periodic progress lines with rate and ETA, for long loops."""

from __future__ import annotations

import time

from absl import logging


INTERVAL = 30.0  # Seconds between two progress lines of one loop (and the last).


def _fmt(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
  """Logs `desc: done/total (pct) rate unit/s elapsed ETA`, every `every` updates but at most
  once every `interval` seconds, and at the end. The rate (and so the ETA) counts from the
  first update on: the first batch, which compiles, would skew them for most of the loop."""

  def __init__(self, desc: str, total: int, unit: str = "ex", every: int = 20, start: int = 0,
               interval: float = INTERVAL):
    self.desc, self.total, self.unit, self.every = desc, total, unit, max(every, 1)
    self.interval = interval
    self.done, self.updates = start, 0
    self.t0 = time.perf_counter()
    self.first: tuple[float, int] | None = None  # (time, done) at the first update.
    self.last_log = -float("inf")

  def update(self, n: int = 1, **extra) -> None:
    self.done += n
    self.updates += 1
    now = time.perf_counter()
    if self.first is None:
      self.first = (now, self.done)
    if self.done >= self.total or (self.updates % self.every == 0
                                   and now - self.last_log >= self.interval):
      self.log(**extra)

  def rate(self) -> float:
    """Units per second since the first update (0 before a second one)."""
    if self.first is None:
      return 0.0
    seconds, units = time.perf_counter() - self.first[0], self.done - self.first[1]
    return units / seconds if seconds > 0 and units > 0 else 0.0

  def log(self, **extra) -> None:
    now = time.perf_counter()
    self.last_log = now
    elapsed = now - self.t0
    rate = self.rate()
    eta = (self.total - self.done) / rate if rate > 0 else float("nan")
    pct = 100.0 * self.done / self.total if self.total else 100.0
    tail = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in extra.items())
    # Before a second update there is no rate yet (the first batch compiles): "?", not 0.
    logging.info("%s: %d/%d (%.0f%%) %s %s/s elapsed %s ETA %s %s", self.desc, self.done,
                 self.total, pct, f"{rate:.1f}" if rate > 0 else "?", self.unit, _fmt(elapsed),
                 _fmt(eta) if eta == eta else "?", tail)

  @property
  def seconds(self) -> float:
    return time.perf_counter() - self.t0
