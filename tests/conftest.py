"""Session-wide fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine_support import TAKEN_EDGES

from fsm import turn as turn_module


@pytest.fixture(autouse=True, scope="session")
def _record_taken_edges() -> Iterator[None]:
    """Every transition any turn takes during the session is noted for the coverage test."""
    original = turn_module.Turn._record

    def recording(self: turn_module.Turn, t: float, trigger: str, source: str,
                  dest: str) -> None:
        TAKEN_EDGES.add((trigger, source, dest))
        original(self, t, trigger, source, dest)

    turn_module.Turn._record = recording  # type: ignore[method-assign]
    yield
    turn_module.Turn._record = original  # type: ignore[method-assign]


