"""What a running tool meets and what the journal keeps of it (SPEC T5, T6, T7, R9, S16,
with the journal rule that a live turn's tool outcomes are inputs recorded for replay): a
refused call, a failure, a tool past its timeout, a tool killed by /kill, a tool that
returns after it was stopped; the error cap across a restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

from fsm.engine.config import TurnConfig
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.provider import AbortSignal, PassRequest, ProviderEvent, TextDelta
from fsm.engine.tools import FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.journal import JournalRecorder, journal_document, serialize_journal
from fsm.review.replay import replay_difference
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play_virtual, run_virtual
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider


class CityArgs(BaseModel):
    city: str


class LoggingProvider(ScriptedProvider):
    """The scripted model, noting in `log` each time it is asked for a pass."""

    def __init__(self, passes: list[Any], log: list[str]) -> None:
        super().__init__(parse_scenario({"passes": passes}).passes)
        self._log = log

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        self._log.append(f"pass {self.calls + 1}")
        return super().stream(request, abort)


def _call(name: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"at": 1, "tool_call": {"name": name, "args": args}}]


async def _journaled(passes: list[Any], registry: ToolRegistry, config: TurnConfig,
                     log: list[str], kill_at: float | None = None) -> dict[str, Any]:
    """One scripted turn journaled as the bot journals it, on the virtual clock; `kill_at`:
    /kill then."""
    return await _journaled_turn(LoggingProvider(passes, log), registry, config, kill_at)


async def _journaled_turn(provider: Any, registry: ToolRegistry, config: TurnConfig,
                          kill_at: float | None = None) -> dict[str, Any]:
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "live")
    assert lock is not None
    if kill_at is not None:
        asyncio.get_running_loop().call_later(kill_at, locks.request_stop, "c")
    turn = Turn(provider=provider, channel=InMemoryChannel(),
                locks=locks, lock=lock, tools=registry, config=config)
    recorder = JournalRecorder(turn.turn_id, turn.config, registry)
    turn.recorder = recorder
    result = await turn.run()
    locks.release(lock)
    document = journal_document(recorder.scenario(), turn.transitions, result.as_dict())
    loaded = json.loads(serialize_journal(document))
    assert isinstance(loaded, dict)
    return loaded


def test_refusals_failures_and_timeouts_are_journaled_and_replay() -> None:
    # covers T5, T6 with the journal rule: a call refused for its arguments took no time, a
    # failure keeps its error, a tool past its timeout is a hang; the journal replays to the
    # same turn
    async def weather(args: CityArgs, ctx: ToolContext) -> ToolResult:
        if args.city == "Rome":
            await asyncio.sleep(3600)
        return ToolResult.fail(f"no station for {args.city}")

    registry = ToolRegistry([FunctionTool("weather", "w", CityArgs, weather)])
    log: list[str] = []
    document = run_virtual(lambda: _journaled(
        [_call("weather", {"city": 5}), _call("weather", {"city": "Oslo"}),
         _call("weather", {"city": "Rome"}),
         [{"at": 1, "text": "No weather today."}, {"at": 2, "end": "completed"}]],
        registry, TurnConfig(tool_timeout_s=2.0), log))
    refused, failed, hung = document["tools"]["weather"]
    assert refused["after"] == 0.0 and "city" in refused["refused"]
    assert failed == {"after": 0.0, "success": False, "error": "no station for Oslo"}
    assert hung == {"hang": True}
    assert document["result"]["status"] == "completed"
    assert replay_difference(document, "tool outcomes") is None


def test_a_tool_past_its_timeout_is_told_why_and_stopped_before_the_model_is_asked_again(
) -> None:
    # covers T5: the tool's abort says "timeout", and its worker is cancelled then, not left
    # running beside the next pass until the turn ends
    log: list[str] = []

    async def slow(args: CityArgs, ctx: ToolContext) -> ToolResult:
        ctx.abort.add_callback(lambda: log.append(f"abort: {ctx.abort.reason}"))
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            log.append("tool stopped")
            raise
        return ToolResult.ok()

    registry = ToolRegistry([FunctionTool("slow", "s", CityArgs, slow)])
    document = run_virtual(lambda: _journaled(
        [_call("slow", {"city": "Oslo"}), [{"at": 1, "text": "Gave up."},
                                           {"at": 2, "end": "completed"}]],
        registry, TurnConfig(tool_timeout_s=2.0), log))
    assert log == ["pass 1", "abort: timeout", "tool stopped", "pass 2"]
    assert document["result"]["status"] == "completed"


def test_a_kill_while_a_tool_runs_is_journaled_as_a_hang_and_replays() -> None:
    # covers S16, T5 with the journal rule: /kill while a tool runs ends the turn as killed;
    # the journal records the tool as never having answered, so the replay kills it alike
    async def stuck(args: CityArgs, ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(3600)
        return ToolResult.ok()

    registry = ToolRegistry([FunctionTool("stuck", "s", CityArgs, stuck)])
    log: list[str] = []
    document = run_virtual(lambda: _journaled(
        [_call("stuck", {"city": "Oslo"})], registry, TurnConfig(), log, kill_at=5.0))
    assert document["tools"]["stuck"] == [{"hang": True}]
    assert document["result"]["status"] == "stopped_by_user"
    assert replay_difference(document, "killed in a tool") is None


def test_a_tool_that_returns_after_its_timeout_is_not_shown_to_the_model() -> None:
    # covers T5: a tool that swallows its cancellation and answers late; the model saw the
    # timeout, the late answer is dropped and the turn still completes
    async def stubborn(args: CityArgs, ctx: ToolContext) -> ToolResult:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)
            return ToolResult.ok({"late": True})
        return ToolResult.ok()

    registry = ToolRegistry([FunctionTool("stubborn", "s", CityArgs, stubborn)])
    log: list[str] = []

    async def run() -> tuple[Turn, str]:
        locks = ChannelLockRegistry()
        lock = locks.try_acquire("c", "live")
        assert lock is not None
        turn = Turn(provider=LoggingProvider(
            [_call("stubborn", {"city": "Oslo"}),
             [{"at": 2, "text": "Timed out."}, {"at": 3, "end": "completed"}]], log),
            channel=InMemoryChannel(), locks=locks, lock=lock, tools=registry,
            config=TurnConfig(tool_timeout_s=2.0))
        result = await turn.run()
        return turn, result.status

    turn, status = run_virtual(run)
    assert status == "completed"
    [entry] = turn.function_history
    assert not entry.success and "timed out after 2 s" in entry.result["error"]


def test_whitespace_before_a_tool_call_is_not_sent_as_the_calls_text() -> None:
    # covers T7: only visible text goes on the call's history entry
    played = play_virtual(parse_scenario({
        "passes": [[{"at": 1, "text": "\n\n  "},
                    {"at": 2, "tool_call": {"name": "t", "args": {}}}],
                   [{"at": 1, "text": "Done."}, {"at": 2, "end": "completed"}]],
        "tools": {"t": [{"success": True, "data": 1}]},
    }))
    [entry] = played.provider.requests[1].function_history
    assert entry.pre_tool_text == ""


def test_a_success_between_failures_resets_the_error_count() -> None:
    # covers T6: only consecutive failures count toward the cap; a success in between
    # (or a cap of one met by a success) does not end the turn as an error
    for cap, outcomes in ((2, [False, True, False]), (1, [True])):
        passes = [[{"at": 1, "tool_call": {"name": "t"}}] for _ in outcomes]
        played = play_virtual(parse_scenario({
            "config": {"max_consecutive_tool_errors": cap},
            "passes": [*passes, [{"at": 1, "text": "ok"}, {"at": 2, "end": "completed"}]],
            "tools": {"t": [{"success": True, "data": 1} if ok else
                            {"success": False, "error": "no"} for ok in outcomes]},
        }))
        assert played.result.status == "completed", (cap, outcomes)


def test_a_restart_resets_the_error_count() -> None:
    # covers R9, T6: a failure before a restart and one after it are not two in a row
    played = play_virtual(parse_scenario({
        "config": {"max_consecutive_tool_errors": 2},
        "passes": [[{"at": 1, "tool_call": {"name": "t"}}],
                   [{"at": 1, "tool_call": {"name": "process_gif"}}],
                   [{"at": 1, "tool_call": {"name": "t"}}],
                   [{"at": 1, "text": "ok"}, {"at": 2, "end": "completed"}]],
        "tools": {
            "t": [{"success": False, "error": "no"}, {"success": False, "error": "no"}],
            "process_gif": {"guard": "gif", "outcomes": [
                {"success": True,
                 "data": {"type": "context_restart_gif",
                          "enhanced_context_item": {"role": "user", "content": "<frames>"}}}]},
        },
    }))
    assert played.result.status == "completed"
    assert played.provider.calls == 4


def test_a_tool_requiring_a_follow_up_makes_a_silent_next_pass_no_answer() -> None:
    # covers T10, T9: after a `requires_follow_up` tool the model must speak; the text
    # delivered before the call is not the reply, so an empty pass is an empty response
    played = play_virtual(parse_scenario({
        "passes": [[{"at": 1, "text": "Looking it up. "},
                    {"at": 2, "tool_call": {"name": "lookup"}}],
                   [{"at": 1, "end": "empty"}]],
        "tools": {"lookup": {"loop": "requires_follow_up",
                             "outcomes": [{"success": True, "data": {"found": 3}}]}},
    }))
    assert played.result.status == "empty_response"


class SilentThenNeverSettles:
    """A stream that sends "Hello", then goes silent and never ends, even once aborted."""

    name = "never-settles"

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ProviderEvent]:
        yield TextDelta("Hello")
        await asyncio.sleep(3600)


@pytest.mark.parametrize("settle_s", [5.0, 0.5])
def test_a_stream_that_never_settles_is_journaled_and_replays(settle_s: float) -> None:
    # covers S10 with the journal rule: the journal says the abandoned call settled only
    # past the settle wait (the default's or a short one), so the replay waits the wait out
    # and times out alike
    async def record() -> dict[str, Any]:
        return await _journaled_turn(SilentThenNeverSettles(), ToolRegistry(),
                                     TurnConfig(settle_timeout_s=settle_s))

    document = run_virtual(record)
    assert document["result"]["status"] == "timeout"
    assert replay_difference(document, "never settles") is None
