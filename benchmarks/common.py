"""Timing helpers shared by the benchmark scripts (medians over repeats)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], repeats: int = 7, warmup: int = 2) -> float:
  """Median wall time of `fn()`; `fn` must block until its result is ready."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def interleaved(fns: dict[str, Callable[[], object]], rounds: int = 15, warmup: int = 2,
                pause: float = 0.2) -> tuple[dict[str, float], Callable[[str, str], float]]:
  """Times `fns` round-robin: each round runs every function once.

  This VM's speed drifts; interleaving exposes all functions to the same
  drift, and the median of per-round ratios is steadier than a ratio of
  medians taken at different times. A short pause between functions lets
  the previous one's worker threads (OpenMP spin-waits) go idle.

  Returns:
    (median seconds per name, ratio(a, b) = median over rounds of t_a / t_b).
  """
  for fn in fns.values():
    for _ in range(warmup):
      fn()
  times = {k: [] for k in fns}
  for _ in range(rounds):
    for k, fn in fns.items():
      time.sleep(pause)
      t = time.perf_counter()
      fn()
      times[k].append(time.perf_counter() - t)
  med = {k: statistics.median(v) for k, v in times.items()}
  def ratio(a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(times[a], times[b]))
  return med, ratio


def child(script: str, *args: str, env: dict | None = None) -> dict:
  """`python script *args` in its own process (so its peak RSS is its own), with the repository
  on PYTHONPATH; its last stdout line, a JSON object. Exits with its stderr's tail if it
  fails."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                       env={**(os.environ if env is None else env), "PYTHONPATH": root})
  if out.returncode:
    sys.exit(f"{os.path.basename(script)} {' '.join(args)} failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def tune_cpu() -> list[str]:
  """Applies `cpu_tuning`'s settings for this CPU kind, as the launcher does."""
  from papa_jax import cpu_tuning  # pylint: disable=import-outside-toplevel
  return cpu_tuning.apply()


def machine() -> dict:
  """CPU model and vector flags, cores, JAX and its devices, XLA flags."""
  from papa_jax import cpu_tuning  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  cpu = cpu_tuning.cpu_info()
  return dict(cpu=cpu_tuning.name(cpu), cpu_kind=cpu["kind"], cpu_flags=" ".join(cpu["flags"]),
              cores=os.cpu_count(), jax=jax.__version__, backend=jax.default_backend(),
              devices=f"{len(jax.devices())} x {jax.devices()[0].device_kind}",
              xla_flags=os.environ.get("XLA_FLAGS", ""), platform=platform.machine())


def machine_line(m: dict) -> str:
  """The `Machine:` line every benchmark prints (name, family/model, vector flags)."""
  return (f"Machine: {m['cpu']} ({m['cpu_kind']}: {m['cpu_flags']}), {m['cores']} cores; "
          f"JAX {m['jax']}")


def set_torch_threads() -> None:
  import torch
  torch.set_num_threads(os.cpu_count() or 1)


def report(title: str, rows: list[dict], path: str | None = None) -> None:
  """Prints rows as a markdown table and optionally appends JSON lines."""
  keys = list(rows[0])
  m = machine()
  print(f"\n### {title}\n")
  print(f"{machine_line(m)} on {m['devices']}; XLA_FLAGS='{m['xla_flags']}'\n")
  print("| " + " | ".join(keys) + " |")
  print("|" + "---|" * len(keys))
  for r in rows:
    print("| " + " | ".join(
        f"{v:.3g}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
  if path:
    with open(path, "a") as f:
      f.write(json.dumps(dict(title=title, machine=machine(), rows=rows)) + "\n")
