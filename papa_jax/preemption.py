"""Stopping cleanly on SIGTERM, as TPU VMs and spot GPUs are preempted.

`install()` turns SIGTERM into a flag; the loops ask `should_stop()` after each
step or batch, write a checkpoint (probe state with its position in the epoch,
or the means partial sums) and raise `Preempted`; the launcher then exits with
`EXIT_CODE`, and rerunning the same command resumes from the checkpoint.

On a pod the hosts receive SIGTERM at different steps, and a host that stops
alone leaves the others waiting in the next collective. So with several
processes `should_stop()` is agreed: every process asks at the same points of
the same loops (they step in lockstep over their data shards) and all stop at
the same one, by an all-gather of their flags. (JAX's preemption sync service
is switched off by the launcher: it hears SIGTERM itself and picks the step
after the furthest host's; in two-process runs here the loops ran on past it
in 2 of 3 tries and never stopped.)
"""

from __future__ import annotations
from papa_jax.errors import ConfigError

import itertools
import signal
import threading

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

EXIT_CODE = 75  # EX_TEMPFAIL: try again (rerun the same command to resume).
_requested = threading.Event()
_checks = itertools.count()  # Calls to should_stop: the same sequence on every process.
_every = 1


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
  """This process's own flag (use `should_stop()` in loops)."""
  return _requested.is_set()


def set_check_every(every: int) -> None:
  """With several processes, agree on stopping at every `every`-th check (>= 1)."""
  global _every
  if every < 1:
    raise ConfigError(f"preemption_check_every={every}: must be >= 1.")
  _every = int(every)


def should_stop() -> bool:
  """Whether to stop after this step: the same answer, at the same step, on every process.

  One process: its own flag. Several: at every `set_check_every`-th call, an
  all-gather of every process's flag (any one stops all); in between, no.
  Every process must call this at the same points of the same loops, which the
  loops do: they step in lockstep over their data shards.
  """
  if jax.process_count() == 1:
    return _requested.is_set()
  if next(_checks) % _every:
    return False
  stop = bool(np.any(multihost_utils.process_allgather(np.int32(_requested.is_set()))))
  if stop and not _requested.is_set():
    logging.warning("Another process was signalled: every process stops at this step.")
    _requested.set()
  return stop


def reset() -> None:
  _requested.clear()
