"""Session-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fsm.engine import turn as turn_module
from fsm.engine.result import TurnResult

from engine_support import TAKEN_EDGES


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
