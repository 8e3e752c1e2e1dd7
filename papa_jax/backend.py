"""One home for steps that differ between CPU and accelerators: chosen when lowered.

A few steps take another path on CPU than on GPUs and TPUs (the fusion barrier, fused
attention, one LAPACK call per matrix, a scan instead of an einsum). `by_platform` traces both
paths into one program (`jax.lax.platform_dependent`) and the compiler keeps the one for the
platform it lowers for: the program a CPU run traces is the one a TPU or GPU runs, and it
exports for them (`jax.export`, tests/lowering_test.py) with no accelerator at hand.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax


def by_platform(cpu: Callable[..., Any], accelerator: Callable[..., Any], *args: Any) -> Any:
  """`cpu(*args)` in programs lowered for CPU, `accelerator(*args)` for GPU and TPU (both
  return the same shapes and dtypes)."""
  return jax.lax.platform_dependent(*args, cpu=cpu, default=accelerator)


def fused_attention_setting() -> bool | None:
  """PAPA_FUSED_ATTENTION=1 or 0, else None (the platform's default, `use_fused_attention`)."""
  env = os.environ.get("PAPA_FUSED_ATTENTION", "")
  return env == "1" if env in ("0", "1") else None


def use_fused_attention() -> bool:
  """Whether dynamic heads whose probabilities nobody reads use
  `jax.nn.dot_product_attention` (cuDNN flash attention on GPU, XLA elsewhere) on this run's
  backend.

  On by default in programs lowered for GPU/TPU; off for CPU, where the explicit path with
  `fusion_barrier` measured faster (benchmarks/RESULTS.md). The environment variable
  PAPA_FUSED_ATTENTION=1 or 0 overrides the default.
  """
  setting = fused_attention_setting()
  return jax.default_backend() != "cpu" if setting is None else setting
