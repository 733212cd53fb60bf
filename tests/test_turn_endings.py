"""How a turn's ending reads in its result, journal and review page (SPEC S10, S15, T2,
T10): the error a crash or a nameless call leaves, each pass's status, and what text a
stream that never settles keeps out of the reply."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fsm.engine.channel import Notice
from fsm.engine.config import TurnConfig
from fsm.engine.ledger import TurnLedger
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.provider import AbortSignal, PassRequest, ProviderEvent, TextDelta
from fsm.engine.tools import ToolRegistry
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play
from fsm.scenarios.scripted import InMemoryChannel

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def test_a_provider_that_raises_ends_the_turn_with_the_exception_named() -> None:
    # covers S15: the error the review page shows names the exception and its message
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "text": "Hi"}, {"at": 2, "raise": "socket gone",
                                              "error_type": "ConnectionResetError"}]]}))
    assert played.result.status == "error"
    assert played.result.error == "ConnectionResetError: socket gone"


async def test_a_call_without_a_tool_name_ends_the_turn_saying_so() -> None:
    # covers T2: the error names what the provider did wrong
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "tool_call": {"name": ""}}]]}))
    assert played.result.status == "error"
    assert played.result.error == "the provider returned a function call without a tool name"


async def test_an_empty_pass_after_a_tool_completes_and_is_recorded_as_empty() -> None:
    # covers T10: the turn completes with the text delivered before the tool; the pass that
    # said nothing is recorded as an empty response
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "text": "Saved. "}, {"at": 2, "tool_call": {"name": "t"}}],
                   [{"at": 1, "end": "empty"}]],
        "tools": {"t": [{"success": True, "data": {}}]}}))
    assert played.result.status == "completed" and played.result.text == "Saved. "
    assert [p.status for p in played.result.passes] == ["function_call", "empty_response"]


class LandsThenHangs:
    """A stream that sends "Hello", goes silent, and after its abort sends " late" but
    never finishes (the abandoned call does not settle)."""

    name = "lands-then-hangs"

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        return self._events(abort)

    async def _events(self, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        yield TextDelta("Hello")
        await abort.wait()
        await asyncio.sleep(1)
        yield TextDelta(" late")
        await asyncio.sleep(3600)


async def test_text_landing_in_a_settle_wait_that_never_ends_is_not_in_the_reply() -> None:
    # covers S10: the stream timed out and did not settle within the wait; what it sent
    # meanwhile is not part of the reply's text (nor of a fallback's continuation)
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "t")
    assert lock is not None
    turn = Turn(provider=LandsThenHangs(), channel=InMemoryChannel(), locks=locks, lock=lock,
                tools=ToolRegistry(), config=TurnConfig())
    result = await turn.run()
    assert result.status == "timeout"
    assert result.text == "Hello" and result.passes[0].text == "Hello"


async def test_a_busy_channel_allows_as_many_follow_up_interrupts_as_its_cap() -> None:
    # covers S17: each interrupt counts one against the cap carried along the queue; with a
    # cap of two the third queued turn is not interrupted and completes
    from fsm.scenarios.scripted import ScriptedProvider

    locks = ChannelLockRegistry(max_follow_up_interrupts=2)
    statuses = []
    for number in range(3):
        lock = locks.try_acquire("c", f"turn {number}")
        assert lock is not None
        scenario = parse_scenario({"passes": [[{"at": 1, "text": "thinking"},
                                               {"at": 10, "end": "completed"}]]})
        turn = Turn(provider=ScriptedProvider(scenario.passes), channel=InMemoryChannel(),
                    locks=locks, lock=lock, tools=ToolRegistry())
        task = asyncio.create_task(turn.run())
        await asyncio.sleep(3)
        turn.notify_follow_up()
        statuses.append((await task).status)
        locks.carry_follow_up_interrupts(lock, queued_next=True)
        locks.release(lock)
    assert statuses == ["follow_up_interrupt", "follow_up_interrupt", "completed"]


async def test_a_turn_killed_before_it_began_delivers_and_reports_no_text() -> None:
    # covers S16 (a kill in Preparing): the review page shows a stopped turn with no text
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "t")
    assert lock is not None
    locks.request_stop("c")
    channel = InMemoryChannel()
    turn = Turn(provider=LandsThenHangs(), channel=channel, locks=locks, lock=lock,
                tools=ToolRegistry())
    result = await turn.run()
    assert result.status == "stopped_by_user"
    assert result.text == "" and result.passes == [] and result.delivered_text == ""


async def test_the_result_keeps_each_passes_reasoning_as_the_thought_log() -> None:
    # covers T8: the review page's thought log, one entry per pass that reasoned
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "reasoning": "check the weather"},
                    {"at": 2, "tool_call": {"name": "t"}}],
                   [{"at": 1, "text": "Sunny."}, {"at": 2, "end": "completed"}]],
        "tools": {"t": [{"success": True, "data": {}}]}}))
    assert played.result.thoughts == {"owner": "assistant", "log": ["check the weather"]}
    assert played.result.as_dict()["thoughts"]["log"] == ["check the weather"]


class RefusesFirstNotice(InMemoryChannel):
    """A channel where Discord refuses the first notice posted."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    async def post_notice(self, notice: Notice) -> None:
        if not self.refused:
            self.refused += 1
            raise ConnectionError("discord said no")
        await super().post_notice(notice)


async def test_a_notice_discord_refuses_does_not_hold_back_the_next() -> None:
    # covers G2, T1: the refused notice is not counted as seen; the next is still posted
    ledger = TurnLedger()
    ledger.outbox.extend([Notice.of("still_working"), Notice.of("max_iterations")])
    channel = RefusesFirstNotice()
    await ledger.post_notices(channel, "t")
    assert ledger.notices == ["max_iterations"] and ledger.outbox == []
