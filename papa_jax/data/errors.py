"""The errors of the data layer."""

from __future__ import annotations

from papa_jax.errors import ConfigError, PapaError


class DataError(PapaError, ValueError):
  """A data file that cannot be read as its task declares (names file and line)."""


class TaskConfigError(DataError, ConfigError):
  """A task declaration (`config.data`) that cannot work (names the config field).

  A `ConfigError` like every other config problem, and a `DataError` for the
  data layer's callers.
  """
