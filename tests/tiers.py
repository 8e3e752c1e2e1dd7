"""Test tiers and the CPU budget of the `unit` tier (a pytest plugin, registered in conftest.py).

Every test has exactly one tier marker, on the test, its class or its module's `pytestmark`
(pytest.ini describes the three); collection stops naming each test with none or several.
A `unit` test may not start a subprocess or use a real checkpoint (the `minilm` fixture,
`testing.require_model`): it fails saying so. CPU time is user + system of the pytest
process and its waited-for children (`resource.getrusage`), so load does not change it:
- a unit test's call (its body, fixtures apart) may use `UNIT_CALL_CPU_S` CPU-seconds;
- `pytest -m unit` (every unit test, nothing else) may use `UNIT_TIER_CPU_S` in all, start-up,
  collection and shared fixtures included.
Each phase's CPU and wall time travel in the test report (so pytest-xdist workers' times reach
the summary); the summary prints them per tier, and `PAPA_TEST_TIMES=file.json` writes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import time

import psutil
import pytest

TIERS = ("unit", "integration", "slow")
# The bounds (CPU-seconds). On the 2-core Xeon of docs/performance.md the slowest unit call
# takes about 7 s (the first test to compile a family's ops) and the tier about 3 CPU-min.
# The call bound is in that machine's seconds: where `reference_workload` takes longer than
# its REFERENCE_S there (slower machines, the same machine in a slower spell, up to twice as
# slow here), a call may use that ratio more (at most MAX_SLOWDOWN times). The tier budget
# stays absolute.
UNIT_CALL_CPU_S = 10.0
UNIT_TIER_CPU_S = 300.0
REFERENCE_S = 1.2
MAX_SLOWDOWN = 4.0
# Fixtures that load a real checkpoint (tests/conftest.py).
REAL_CHECKPOINT_FIXTURES = ("minilm", "minilm_tokenizer")
_KEY = "papa_tier_times"

_current: list[pytest.Item] = []


def cpu_seconds() -> float:
  """User + system CPU seconds of this process and of its waited-for children."""
  own = resource.getrusage(resource.RUSAGE_SELF)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def reference_workload() -> float:
  """CPU seconds this machine takes to compile and run six small jitted programs (the
  compile-bound work of a unit test), the persistent compile cache off."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  cached = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    jnp.zeros(1).block_until_ready()
    start = cpu_seconds()
    for n in range(3, 9):
      f = jax.jit(lambda x, w: jax.nn.softmax(jnp.tanh(x @ w) @ w.T, -1).sum(0))
      f(jnp.ones((n, 16)), jnp.ones((16, 16))).block_until_ready()
    return cpu_seconds() - start
  finally:
    jax.config.update("jax_enable_compilation_cache", cached)


def slowdown() -> float:
  """This machine's slowness against the reference (1 to MAX_SLOWDOWN), measured once."""
  if not _slowdown:
    _slowdown.append(min(MAX_SLOWDOWN, max(1.0, reference_workload() / REFERENCE_S)))
  return _slowdown[0]


_slowdown: list[float] = []


def _markers(item: pytest.Item) -> list[str]:
  return [m.name for m in item.iter_markers() if m.name in TIERS]


def tier_of(item: pytest.Item) -> str:
  """The item's tier (collection has refused items without exactly one)."""
  return _markers(item)[0]


def current_tier() -> str | None:
  """The tier of the test now running in this process, if any."""
  return tier_of(_current[-1]) if _current else None


@contextlib.contextmanager
def shared_work():
  """Work a test does for the whole session (a shared model built on first use, its first
  compiles): counted in its tier's time, not against the test's own call bound."""
  start = cpu_seconds()
  try:
    yield
  finally:
    if _current:
      item = _current[-1]
      item.stash[_SHARED] = item.stash.get(_SHARED, 0.0) + cpu_seconds() - start


