"""The tier plugin (tests/tiers.py) in sessions of its own, with small bounds: it refuses a test
without exactly one tier, fails a unit test over its CPU bound or outside its tier, and fails
a whole unit tier over its budget."""

import pytest

from tests import tiers

pytestmark = pytest.mark.unit
pytest_plugins = ["pytester"]

BURN = '''
import time

def burn(seconds):
  start = time.process_time()
  while time.process_time() - start < seconds:
    pass
'''


@pytest.fixture
def session(pytester):
  """Runs a pytest session in this process with the tier plugin at a 0.3 s call bound, the
  given tier budget (in CPU-seconds from the session's start) and machine slowdown."""
  pytester.makeini("[pytest]\nmarkers =\n  unit: u\n  integration: i\n  slow: s\n")
  pytester.makepyfile(burn=BURN)

  def run(files: dict, *args, budget: float = 60.0, slowdown: float = 1.0):
    pytester.makeconftest(
        "from tests import tiers\n"
        "def pytest_configure(config):\n"
        "  config.pluginmanager.register(tiers.TierPlugin(\n"
        f"      0.3, {budget}, tiers.cpu_seconds(), lambda: {slowdown}), 'papa_tiers')\n"
        "import pytest\n"
        "@pytest.fixture\n"
        "def minilm():\n"
        "  return None\n")
    pytester.makepyfile(**files)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)
  return run


def test_tiers_refuse_a_test_without_exactly_one(session):
  result = session({"a_test": "import pytest\n\n"
                               "def test_none():\n  pass\n\n"
                               "@pytest.mark.unit\n@pytest.mark.slow\ndef test_two():\n  pass\n\n"
                               "@pytest.mark.integration\ndef test_one():\n  pass\n"})
  assert result.ret == pytest.ExitCode.USAGE_ERROR
  err = result.errlines
  assert any("a_test.py::test_none (a_test.py:3): no tier marker" in line for line in err), err
  assert any("a_test.py::test_two (a_test.py:6): 2 tier markers" in line for line in err), err
  assert not any("test_one" in line for line in err)


def test_tiers_fail_a_unit_call_over_its_bound_naming_it(session):
  result = session({"a_test": "import pytest\nfrom burn import burn\n\n"
                               "@pytest.mark.unit\ndef test_slow_unit():\n  burn(0.6)\n\n"
                               "@pytest.mark.integration\ndef test_slow_integration():\n"
                               "  burn(0.6)\n\n"
                               "@pytest.mark.unit\ndef test_quick_unit():\n  pass\n"})
  result.assert_outcomes(passed=2, failed=1)
  result.stdout.fnmatch_lines(["*a_test.py::test_slow_unit: this unit test's call used 0.* "
                               "CPU-seconds of its own, over the bound of 0.3 x 1.00*"])
  result.stdout.fnmatch_lines(["unit *2 tests *CPU-min*", "integration *1 tests *CPU-min*"])


def test_tiers_scale_the_call_bound_by_the_machines_slowdown(session):
  """On a machine three times slower than the reference a 0.6 s call is within 0.3 s x 3;
  one of 1.2 s is not."""
  result = session({"a_test": "import pytest\nfrom burn import burn\n\n"
                               "@pytest.mark.unit\ndef test_within():\n  burn(0.6)\n\n"
                               "@pytest.mark.unit\ndef test_over():\n  burn(1.2)\n"},
                   slowdown=3.0)
  result.assert_outcomes(passed=1, failed=1)
  result.stdout.fnmatch_lines(["*a_test.py::test_over: this unit test's call used 1.* "
                               "CPU-seconds of its own, over the bound of 0.3 x 3.00*"])


def test_tiers_slowdown_is_measured_once_and_clamped(monkeypatch):
  """The reference workload compiles (it is not free) and its ratio stays in [1, 4]."""
  assert tiers.reference_workload() > 0.05
  for took, want in ((0.1, 1.0), (tiers.REFERENCE_S * 2, 2.0), (100.0, tiers.MAX_SLOWDOWN)):
    monkeypatch.setattr(tiers, "_slowdown", [])
    monkeypatch.setattr(tiers, "reference_workload", lambda t=took: t)
    assert tiers.slowdown() == pytest.approx(want)
    monkeypatch.setattr(tiers, "reference_workload", lambda: 1 / 0)
    assert tiers.slowdown() == pytest.approx(want)  # Measured once.


def test_tiers_do_not_count_a_sleep_shared_work_or_fixtures_against_the_call(session):
  """CPU time, not wall time: a test that sleeps uses none. Work done for the session
  (`tiers.shared_work`) and fixtures count in the tier's total, not against the call."""
  result = session({"a_test": "import time, pytest\nfrom burn import burn\n"
                               "from tests import tiers\n"
                               "@pytest.fixture\ndef heavy():\n  burn(0.6)\n\n"
                               "@pytest.mark.unit\ndef test_sleeps():\n  time.sleep(0.6)\n\n"
                               "@pytest.mark.unit\ndef test_builds_for_all():\n"
                               "  with tiers.shared_work():\n    burn(0.6)\n\n"
                               "@pytest.mark.unit\ndef test_fixture(heavy):\n  pass\n"})
  result.assert_outcomes(passed=3)


def test_tiers_keep_subprocesses_and_real_checkpoints_out_of_unit(session):
  result = session({"a_test": "import subprocess, sys, pytest\n\n"
                               "@pytest.mark.unit\ndef test_spawns():\n"
                               "  subprocess.run([sys.executable, '-c', 'pass'])\n\n"
                               "@pytest.mark.unit\ndef test_real(minilm):\n  pass\n\n"
                               "@pytest.mark.integration\ndef test_real_ok(minilm):\n  pass\n"})
  result.assert_outcomes(passed=1, failed=1, errors=1)
  result.stdout.fnmatch_lines(["*test_spawns: a unit test started a subprocess*"])
  result.stdout.fnmatch_lines(["*test_real: a unit test uses the real checkpoint fixture "
                               "'minilm'*"])


def test_tiers_hold_the_whole_unit_tier_to_its_budget(session):
  files = {"a_test": "import pytest\nfrom burn import burn\n\n"
                     "@pytest.mark.unit\ndef test_a():\n  burn(0.25)\n\n"
                     "@pytest.mark.unit\ndef test_b():\n  burn(0.25)\n\n"
                     "@pytest.mark.slow\ndef test_c():\n  pass\n"}
  result = session(files, "-m", "unit", budget=0.3)
  assert result.ret == pytest.ExitCode.TESTS_FAILED
  result.assert_outcomes(passed=2, deselected=1)
  result.stdout.fnmatch_lines(["FAILED: the unit tier used * CPU-seconds, over its budget of "
                               "0.3 (tests/tiers.py)"])
  assert session(files, "-m", "unit", budget=60).ret == pytest.ExitCode.OK
  # Only the whole tier is held: a part of it, or a session with other tiers, is not.
  assert session(files, "-m", "unit", "-k", "test_a", budget=0.3).ret == pytest.ExitCode.OK
  assert session(files, budget=0.3).ret == pytest.ExitCode.OK


def test_tiers_of_the_repository_are_the_three_markers():
  assert tiers.TIERS == ("unit", "integration", "slow")
