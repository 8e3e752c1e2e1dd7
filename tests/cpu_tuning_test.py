"""XLA-CPU settings per CPU kind: detection, applying them, and the launcher's use."""

import os
import subprocess
import sys

import pytest

from papa_jax import cpu_tuning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAG = "--xla_cpu_experimental_ynn_fusion_type="  # A flag this XLA accepts.


def _cpuinfo(tmp_path, flags: str) -> str:
  path = tmp_path / "cpuinfo"
  path.write_text(f"processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\n"
                  f"model name\t: Test CPU 9000\nflags\t\t: fpu sse2 {flags}\n\n"
                  f"processor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: Other\n"
                  f"flags\t\t: fpu\n")
  return str(path)


@pytest.mark.unit
@pytest.mark.parametrize("flags,kind", [
    ("avx2 fma", "avx2"),
    ("avx2 fma avx512f avx512bw", "avx512"),
    ("avx2 avx512f avx512_bf16 amx_bf16", "avx512_bf16"),
    ("sse4_2", "other"),
    # AMD EPYC Zen 4 (the 2026-12-02 record's machine: AVX-512 with BF16, no AMX) and the
    # Intel Xeon with AMX that later sessions ran on: one kind, so the same settings.
    ("avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi "
     "avx512_bf16 clzero avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq", "avx512_bf16"),
    ("avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx_vnni avx512_bf16 "
     "avx512_vnni avx512_fp16 amx_bf16 amx_tile amx_int8", "avx512_bf16"),
])
def test_cpu_info_reads_model_flags_and_kind(tmp_path, flags, kind):
  info = cpu_tuning.cpu_info(_cpuinfo(tmp_path, flags))
  assert info["model"] == "Test CPU 9000"  # The first processor's.
  assert info["cpuid"] == "family 25 model 17"
  assert info["kind"] == kind
  assert set(info["flags"]) == set(flags.split()) & set(cpu_tuning.VECTOR_FLAGS)


@pytest.mark.unit
def test_cpu_info_without_proc_cpuinfo(tmp_path):
  assert cpu_tuning.cpu_info(str(tmp_path / "missing")) == dict(
      model="unknown", cpuid="", flags=[], kind="other")


@pytest.mark.unit
def test_apply_adds_the_kinds_flags_and_keeps_the_users(monkeypatch):
  monkeypatch.setattr(cpu_tuning, "cpu_info", lambda: dict(model="m", flags=[], kind="avx2"))
  monkeypatch.setitem(cpu_tuning.MEASURED, "avx2", (FLAG, "--xla_b=1"))
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_b=7"}
  assert cpu_tuning.apply(env) == [FLAG]  # --xla_b was set by the user: kept.
  assert env["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 --xla_b=7 {FLAG}"
  env = {}
  assert cpu_tuning.apply(env) == [FLAG, "--xla_b=1"]
  assert env["XLA_FLAGS"] == f"{FLAG} --xla_b=1"
  env = {"PAPA_CPU_TUNING": "off"}
  assert cpu_tuning.apply(env) == [] and "XLA_FLAGS" not in env
  monkeypatch.setitem(cpu_tuning.MEASURED, "avx2", ())
  env = {}
  assert cpu_tuning.apply(env) == [] and "XLA_FLAGS" not in env


@pytest.mark.integration
def test_launcher_applies_the_kinds_flags_before_jax_starts(tmp_path):
  """The launcher adds this kind's flags (patched here) and logs CPU and XLA_FLAGS."""
  kind = cpu_tuning.cpu_info()["kind"]
  (tmp_path / "sitecustomize.py").write_text(
      "from papa_jax import cpu_tuning\n"
      f"cpu_tuning.MEASURED[{kind!r}] = ({FLAG!r},)\n")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]),
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  out = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "main.py"),
                        "--config=" + os.path.join(ROOT, "configs", "quickstart.py"),
                        f"--workdir={tmp_path / 'w'}", "--config.model.dtype=float16"],
                       capture_output=True, text=True, timeout=300, env=env)
  assert out.returncode != 0 and "model.dtype" in out.stderr  # Stops at the config check.
  want = f"XLA_FLAGS='--xla_force_host_platform_device_count=2 {FLAG}'"
  assert want in out.stderr, out.stderr[-3000:]
  assert f"({kind})" in out.stderr and "2 devices" in out.stderr


@pytest.mark.unit
def test_name_carries_family_and_model_when_known(tmp_path):
  """Two CPUs named "AMD EPYC" with the same flags differ 2x in matmul peak (Zen 4 vs an
  earlier record's machine): records and benchmark lines must tell them apart."""
  info = cpu_tuning.cpu_info(_cpuinfo(tmp_path, "avx2 fma"))
  assert cpu_tuning.name(info) == "Test CPU 9000 [family 25 model 17]"
  assert cpu_tuning.name(dict(model="AMD EPYC", kind="avx2")) == "AMD EPYC"  # Older records.