def refuse_in_unit(what: str) -> None:
  """Fails the running test if it is a unit test: `what` belongs to another tier."""
  if current_tier() == "unit":
    pytest.fail(f"{_current[-1].nodeid}: a unit test {what}; mark it integration (or slow) "
                "or give it a tiny random model (tests/tiers.py)", pytrace=False)


class _NoSubprocess:
  """Within a unit test, starting a process fails naming the test."""

  def __enter__(self):
    self.real = subprocess.Popen._execute_child  # pylint: disable=protected-access

    def refuse(popen, args, *rest, **kwargs):
      refuse_in_unit(f"started a subprocess ({args!r:.120})")
      return self.real(popen, args, *rest, **kwargs)
    subprocess.Popen._execute_child = refuse  # pylint: disable=protected-access
    return self

  def __exit__(self, *exc):
    subprocess.Popen._execute_child = self.real  # pylint: disable=protected-access


class TierPlugin:
  """Refuses untiered tests, times each phase, holds the unit budget, reports per tier."""

  def __init__(self, call_bound: float = UNIT_CALL_CPU_S, tier_budget: float = UNIT_TIER_CPU_S,
               since: float = 0.0, slowdown_fn=slowdown):
    """`since`: the CPU seconds the session's total starts from (0: the process's start);
    `slowdown_fn`: this machine's slowness against the reference (measured on first need)."""
    self.call_bound, self.tier_budget, self.since = call_bound, tier_budget, since
    self.slowdown = slowdown_fn
    self.times: dict[str, dict] = {}
    self.selected: dict[str, int] = {}
    self.collected_unit = 0
    self.over_budget: float | None = None
    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    self.cache = (cache, len(os.listdir(cache)) if cache and os.path.isdir(cache) else 0)

  @pytest.hookimpl(tryfirst=True)
  def pytest_collection_modifyitems(self, items):
    bad = []
    for item in items:
      n = len(_markers(item))
      if n != 1:
        path, line, _ = item.location
        bad.append(f"  {item.nodeid} ({path}:{(line or 0) + 1}): "
                   + ("no tier marker" if n == 0 else f"{n} tier markers"))
    if bad:
      raise pytest.UsageError(
          "every test needs exactly one tier marker, pytest.mark.unit, .integration or .slow, "
          "on the test, its class or the module's pytestmark (see pytest.ini):\n"
          + "\n".join(bad))
    self.collected_unit = sum(1 for item in items if tier_of(item) == "unit")

  @pytest.hookimpl(trylast=True)
  def pytest_collection_finish(self, session):
    for item in session.items:
      if len(_markers(item)) == 1:  # Collection refuses the others.
        tier = tier_of(item)
        self.selected[tier] = self.selected.get(tier, 0) + 1

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(self, item):
    _current.append(item)
    try:
      yield
    finally:
      _current.pop()

  def _phase(self, item):
    item.stash[_START] = (cpu_seconds(), time.monotonic())
    item.stash[_SHARED] = 0.0
    if tier_of(item) != "unit":
      return None
    used = [f for f in REAL_CHECKPOINT_FIXTURES if f in item.fixturenames]
    if used:
      refuse_in_unit(f"uses the real checkpoint fixture {used[0]!r}")
    return _NoSubprocess()

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_setup(self, item):
    guard = self._phase(item)
    if guard is None:
      yield
      return
    with guard:
      yield

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_call(self, item):
    guard = self._phase(item)
    if guard is None:
      yield
      return
    with guard:
      yield

  @pytest.hookimpl(tryfirst=True)
  def pytest_runtest_teardown(self, item):
    item.stash[_START] = (cpu_seconds(), time.monotonic())

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_makereport(self, item, call):
    outcome = yield
    report = outcome.get_result()
    start = item.stash.get(_START, None)
    if start is None:
      return
    cpu, wall = cpu_seconds() - start[0], time.monotonic() - start[1]
    tier = tier_of(item)
    report.user_properties.append((_KEY, dict(tier=tier, cpu=round(cpu, 3),
                                              wall=round(wall, 3))))
    own = cpu - item.stash.get(_SHARED, 0.0)
    if (call.when == "call" and report.passed and tier == "unit" and own > self.call_bound
        and own > self.call_bound * self.slowdown()):
      report.outcome = "failed"
      report.longrepr = (
          f"{item.nodeid}: this unit test's call used {own:.1f} CPU-seconds of its own, over "
          f"the bound of {self.call_bound:g} x {self.slowdown():.2f} (this machine's slowness "
          "against the reference, tests/tiers.py): make it cheaper, share its compiles "
          "through a session fixture, or mark it integration")

  def pytest_runtest_logreport(self, report):
    for key, value in report.user_properties:
      if key == _KEY:
        entry = self.times.setdefault(report.nodeid, {"tier": value["tier"]})
        entry[report.when] = {"cpu": value["cpu"], "wall": value["wall"]}

  def tier_totals(self) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    for entry in self.times.values():
      t = totals.setdefault(entry["tier"], {"cpu": 0.0, "wall": 0.0, "tests": 0})
      t["tests"] += 1
      for phase in ("setup", "call", "teardown"):
        if phase in entry:
          t["cpu"] += entry[phase]["cpu"]
          t["wall"] += entry[phase]["wall"]
    return totals

  def whole_unit_tier(self) -> bool:
    """Whether this session ran every unit test and nothing else."""
    return set(self.selected) == {"unit"} and self.selected["unit"] == self.collected_unit

  @pytest.hookimpl(trylast=True)
  def pytest_sessionfinish(self, session):
    path = os.environ.get("PAPA_TEST_TIMES")
    if path:
      with open(path, "w", encoding="utf-8") as f:
        json.dump(self.times, f, indent=1)
    total = cpu_seconds() - self.since  # From the process's start: imports included.
    if (self.whole_unit_tier() and total > self.tier_budget
        and session.exitstatus == pytest.ExitCode.OK and not _xdist_controller(session)):
      session.exitstatus = pytest.ExitCode.TESTS_FAILED
      self.over_budget = total

  def pytest_terminal_summary(self, terminalreporter):
    totals = self.tier_totals()
    if not totals:
      return
    tr = terminalreporter
    tr.section("tiers: CPU time (user + system, children included) and wall time")
    for tier in TIERS:
      if tier in totals:
        t = totals[tier]
        tr.write_line(f"{tier:12s} {int(t['tests']):4d} tests {t['cpu'] / 60:7.2f} CPU-min "
                      f"{t['wall'] / 60:7.2f} min (sum over its tests)")
    wall = time.time() - psutil.Process().create_time()
    tr.write_line(f"{'session':12s} {'':10s} {(cpu_seconds() - self.since) / 60:7.2f} CPU-min "
                  f"{wall / 60:7.2f} "
                  "min (this process, start-up and collection included)")
    if _slowdown:
      tr.write_line(f"unit call bound: {self.call_bound:g} CPU-s x {_slowdown[0]:.2f} (this "
                    "machine's slowness against the reference, measured when a call passed "
                    f"{self.call_bound:g})")
    tr.write_line(f"XLA_FLAGS: {os.environ.get('XLA_FLAGS', '')}")
    cache, entries = self.cache
    tr.write_line(f"JAX compile cache: {cache or 'off'}"
                  + (f" ({entries} programs at the start{': cold' if not entries else ''})"
                     if cache else ""))
    if self.over_budget is not None:
      tr.write_line(f"FAILED: the unit tier used {self.over_budget:.0f} CPU-seconds, over its "
                    f"budget of {self.tier_budget:g} (tests/tiers.py)", red=True)


def _xdist_controller(session) -> bool:
  """Under pytest-xdist the controller runs no test: its own CPU time says nothing."""
  return getattr(session.config.option, "numprocesses", None) not in (None, 0) and not hasattr(
      session.config, "workerinput")


_START = pytest.StashKey[tuple]()
_SHARED = pytest.StashKey[float]()
