"""What the turn's driver tells its workers and its journal, and when it lets go (SPEC S7,
S10, S14, S16, S17, T3, T5, D4): the reason an adapter's and a tool's abort carry, a pass's
stream released the moment the pass ends, a stop asked for twice, a follow-up's place in the
journal, the grace a worker that ignores cancellation gets, and an input landing at its
budget's last instant. All in virtual time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from fsm.engine.channel import Notice
from fsm.engine.config import TurnConfig
from fsm.engine.provider import (
    AbortSignal,
    Finish,
    PassRequest,
    ProviderEvent,
    TextDelta,
    ToolCallRequest,
)
from fsm.engine.tools import AnyArgs, FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.journal import JournalRecorder
from fsm.scenarios.scripted import InMemoryChannel

from engine_support import live_turn, scripted_turn

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

Script = Callable[[AbortSignal], AsyncIterator[ProviderEvent]]


class Passes:
    """One script per pass; notes each pass's abort signal and when it fired."""

    name = "passes"

    def __init__(self, *scripts: Script) -> None:
        self.scripts = list(scripts)
        self.aborts: list[AbortSignal] = []
        self.aborted_at: list[float] = []

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        self.aborts.append(abort)
        loop = asyncio.get_running_loop()
        abort.add_callback(lambda: self.aborted_at.append(loop.time()))
        return self.scripts.pop(0)(abort)


