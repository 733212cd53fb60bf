"""A stop asked for at an instant something else happens (SPEC S7, S16): a kill at the very
microsecond the stream finishes still ends the turn Stopped, and a stop asked for before a
turn that starts late on the loop's clock is honoured with no latency. All in virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fsm.engine.turn import Turn
from fsm.telemetry.follow import TurnFollower
from fsm.telemetry.metrics import TurnMetrics

from reliability_support import build_turn, finish

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

# One pass whose first chunk and end arrive in the same instant, one second in.
SAME_INSTANT: dict[str, Any] = {"passes": [[{"at": 1, "text": "Hi"},
                                            {"at": 1, "end": "completed"}]]}


class StopOnEntering:
    """The user's /kill the moment the turn enters `state` (as the reply starts to show)."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.stopped = False

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        if dest == self.state and not self.stopped:
            self.stopped = True
            turn.request_stop()


async def test_a_kill_at_the_instant_the_stream_ends_stops_the_turn() -> None:
    # covers S7, S16: the stream's end reaches the driver in the same microsecond as the
    # user's kill (the kill asked for as the reply started): the stop is honoured, the turn
    # ends Stopped at that instant with the text already delivered, not Done as completed
    turn = build_turn(SAME_INSTANT, observer=StopOnEntering("Streaming"))
    result = await finish(turn)
    assert result.status == "stopped_by_user" and turn.state == "Stopped"
    assert [(line["event"], line["t"]) for line in turn.transitions] == [
        ("begin", 0.0), ("first_token", 1.0), ("kill", 1.0)]
    assert result.delivered_text == "Hi"


async def test_a_stop_before_a_late_starting_turn_has_no_kill_latency() -> None:
    # covers S16: a turn stopped before it runs, on a loop whose clock is already 30 s on,
    # reaches Stopped as it starts; the operator's kill-latency metric records 0 s
    await asyncio.sleep(30)
    metrics = TurnMetrics()
    turn = build_turn(SAME_INSTANT, observer=TurnFollower(metrics))
    turn.request_stop()
    result = await finish(turn)
    assert result.status == "stopped_by_user"
    assert [(line["event"], line["t"]) for line in turn.transitions] == [("kill", 0.0)]
    registry = metrics.registry
    assert registry.get_sample_value("turn_engine_kill_latency_seconds_count") == 1
    assert registry.get_sample_value("turn_engine_kill_latency_seconds_sum") == 0.0
