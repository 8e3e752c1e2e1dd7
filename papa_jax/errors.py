"""Errors every layer raises; a leaf module, so any module can import it."""

from __future__ import annotations


class ConfigError(ValueError):
  """A config that cannot run, found before any long computation."""


class ModelNotFound(FileNotFoundError):
  """A model (or its tokenizer) that is neither on disk nor downloadable; the message says
  what to pass instead."""
