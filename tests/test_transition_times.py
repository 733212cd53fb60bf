"""When the journal says each transition happened (SPEC "States and what moves between them":
every transition is recorded so the turn can be replayed; S5, S10): at the instant its input
arrived or its deadline passed, to the microsecond, for inputs between whole seconds too.
All in virtual time."""

from __future__ import annotations

import pytest

from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def test_transitions_happen_when_their_inputs_arrive_between_whole_seconds() -> None:
    # covers "States and what moves between them": the first chunk at 0.5 s and the end at
    # 1.25 s are journaled at exactly those instants
    played = await play(parse_scenario({"passes": [[{"at": 0.5, "text": "Hi"},
                                                    {"at": 1.25, "end": "completed"}]]}))
    assert [(line["event"], line["t"]) for line in played.transitions] == [
        ("begin", 0.0), ("first_token", 0.5), ("completed", 1.25)]


async def test_timers_fire_at_their_deadline_to_the_microsecond() -> None:
    # covers S5, S10: a chunk at 0.25 s arms the 10 s idle timer; the timeout is journaled at
    # 10.25 s and the settle wait's end 2.5 s later
    played = await play(parse_scenario({
        "config": {"idle_timeout_s": 10, "settle_timeout_s": 2.5},
        "passes": [[{"at": 0.25, "text": "Hi"}, {"at": 0.25, "stall": True,
                                                 "settles_after": 100}]]}))
    assert [(line["event"], line["t"]) for line in played.transitions] == [
        ("begin", 0.0), ("first_token", 0.25), ("idle_timeout", 10.25),
        ("settle_timeout", 12.75)]
