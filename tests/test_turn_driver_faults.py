"""Failures inside the turn's driver itself (SPEC S15, S13): an observer of the turn's
transitions — the journal writer, the demo's printer — that raises (a full disk, a closed
pipe) is an unexpected exception like any other. The turn ends Done/error in one terminal
state, the text already delivered is kept, and the pass it interrupted stays in the turn's
record."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fsm.engine.turn import Turn
from fsm.scenarios.scripted import InMemoryChannel

from engine_support import scripted_turn

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

STREAM = {"passes": [[{"at": 1, "text": "Hello"}, {"at": 2, "text": " there"},
                      {"at": 3, "end": "completed"}]]}


class FailingJournal:
    """Raises from the transition named `from_event` on; with `once`, only there."""

    def __init__(self, from_event: str, *, once: bool) -> None:
        self.from_event, self.once = from_event, once
        self.seen: list[str] = []

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        self.seen.append(event)
        if event == self.from_event or (not self.once and self.from_event in self.seen):
            raise OSError("journal: no space left on device")


@pytest.mark.parametrize("once", [True, False], ids=["fails-once", "fails-from-then-on"])
async def test_a_failing_journal_mid_stream_ends_the_turn_with_its_pass_recorded(
        once: bool) -> None:
    # covers S15, S13: the journal fails as the first token lands; the turn ends Done/error
    # at that instant, naming the failure, the delivered "Hello" is kept and nothing after it
    # is sent, and the interrupted pass is in the record with its status and text
    turn = scripted_turn(STREAM, observer=FailingJournal("first_token", once=once))
    channel = turn.channel
    assert isinstance(channel, InMemoryChannel)
    result = await turn.run()
    assert (result.status, result.state) == ("error", "Done")
    assert result.error == "OSError: journal: no space left on device"
    assert channel.text == result.delivered_text == "Hello"
    assert [(p.status, p.text) for p in result.passes] == [("error", "Hello")]
    assert [(t["event"], t["to"], t["t"]) for t in turn.transitions][-2:] == [
        ("first_token", "Streaming", 1.0), ("crash", "Done", 1.0)]
    assert turn.lock.turn_kill is None


async def test_a_failing_journal_as_the_stream_times_out_ends_the_turn_from_settling() -> None:
    # covers S15, S10, S13: the journal fails on the timeout's transition into Settling;
    # the crash edge from Settling ends the turn Done/error at that instant, with the
    # timed-out pass recorded and its delivered text kept
    turn = scripted_turn({"config": {"idle_timeout_s": 10},
                          "passes": [[{"at": 1, "text": "Hello"},
                                      {"at": 1, "stall": True, "settles_after": 2}]]},
                         observer=FailingJournal("idle_timeout", once=True))
    channel = turn.channel
    assert isinstance(channel, InMemoryChannel)
    result = await turn.run()
    assert (result.status, result.state, channel.text) == ("error", "Done", "Hello")
    assert [(p.status, p.text) for p in result.passes] == [("error", "Hello")]
    assert [(t["event"], t["from"], t["to"], t["t"]) for t in turn.transitions][-2:] == [
        ("idle_timeout", "Streaming", "Settling", 11.0), ("crash", "Settling", "Done", 11.0)]


class FailingFirstToken(Turn):
    """A driver whose first-token callback fails after the state has moved (a bug in a
    callback, injected)."""

    def on_first_token(self, payload: Any = None) -> None:
        raise RuntimeError("callback bug")


async def test_a_failing_callback_keeps_its_transition_in_the_journal() -> None:
    # covers S15, S13: a callback that fails after its transition moved the state: the
    # journal keeps that transition at its time into the turn (a turn that began 100 s into
    # the loop's life), then the crash; the failure named is the callback's own
    await asyncio.sleep(100)
    turn = scripted_turn(STREAM, turn_class=FailingFirstToken)
    channel = turn.channel
    assert isinstance(channel, InMemoryChannel)
    result = await turn.run()
    assert (result.status, result.error) == ("error", "RuntimeError: callback bug")
    assert [(t["event"], t["to"], t["t"]) for t in turn.transitions] == [
        ("begin", "AwaitingFirstToken", 0.0), ("first_token", "Streaming", 1.0),
        ("crash", "Done", 1.0)]
    assert channel.text == "Hello"


class BrokenCrashEdge(Turn):
    """A driver whose machine cannot take the crash edge (the last resort's case)."""

    async def _fire(self, trigger: str, payload: Any = None, at: float | None = None) -> bool:
        if trigger == "crash":
            raise RuntimeError("the machine cannot move")
        return await super()._fire(trigger, payload, at)


async def test_a_turn_whose_crash_edge_fails_still_ends_in_one_terminal_state() -> None:
    # covers S15, S13: the failure and then the crash edge both fail: the turn is forced
    # Done with status error, journaled as a crash at once; the delivered text is kept
    turn = scripted_turn(STREAM, turn_class=BrokenCrashEdge,
                         observer=FailingJournal("first_token", once=True))
    channel = turn.channel
    assert isinstance(channel, InMemoryChannel)
    result = await turn.run()
    assert (result.status, result.state) == ("error", "Done")
    assert result.error == "OSError: journal: no space left on device"
    assert [(t["event"], t["from"], t["to"], t["t"]) for t in turn.transitions][-1] == (
        "crash", "Streaming", "Done", 1.0)
    assert channel.text == "Hello"
