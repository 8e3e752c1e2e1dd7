"""Device memory of a run's stages, counted from the shapes before any work (and checked).

Each stage's largest program is one of four kinds, each counted per device as arguments
(parameters, the batch, trained state) + outputs + the temporaries XLA keeps:
- `forward`: the frozen encoder, every hidden state out (features, eval, ablation, knockout,
  finetune): one layer's temporaries live at a time.
- `capture`: the forward with attention maps summed per layer (means, effective, linguistic,
  mixing): the forward plus the `[layers, heads, L, L]` sums.
- `through`: a backward pass through the encoder (the sort's gates, the optimal constants,
  attribution patching): every layer's temporaries are kept for the backward pass.
- `probe`: one probe step on constant heads (no gradient into the encoder).
Temporaries per example and layer are `a * heads * L^2 * 4` bytes (attention-map sized) plus
`L * 4 * (8 * hidden + c * intermediate)` (token sized), with `a` and `c` calibrated on the
programs XLA compiles for BERT-base on CPU (jaxlib 0.10.2; `benchmarks/memory_plan.py` prints
both counts for other shapes, `tests/memory_plan_test.py` holds them within `TOLERANCE` of each
other). GPU and TPU compilers schedule differently: the plan is an estimate, not a bound.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from papa_jax.errors import ConfigError
from papa_jax.models.config import EncoderConfig
from papa_jax.stage import Stage

F32 = 4
TOLERANCE = 0.35  # The plan is within this fraction of the compiled programs' memory.
# Calibrated temporaries, per example: (attention maps per layer, intermediate vectors per
# token per layer, layers kept at once: 1 or all).
KINDS = {"forward": (2.0, 3.0, False), "capture": (2.0, 3.0, False),
         "through": (6.2, 4.2, True), "probe": (2.0, 3.0, False)}


@dataclasses.dataclass(frozen=True)
class Program:
  """One stage's largest program: its kind, per-device batch and bytes by part."""

  stage: str
  kind: str
  batch: int
  parts: dict[str, int]

  @property
  def total(self) -> int:
    return sum(self.parts.values())


def param_bytes(params: Any) -> int:
  return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(params)))


def program(kind: str, c: EncoderConfig, params: int, batch: int, length: int,
            stage: str = "") -> Program:
  """The plan of one program of `kind` for `batch` examples of `length` tokens per device
  (bfloat16 `c.compute_dtype` adds the weights' bfloat16 copies)."""
  a, inter, all_layers = KINDS[kind]
  maps = c.num_heads * length * length * F32
  tokens = length * F32 * (8 * c.hidden_size + inter * c.intermediate_size)
  temp = batch * (a * maps + tokens) * (c.num_layers if all_layers else 1)
  hidden = batch * c.num_hidden_states * length * c.hidden_size * F32
  parts = dict(params=params + (params // 2 if c.compute_dtype == "bfloat16" else 0),
               batch=batch * length * 3 * 4, temporaries=int(temp))
  if kind in ("forward", "through"):  # Every hidden state out (a probe step's are inside).
    parts["hidden_states"] = hidden
  if kind == "capture":
    parts["sums"] = 4 * c.num_layers * maps
  return Program(stage, kind, batch, parts)


def plan(config: ml_collections.ConfigDict, c: EncoderConfig, params: int, devices: int,
         stages: tuple[Stage, ...]) -> list[Program]:
  """Each of `stages`' largest program (`Stage.memory`) at its batch size over `devices`;
  stages that run none, that this config skips, or that declare no kind are not planned."""
  out = []
  for stage in stages:
    if stage.memory is None:
      logging.info("Memory plan: stage %s declares no memory kind (Stage.memory); not "
                   "planned.", stage.name)
      continue
    if not stage.memory or (stage.skipped is not None and stage.skipped(config, c)):
      continue
    if stage.memory not in KINDS:
      # internal check
      raise ValueError(f"Stage {stage.name}: memory kind {stage.memory!r} is not among "
                       f"{tuple(KINDS)}.")
    group, field = stage.batch_size.split(".")
    global_batch = config[group][field]
    out.append(program(stage.memory, c, params, -(-global_batch // devices),
                       config.data.max_length, stage.name))
  return out


def device_limit(config: ml_collections.ConfigDict) -> tuple[int | None, str]:
  """Bytes one device may use, and where the number comes from (None: no check)."""
  gb = config.run.device_memory_gb
  if gb > 0:
    return int(gb * 2**30), f"run.device_memory_gb={gb:g}"
  if gb < 0:
    return None, "run.device_memory_gb < 0"
  stats = jax.local_devices()[0].memory_stats() or {}
  if "bytes_limit" in stats:
    return int(stats["bytes_limit"]), f"the device's own limit ({jax.local_devices()[0]})"
  return None, "no limit reported by the device (CPU)"


def check(config: ml_collections.ConfigDict, c: EncoderConfig, params: Any, devices: int,
          stages: tuple[Stage, ...]) -> list[Program]:
  """Refuses a run whose planned program exceeds a device's memory; returns the plan."""
  programs = plan(config, c, param_bytes(params), devices, stages)
  knobs = {s.name: s.batch_size for s in stages}
  limit, source = device_limit(config)
  over = [p for p in programs if limit is not None and p.total > limit]
  if over:
    p = max(over, key=lambda p: p.total)
    parts = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in p.parts.items())
    # caller's argument
    raise ConfigError(
        f"The {p.stage} stage needs about {p.total / 2**30:.2f} GiB per device ({parts} GiB; "
        f"{p.batch} examples x {config.data.max_length} tokens per device), over "
        f"{limit / 2**30:.2f} GiB ({source}). Lower {knobs[p.stage]} or data.max_length, use "
        "more devices, or set run.device_memory_gb to the memory you have (-1: no check).")
  return programs