async def calls_tool(abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
    await asyncio.sleep(1)
    yield ToolCallRequest("lookup", {})
    yield Finish("tool_calls")


async def answers(abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
    await asyncio.sleep(1)
    yield TextDelta("Found it.")
    yield Finish("stop")


async def hangs(abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
    await asyncio.sleep(1)
    yield TextDelta("Thinking")
    await abort.wait()


def lookup_tool(seconds: float, aborts: list[AbortSignal] | None = None) -> ToolRegistry:
    async def run(args: AnyArgs, ctx: ToolContext) -> ToolResult:
        if aborts is not None:
            aborts.append(ctx.abort)
        await asyncio.sleep(seconds)
        return ToolResult.ok({"found": True})

    registry = ToolRegistry()
    registry.register(FunctionTool[AnyArgs]("lookup", "looks it up", AnyArgs, run))
    return registry


def _events(turn: Turn) -> list[tuple[str, str, float]]:
    return [(line["event"], line["to"], line["t"]) for line in turn.transitions]


async def test_a_kill_tells_the_stream_it_was_killed() -> None:
    # covers S7, S14: the adapter's abort says `kill`, so it can tell a user's stop from a
    # timeout or a pass that ended on its own
    provider = Passes(hangs)
    turn = live_turn(provider)
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(3)
    turn.request_stop()
    result = await task
    assert result.status == "stopped_by_user" and result.error is None
    assert [abort.reason for abort in provider.aborts] == ["kill"]
    assert provider.aborted_at == [3.0]


async def test_a_stale_lock_release_tells_the_stream_and_the_tool_why() -> None:
    # covers S6, S14, T5: the sweeper's release aborts the stream and a running tool with
    # `stale_lock`, not the user's `kill`, and the turn says why it stopped
    provider = Passes(hangs)
    turn = live_turn(provider)
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(3)
    assert turn.lock.turn_kill is not None
    turn.lock.turn_kill("stale_lock")
    result = await task
    assert result.status == "stopped_by_user"
    assert result.error == "the channel lock was released as stale"
    assert [abort.reason for abort in provider.aborts] == ["stale_lock"]

    tool_aborts: list[AbortSignal] = []
    turn = live_turn(Passes(calls_tool), tools=lookup_tool(100, tool_aborts))
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(3)
    assert turn.state == "ToolCall" and turn.lock.turn_kill is not None
    turn.lock.turn_kill("stale_lock")
    assert (await task).status == "stopped_by_user"
    assert [abort.reason for abort in tool_aborts] == ["stale_lock"]


async def test_a_pass_that_ends_with_a_tool_call_releases_its_stream_at_once() -> None:
    # covers S14, T5: the pass ends as its tool call does, so its stream is told `pass ended`
    # then, before the tool runs; a kill during the tool reaches the tool (`kill`), not the
    # finished stream, and the kill is the user's
    provider = Passes(calls_tool)
    tool_aborts: list[AbortSignal] = []
    turn = live_turn(provider, tools=lookup_tool(100, tool_aborts))
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(5)
    assert turn.state == "ToolCall"
    assert [abort.reason for abort in provider.aborts] == ["pass ended"]
    assert provider.aborted_at == [1.0]
    assert turn.lock.stream_kill is None
    turn.request_stop()
    result = await task
    assert result.status == "stopped_by_user" and result.error is None
    assert [abort.reason for abort in tool_aborts] == ["kill"]
    assert [abort.reason for abort in provider.aborts] == ["pass ended"]


async def test_a_stop_asked_for_twice_is_one_stop_the_first_asker_owns() -> None:
    # covers S7, S16: a user's /kill and the stale-lock sweeper at the same instant: the
    # turn stops once, as the user's stop, and its journal records one kill
    config = TurnConfig()
    recorder = JournalRecorder("double-stop", config, ToolRegistry())
    provider = Passes(hangs)
    turn = live_turn(provider, recorder=recorder)
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(3)
    turn.request_stop()
    turn.request_stop("stale_lock")
    result = await task
    assert result.status == "stopped_by_user" and result.error is None
    assert turn.stop_requested_at == 3.0
    assert recorder.events == [{"at": 3.0, "kill": True}]
    assert [abort.reason for abort in provider.aborts] == ["kill"]


async def test_a_follow_up_is_journaled_at_its_time_into_the_turn() -> None:
    # covers S17, T3: a follow-up arriving 2.5 s into a turn that began 100 s into the
    # loop's life is recorded at 2.5 s, as a follow-up, and stays queued for after the turn
    await asyncio.sleep(100)
    config = TurnConfig()
    recorder = JournalRecorder("follow-up", config, ToolRegistry())
    turn = live_turn(Passes(calls_tool, answers), tools=lookup_tool(5), recorder=recorder)
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(2.5)
    assert turn.state == "ToolCall"
    turn.notify_follow_up()
    result = await task
    assert result.status == "completed" and result.follow_up_queued
    assert recorder.events == [{"at": 2.5, "follow_up": True}]


@pytest.mark.parametrize(("settle_timeout_s", "grace_s"), [(0.0, 1.0), (3.0, 3.0)])
async def test_a_tool_that_ignores_its_cancellation_holds_the_turn_only_a_grace(
        settle_timeout_s: float, grace_s: float) -> None:
    # covers D4, S14, T5: after a kill the turn waits for a tool that ignores cancellation
    # the settle budget (1 s when that is 0), then lets go: the channel is free again
    finished: list[float] = []

    async def stubborn(args: AnyArgs, ctx: ToolContext) -> ToolResult:
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            await asyncio.sleep(30)  # cleaning up, deaf to the cancellation
            finished.append(asyncio.get_running_loop().time())
            raise
        return ToolResult.ok()

    registry = ToolRegistry()
    registry.register(FunctionTool[AnyArgs]("lookup", "looks it up", AnyArgs, stubborn))
    turn = live_turn(Passes(calls_tool), tools=registry, settle_timeout_s=settle_timeout_s)
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(3)
    turn.request_stop()
    result = await task
    assert result.status == "stopped_by_user" and _events(turn)[-1] == ("kill", "Stopped", 3.0)
    assert loop.time() == 3.0 + grace_s
    await asyncio.sleep(40)  # the abandoned tool ends its clean-up on its own
    assert finished == [33.0]


@pytest.mark.parametrize("follow_up_at", [None, 5.0])
async def test_a_tool_result_landing_at_its_budgets_last_instant_counts(
        follow_up_at: float | None) -> None:
    # covers T5: the tool budget includes its last instant: a tool that answers exactly
    # when its 20 s run out has answered — whether or not anything else happened meanwhile
    # (a follow-up makes the driver wait again) — and the model sees its result
    turn = live_turn(Passes(calls_tool, answers), tools=lookup_tool(20), tool_timeout_s=20)
    task = asyncio.create_task(turn.run())
    if follow_up_at is not None:
        await asyncio.sleep(follow_up_at)
        turn.notify_follow_up()
    result = await task
    assert result.status == "completed" and result.consecutive_tool_errors == 0
    assert ("tool_result", "Preparing", 21.0) in _events(turn)
    assert turn.channel.text == "Found it."  # type: ignore[attr-defined]


class SlowNotices(InMemoryChannel):
    """Posting a notice takes 5 s (a rate-limited channel)."""

    async def post_notice(self, notice: Notice) -> None:
        await asyncio.sleep(5)
        await super().post_notice(notice)


async def test_a_reply_cut_at_its_bound_releases_the_stream_before_the_notice_is_sent() -> None:
    # covers D5, S14: the reply reaches its delivery bound at 2 s; the model's stream is
    # released then, not once the (slow) delivery_cap notice has been posted 5 s later
    async def endless(abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        for _ in range(100):
            await asyncio.sleep(1)
            if abort.fired:
                return
            yield TextDelta("x" * 10)

    provider = Passes(endless)
    channel = SlowNotices()
    turn = live_turn(provider, channel, max_delivered_chars=15)
    result = await turn.run()
    assert result.status == "delivery_cap" and channel.text == "x" * 15
    assert _events(turn)[-1] == ("delivery_cap", "Done", 2.0)
    assert [notice.kind for notice in channel.notices] == ["delivery_cap"]
    assert provider.aborted_at == [2.0]
    assert [abort.reason for abort in provider.aborts] == ["pass ended"]


def _busy(seconds: float) -> None:
    """The loop is held by CPU work for `seconds`: its clock moves on while nothing else
    runs (looptime's clock set forward, as a busy machine's would be)."""
    loop: Any = asyncio.get_running_loop()
    loop.setup_looptime(start=loop.time() + seconds)


async def test_a_tool_answering_after_its_budget_on_a_busy_loop_has_timed_out() -> None:
    # covers T5: a tool holds the loop (CPU-bound work) from 15 s to 25 s of its 20 s
    # budget and answers as it lets go: the driver wakes to both its deadline and the
    # answer, and the deadline came first — a failed result for the model, as the journal
    # replays it
    async def hogs(args: AnyArgs, ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(14)
        _busy(10)
        return ToolResult.ok({"found": True})

    registry = ToolRegistry()
    registry.register(FunctionTool[AnyArgs]("lookup", "looks it up", AnyArgs, hogs))
    turn = live_turn(Passes(calls_tool, answers), tools=registry, tool_timeout_s=20)
    result = await turn.run()
    assert result.status == "completed"
    assert ("tool_timeout", "Preparing", 21.0) in _events(turn)
    assert ("tool_result", "Preparing", 25.0) not in _events(turn)
    assert turn.function_history[0].result["success"] is False


@pytest.mark.parametrize(("how", "ending", "delivered"), [
    ("ends", ("completed", "Done"), "Hello"),
    ("sends more", ("completed", "Done"), "Hello there"),
    ("calls a tool", ("tool_call", "ToolCall"), "Hello"),
    ("raises", ("settled", "TimedOut"), "Hello"),
    ("is cancelled", ("settled", "TimedOut"), "Hello")])
async def test_a_stream_outliving_its_idle_budget_on_a_held_loop(
        how: str, ending: tuple[str, str], delivered: str) -> None:
    # covers S5, S10, S15, D8: the loop is held (CPU work, a stalled process) from 2 s to
    # 16 s, past the idle budget of 10 s after the text at 1 s. A stream that was healthy
    # all along and finished meanwhile is not timed out by the bot's own stall: its end,
    # its late text and its tool call are taken at 16 s. A failure read after the deadline
    # is the stream's settling after the timeout, which came first (at 11 s)
    async def outlives(abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        await asyncio.sleep(1)
        yield TextDelta("Hello")
        await asyncio.sleep(1)
        _busy(14)
        if how == "raises":
            raise ValueError("bad frame")
        if how == "is cancelled":
            raise asyncio.CancelledError  # the adapter's own, not the engine's
        if how == "calls a tool":
            yield ToolCallRequest("lookup", {})
        if how == "sends more":
            yield TextDelta(" there")
        yield Finish("stop")

    turn = live_turn(Passes(outlives, answers), tools=lookup_tool(1), idle_timeout_s=10)
    await turn.run()
    assert (*ending, 16.0) in _events(turn)
    timed_out = ("idle_timeout", "Settling", 11.0) in _events(turn)
    assert timed_out == (ending[1] == "TimedOut")
    assert turn.channel.text.startswith(delivered)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("how", "ending"), [
    ("ends", ("completed", "Done")), ("raises", ("crash", "Done")),
    ("is cancelled", ("crash", "Done")), ("calls a tool", ("tool_call", "ToolCall"))])
async def test_a_stream_ending_at_its_idle_budgets_last_instant_is_on_time(
        how: str, ending: tuple[str, str]) -> None:
    # covers S5, S15, T7: text at 1 s, then the stream ends, fails or asks for a tool
    # exactly as its 10 s idle budget runs out: that is within the budget, so the turn goes
    # on from it at 11 s — no timeout
    async def at_the_deadline(abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        await asyncio.sleep(1)
        yield TextDelta("Hello")
        await asyncio.sleep(10)
        if how == "raises":
            raise ValueError("bad frame")
        if how == "is cancelled":
            raise asyncio.CancelledError
        if how == "calls a tool":
            yield ToolCallRequest("lookup", {})
        yield Finish("stop")

    turn = live_turn(Passes(at_the_deadline, answers), tools=lookup_tool(1), idle_timeout_s=10)
    result = await turn.run()
    assert (*ending, 11.0) in _events(turn)
    assert "idle_timeout" not in [event for event, _, _ in _events(turn)]
    assert result.status == ("completed" if how in ("ends", "calls a tool") else "error")


class BusyReactorLookups(InMemoryChannel):
    """A reactor look-up that holds the loop from 15 s to 25 s before it answers."""

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        await asyncio.sleep(14)
        _busy(10)
        return await super().fetch_reactors(message_id, emoji, limit)


async def test_a_reveal_answering_after_its_budget_on_a_busy_loop_goes_on_without_it() -> None:
    # covers R6, T5: the reveal's look-up answers only after the 20 s budget (the loop was
    # held): the reveal went on at 21 s with what it had, and the late answer, read as the
    # next pass streams, changes nothing — the turn completes
    raw = {"config": {"tool_timeout_s": 20},
           "passes": [[{"at": 1, "tool_call": {"name": "reveal_message_metadata"}}],
                      [{"at": 1, "text": "Bo liked it."}, {"at": 1, "end": "completed"}]],
           "tools": {"reveal_message_metadata": [
               {"after": 0, "success": True,
                "data": {"type": "context_restart_message_metadata"}}]},
           "history": [{"id": "m1", "author": "ana", "content": "hi", "at": "t",
                        "reactions": [{"emoji": "👍", "users": ["bo"]}]}]}
    turn = scripted_turn(raw, channel_class=BusyReactorLookups)
    channel = turn.channel
    assert isinstance(channel, InMemoryChannel)
    result = await turn.run()
    assert result.status == "completed" and channel.text == "Bo liked it."
    assert ("restart", "Preparing", 21.0) in _events(turn)
    assert [line["event"] for line in turn.transitions].count("restart") == 1
    assert result.reactor_lookups == 1
