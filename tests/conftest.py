"""Session-wide fixtures and hooks: Hypothesis profiles, the `slow` tier, per-test time
budgets, and the record of every edge any turn takes (checked by
tests/test_zz_machine_coverage.py, across parallel workers by `edge_coverage`)."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator

import pytest
from hypothesis import Phase, settings

from fsm.engine import turn as turn_module
from fsm.engine.result import TurnResult

import edge_coverage
from engine_support import TAKEN_EDGES

# Property tests in the default run check the same cases every time (derandomized, no example
# database), so CI never fails on a lucky draw; `RELIABILITY_PROFILE=nightly` draws fresh
# random cases and keeps failures in `.hypothesis/` to replay them first (RELIABILITY.md).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("nightly", print_blob=True)
# The mutation tier (scripts/mutation.sh) needs only whether a case fails, not the smallest
# failing case: shrinking each killed mutant's example would cost most of its run.
settings.register_profile("mutation", parent=settings.get_profile("ci"),
                          phases=[Phase.explicit, Phase.reuse, Phase.generate])
PROFILE = os.environ.get("RELIABILITY_PROFILE", "ci")
NIGHTLY = PROFILE == "nightly"
settings.load_profile(PROFILE if PROFILE in ("nightly", "mutation") else "ci")

SLOW_FILES = ("test_reliability_*.py", "test_bench_*.py", "test_redis_processes.py",
              "test_redis_bench_smoke.py", "test_review_page.py", "test_operator_signals.py",
              "test_edge_coverage_workers.py", "test_zz_machine_coverage.py",
              "test_llama_server.py")
"""The `slow` tier: generated and fuzzed turns, benchmarks' smoke runs, several processes, a
browser, the edge check that needs them all. Part of the default run; `-m "not slow"` leaves
them out for the edit-test loop (CONTRIBUTING.md)."""
LONGER_BUDGETS_S = {"test_llama_server.py": 600.0}
"""Per-test time budgets beyond the suite's `timeout` (pyproject.toml): a real llama.cpp
server loads its models in a fixture."""
NIGHTLY_FACTOR = 20
"""The nightly profile draws twenty times the cases (reliability_support.reliability_settings),
so its tests get twenty times the budget."""


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(edge_coverage, "edge-coverage")


@pytest.hookimpl(tryfirst=True)  # before -m chooses by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    default = float(config.getini("timeout") or 0)
    for item in items:
        name = item.path.name
        if any(fnmatch.fnmatch(name, pattern) for pattern in SLOW_FILES):
            item.add_marker(pytest.mark.slow)
        budget = LONGER_BUDGETS_S.get(name, default)
        if NIGHTLY:
            budget *= NIGHTLY_FACTOR
        if default and budget != default and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(budget))


@pytest.fixture(autouse=True, scope="session")
def _record_taken_edges() -> Iterator[None]:
    """Every edge any turn takes during the session is noted for the coverage test."""
    original = turn_module.Turn.run

    async def recording_run(self: turn_module.Turn) -> TurnResult:
        try:
            return await original(self)
        finally:
            TAKEN_EDGES.update((t["event"], t["from"], t["to"]) for t in self.transitions)
            TAKEN_EDGES.update((t["event"], t["state"], t["state"])
                               for t in self.internal_transitions)

    turn_module.Turn.run = recording_run  # type: ignore[method-assign]
    yield
    turn_module.Turn.run = original  # type: ignore[method-assign]
