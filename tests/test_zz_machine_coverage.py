"""The declared table is the machine: every edge it declares is taken by some test, and the
runtime machine has exactly the table's states and edges. This module runs last (in one
process; under parallel workers the edge check runs on the controller, tests/edge_coverage.py)."""

from __future__ import annotations

import pytest

from fsm.engine.table import STATES, TABLE, TERMINAL, TRIGGERS
from fsm.engine.turn import Turn, shared_machine

from edge_coverage import ENGINE_FILES, SKIP_REASON, failure_text, missing_edges
from engine_support import TAKEN_EDGES


def test_runtime_machine_is_built_from_the_table() -> None:
    # covers the "one table" rule: states, triggers and callbacks all come from TABLE
    machine = shared_machine()
    assert list(machine.states) == [s.value for s in STATES]
    assert set(machine.events) == set(TRIGGERS)
    for edge in TABLE:
        assert callable(getattr(Turn, edge.callback)), edge.callback
        for guard in edge.guards:
            assert callable(getattr(Turn, guard)), guard
        assert not any(src in TERMINAL for src in edge.sources)


def test_every_declared_edge_is_taken_by_some_test(request: pytest.FixtureRequest) -> None:
    # covers S1-S17, T1-T8, R1-R11 as a whole: an untested edge fails the build. Under
    # parallel workers the controller runs this check over every worker's edges instead
    # (tests/edge_coverage.py), under this test's id.
    session_files = {item.path.name for item in request.session.items}
    if not session_files >= ENGINE_FILES:
        pytest.skip(SKIP_REASON)
    missing = missing_edges(TAKEN_EDGES)
    assert not missing, failure_text(missing)
