"""Progress lines: few of them, and an ETA that the first (compiling) batch does not skew."""

import re

import pytest

from papa_jax import progress

pytestmark = pytest.mark.unit


@pytest.fixture
def clock(monkeypatch):
  """A fake `time.perf_counter` (advanced by hand) and the lines logged."""
  now, lines = [0.0], []
  monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
  monkeypatch.setattr(progress.logging, "info", lambda fmt, *a: lines.append(fmt % a))
  return now, lines


def _run(clock, first: float, each: float, total: int = 200, **kw):
  """A loop whose first batch takes `first` seconds (the compile) and the others `each`."""
  now, lines = clock
  p = progress.Progress("pass", total, unit="ex", **kw)
  for i in range(total):
    now[0] += first if i == 0 else each
    p.update(1)
  return lines


def _eta(line: str) -> float:
  m, s = re.search(r"ETA (\d+):(\d+)", line).groups()
  return 60 * int(m) + int(s)


@pytest.mark.parametrize("first", [0.5, 30.0, 300.0])
def test_progress_eta_is_right_within_a_quarter_after_a_tenth(clock, first):
  lines = _run(clock, first, each=0.5, every=1, interval=0.0)
  for done, line in enumerate(lines, start=1):
    if done >= 20 and done < 200:  # After the first tenth of the loop.
      true = (200 - done) * 0.5
      assert abs(_eta(line) - true) <= 0.25 * true + 1, (line, true)


def test_progress_logs_at_most_every_interval_and_the_end(clock):
  """200 updates over 100 s with `every=1`: a line per 30 s and the last, not 200."""
  lines = _run(clock, first=0.5, each=0.5, every=1, interval=30.0)
  assert 3 <= len(lines) <= 5, lines
  assert lines[-1].startswith("pass: 200/200 (100%) 2.0 ex/s")


def test_progress_first_line_has_no_rate_yet(clock):
  """A loop logged at its first update (a probe's first 50 steps): "?" for the rate and the
  ETA, not "0.0 steps/s"."""
  now, lines = clock
  p = progress.Progress("train", 3750, unit="steps", every=1, interval=30.0)
  now[0] += 1.0
  p.update(50)
  assert lines == ["train: 50/3750 (1%) ? steps/s elapsed 0:01 ETA ? "]
