"""Session-wide fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from fsm.engine import turn as turn_module
from fsm.engine.result import TurnResult

from engine_support import TAKEN_EDGES

# Property tests in the default run check the same cases every time (derandomized, no example
# database), so CI never fails on a lucky draw; `RELIABILITY_PROFILE=nightly` draws fresh
# random cases and keeps failures in `.hypothesis/` to replay them first (RELIABILITY.md).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("nightly", print_blob=True)
settings.load_profile("nightly" if os.environ.get("RELIABILITY_PROFILE") == "nightly" else "ci")


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
