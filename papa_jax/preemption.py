"""Stopping cleanly on SIGTERM, as TPU VMs and spot GPUs are preempted.

`install()` turns SIGTERM into a flag; the loops check `requested()` after each
step or batch, write a checkpoint (probe state with its position in the epoch,
or the means partial sums) and raise `Preempted`; the launcher then exits with
`EXIT_CODE`, and rerunning the same command resumes from the checkpoint.
"""

from __future__ import annotations

import signal
import threading

from absl import logging

EXIT_CODE = 75  # EX_TEMPFAIL: try again (rerun the same command to resume).
_requested = threading.Event()


class Preempted(RuntimeError):
  """The run stopped on request after saving its state."""


def _handler(signum, frame) -> None:
  del frame
  logging.warning("Signal %d received: finishing the current step, then checkpointing and "
                  "stopping.", signum)
  _requested.set()


def install() -> None:
  """Handle SIGTERM from now on (call from the main thread)."""
  signal.signal(signal.SIGTERM, _handler)


def requested() -> bool:
  return _requested.is_set()


def reset() -> None:
  _requested.clear()
