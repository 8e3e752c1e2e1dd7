"""Every jitted program of every registered stage and family lowers for TPU and CUDA.

No accelerator is needed: `tests/lowering_capture.py` runs the stages on CPU, records each
jitted call and exports it with `jax.export` for TPU and CUDA (steps that differ by platform
are chosen at lowering: `papa_jax/backend.py`), on one device and on the launcher's 8-device
data mesh. A
program that cannot lower, or that holds a host callback (which cannot run on a TPU pod's hot
loop), fails here naming its stage (or family), its function and the op.
"""

import json
import os
import subprocess
import sys

import pytest

from papa_jax import registry
from papa_jax.convert.families import FAMILIES
from tests.conftest import UNIT_XLA_FLAGS
from tests.launcher import launcher_env
from tests.testing import require_model, require_shared

# Whole stages in a subprocess with jax.jit replaced: the integration tier, one setting slow.

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lowering_capture.py")


def _capture(tmp, devices: int, *extra: str) -> dict:
  require_model("splade_tiny")
  require_shared("data", "conll2003")
  pytest.importorskip("torch", reason="random family checkpoints are built with torch")
  out = os.path.join(tmp, "lowered.json")
  # The CPU programs only carry the stages to their exports (StableHLO, lowered before XLA's
  # backend runs): compiling them unoptimised, as the unit tier does, takes a quarter less CPU.
  env = launcher_env(devices)
  env["XLA_FLAGS"] += " " + UNIT_XLA_FLAGS
  res = subprocess.run([sys.executable, SCRIPT, out, os.path.join(tmp, "work"), *extra],
                       capture_output=True, text=True, timeout=1800, env=env)
  assert res.returncode == 0, res.stderr[-4000:]
  with open(out, encoding="utf-8") as f:
    return json.load(f)


# One device in float32 (the integration tier); the launcher's 8-device data mesh in bfloat16,
# the accelerators' default compute dtype (the slow tier: the same stages again).
SETTINGS = [pytest.param((1, "float32"), id="1-device-float32", marks=pytest.mark.integration),
            pytest.param((8, "bfloat16"), id="8-devices-bfloat16", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=SETTINGS)
def lowered(request, tmp_path_factory) -> dict:
  devices, dtype = request.param
  tmp = str(tmp_path_factory.mktemp(f"lowering{devices}"))
  return _capture(tmp, devices, "--dtype", dtype, "--families")


def _failures(rows: list[dict]) -> list[str]:
  return [f"{r['where']}: {r['function']}: {r['error']}" for r in rows if "error" in r]


def test_every_program_lowers_for_tpu_and_cuda(lowered):
  assert lowered["platforms"] == ["tpu", "cuda"]
  assert not _failures(lowered["rows"]), "\n".join(_failures(lowered["rows"]))
  # The passes over data span the mesh; small helpers (on replicated inputs) may not.
  assert max(r["nr_devices"] for r in lowered["rows"]) == lowered["devices"]
  assert all(r["nr_devices"] == lowered["devices"] for r in lowered["rows"]
             if r["where"] == "means" and "sharded_sum" in r["function"])


def test_every_registered_stage_ran_and_had_its_programs_exported(lowered):
  """Every stage of the registry ran (a stage added to it is covered without editing this
  test), and all but the ones that only read other stages' outputs jitted programs."""
  assert lowered["ran"] == sorted(s.name for s in registry.STAGES)
  exported = {r["where"] for r in lowered["rows"]}
  assert set(lowered["ran"]) - exported == {"orderings"}, sorted(exported)


def test_every_family_reaches_the_export(lowered):
  """The means pass (raw and effective attention), context mixing (post-LN families) and the
  probe's features with half the heads constant, exported per family."""
  for family in FAMILIES:
    rows = [r["function"] for r in lowered["rows"] if r["where"] == f"family {family.name}"]
    assert len(rows) >= 3, f"family {family.name}: {rows}"


@pytest.mark.integration
def test_a_planted_host_callback_fails_naming_the_stage_and_the_op(tmp_path):
  """A host callback inside the probe stage's constant heads is caught, with its source."""
  got = _capture(str(tmp_path), 1, "--plant", "probe")
  bad = [r for r in got["rows"] if "error" in r]
  assert bad and {r["where"] for r in bad} == {"probe"}, _failures(got["rows"])
  assert all(r["error"].startswith("host callback: pure_callback at ") and
             "lowering_capture.py" in r["error"] for r in bad), _failures(bad)
  assert any(r["where"] == "means" and "error" not in r for r in got["rows"])
