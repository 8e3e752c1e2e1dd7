"""XLA-CPU settings chosen by measurement for the CPU kind this runs on.

`cpu_info()` reads the CPU model and vector extensions; `apply()` adds the
settings that measured fastest for that kind to XLA_FLAGS (never overriding a
flag the user set), and must run before JAX creates its CPU backend (the
launcher calls it first). The table below holds what benchmarks/cpu_flags.py
measured, per kind; RESULTS.md has the runs. A kind not measured yet keeps
XLA's defaults. `PAPA_CPU_TUNING=off` in the environment keeps XLA's defaults
everywhere.

A setting is adopted only when it is faster and leaves the quickstart's dev
predictions unchanged (benchmarks/compare_workdirs.py): it may move the last
bits of float sums, as XLA's own kernels do between CPU kinds.
"""

from __future__ import annotations

import os

# kind -> XLA flags that measured fastest for the encoder forward and the means
# pass (benchmarks/cpu_flags.py; benchmarks/RESULTS.md).
MEASURED: dict[str, tuple[str, ...]] = {
    "avx512_bf16": (),  # AMD EPYC (Zen 4) 2 cores: XLA defaults were fastest.
    "avx512": (),
    # AMD EPYC, AVX2 only, 2 cores: without YNN fusion the forward is 10-15%
    # faster; the quickstart's 5 x 872 dev predictions are all unchanged.
    "avx2": ("--xla_cpu_experimental_ynn_fusion_type=",),
}
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16",
                "amx_tile")


def cpu_info(path: str = "/proc/cpuinfo") -> dict:
  """`{"model", "cpuid", "flags" (the vector extensions present), "kind"}` from /proc/cpuinfo.

  `cpuid` ("family 25 model 17", "" when absent) tells apart CPUs that show the same name
  and flags: a 2-core "AMD EPYC" VM with AVX-512 measured 384 GFLOP/s of float32 matmul on
  2026-12-02 and one of family 25 (Zen 4) 194 on 2026-12-05 (benchmarks/RESULTS.md).
  """
  model, flags, ids = "unknown", set(), {}
  try:
    with open(path) as f:
      for line in f:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
          model = value.strip()
        elif key in ("flags", "Features") and not flags:
          flags = set(value.split())
        elif key in ("cpu family", "model") and key not in ids:
          ids[key] = value.strip()
  except OSError:
    pass
  present = [f for f in VECTOR_FLAGS if f in flags]
  if "avx512_bf16" in flags:
    kind = "avx512_bf16"
  elif "avx512f" in flags:
    kind = "avx512"
  elif "avx2" in flags:
    kind = "avx2"
  else:
    kind = "other"
  cpuid = " ".join(f"{k.split()[-1]} {ids[k]}" for k in ("cpu family", "model") if k in ids)
  return dict(model=model, cpuid=cpuid, flags=present, kind=kind)


def name(info: dict) -> str:
  """`cpu_info`'s model with its family and model numbers: "AMD EPYC [family 25 model 17]"."""
  return f"{info['model']} [{info['cpuid']}]" if info.get("cpuid") else info["model"]


def apply(environ=os.environ) -> list[str]:
  """Adds this CPU kind's measured flags to XLA_FLAGS; returns the ones added."""
  if environ.get("PAPA_CPU_TUNING", "").lower() in ("off", "0", "false"):
    return []
  current = environ.get("XLA_FLAGS", "")
  set_names = {f.split("=")[0] for f in current.split()}
  added = [f for f in MEASURED.get(cpu_info()["kind"], ()) if f.split("=")[0] not in set_names]
  if added:
    environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
  return added
