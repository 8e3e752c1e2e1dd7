"""The memory plan: its counts against the programs XLA compiles, and the launcher's refusal."""

import os

import pytest

from benchmarks import memory_plan as bench
from papa_jax import memory_plan, run
from papa_jax.errors import ConfigError
from papa_jax.models.config import EncoderConfig
from tests import testing
from tests.testing import tiny_config

MINILM = EncoderConfig(**bench.SIZES["minilm"])


def _config(**overrides):
  c = testing.override(tiny_config(None), **{"data.max_length": 128, "run.batch_size": 32,
                                             "probe.batch_size": 16})
  return testing.override(c, **overrides)


@pytest.mark.integration
@pytest.mark.parametrize("kind", list(memory_plan.KINDS))
def test_the_plan_is_within_its_tolerance_of_the_compiled_program(kind):
  """MiniLM's shape (not the BERT-base shape the plan was calibrated on), 16 x 128 tokens:
  the plan and XLA's memory analysis of the library's own step agree within TOLERANCE."""
  planned = bench.planned(kind, MINILM, 16, 128)
  compiled = bench.compiled(kind, MINILM, 16, 128)
  assert abs(planned / compiled - 1) <= memory_plan.TOLERANCE, (kind, planned, compiled)


@pytest.mark.unit
def test_every_registered_stage_declares_its_memory_kind_and_batch():
  from papa_jax import registry  # pylint: disable=import-outside-toplevel
  kinds = {s.name: s.memory for s in registry.STAGES}
  assert set(kinds.values()) == set(memory_plan.KINDS) | {""}  # Every kind; "": no program.
  assert kinds["orderings"] == "" and kinds["means"] == "capture"
  c = _config()
  for s in registry.STAGES:
    group, field = s.batch_size.split(".")
    assert c[group][field] > 0, s.name


def _stages(*names):
  from papa_jax import registry  # pylint: disable=import-outside-toplevel
  return tuple(registry.BY_NAME[n] for n in names)


@pytest.mark.unit
def test_each_stage_gets_its_kind_and_batch():
  from papa_jax.stage import Stage  # pylint: disable=import-outside-toplevel
  params = 100 * 2**20
  got = {p.stage: p for p in memory_plan.plan(
      _config(), MINILM, params, 2, _stages("means", "orderings", "sort", "patching", "probe"))}
  assert set(got) == {"means", "sort", "patching", "probe"}  # orderings runs no program.
  entropy = Stage(name="entropy", run=lambda setup: None)  # The docs' recipe, no kind given.
  added = memory_plan.plan(_config(), MINILM, params, 2, (entropy,) + _stages("means"))
  assert [p.stage for p in added] == ["means"]  # Not declared: not planned.
  skipped = {p.stage for p in memory_plan.plan(
      _config(**{"papa.fractions": (0.0, 1.0)}), MINILM, params, 2, _stages("sort", "optimal"))}
  assert not skipped  # No partial head set to rank, no fitted constants: neither runs.
  fitted = memory_plan.plan(_config(**{"papa.variants": ("raw", "optimal")}), MINILM, params,
                            2, _stages("optimal"))
  assert [p.kind for p in fitted] == ["through"]
  assert (got["means"].kind, got["means"].batch) == ("capture", 16)  # run.batch_size / 2
  assert (got["sort"].kind, got["sort"].batch) == ("through", 8)  # probe.batch_size / 2
  assert (got["patching"].kind, got["patching"].batch) == ("through", 16)
  assert got["sort"].total > got["probe"].total > params
  bf16 = memory_plan.program("forward", MINILM.replace(compute_dtype="bfloat16"), params, 8,
                             128)
  f32 = memory_plan.program("forward", MINILM, params, 8, 128)
  assert bf16.total - f32.total == params // 2  # The weights' bfloat16 copies.


@pytest.mark.unit
def test_a_plan_over_the_limit_is_refused_naming_stage_number_and_knob():
  params = {"w": __import__("numpy").zeros((1024, 1024), "float32")}
  c = _config(**{"run.device_memory_gb": 0.05})
  with pytest.raises(ConfigError) as e:
    memory_plan.check(c, MINILM, params, 1, _stages("means", "sort"))
  msg = str(e.value)
  assert msg.startswith("The sort stage needs about ") and "GiB per device" in msg
  assert "16 examples x 128 tokens per device" in msg and "over 0.05 GiB" in msg
  assert "probe.batch_size" in msg and "run.device_memory_gb=0.05" in msg
  assert memory_plan.check(_config(**{"run.device_memory_gb": 64.0}), MINILM, params, 1,
                           _stages("means", "sort"))
  assert memory_plan.device_limit(_config(**{"run.device_memory_gb": -1.0}))[0] is None
  assert memory_plan.device_limit(_config())[0] is None  # CPU reports no limit.


@pytest.mark.integration
def test_the_launcher_refuses_before_any_work(tmp_path):
  """A run over its device memory stops before reading data or writing results."""
  testing.require_model("splade_tiny")
  c = tiny_config(tmp_path, **{"model.name": "splade_tiny", "run.device_memory_gb": 0.001,
                               "stage": "probe"})
  wd = tmp_path / "wd"
  with pytest.raises(ConfigError, match=r"The (sort|optimal|means|probe) stage needs about"):
    run.run(c, str(wd))
  assert not any(os.path.exists(wd / d) for d in ("means", "sort", "probe", "config.json"))
