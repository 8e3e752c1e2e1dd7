"""The errors of the data layer."""

from __future__ import annotations


class DataError(ValueError):
  """A data file that cannot be read as its task declares (names file and line)."""


class TaskConfigError(DataError):
  """A task declaration (`config.data`) that cannot work (names the config field)."""
