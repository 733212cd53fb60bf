"""The fault matrix (RELIABILITY.md): every cell injects one fault into one place of a turn and
asserts the terminal state docs/spec.md implies, the exact virtual time it is reached, and that
nothing (worker, timer, kill handle, progress callback, lock) outlives the turn.

Cells whose engine behaviour contradicted docs/spec.md were strict xfails naming the bug until the
engine was fixed (RELIABILITY.md lists them); they now keep those bugs fixed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fsm.engine.channel import Notice
from fsm.engine.provider import (
    AbortSignal,
    Finish,
    KeepAlive,
    PassRequest,
    ProviderError,
    TextDelta,
    ToolCallRequest,
)
from fsm.engine.stash import ContextStash
from fsm.engine.tools import AnyArgs, FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play
from fsm.scenarios.scripted import InMemoryChannel

from reliability_support import (
    CHANNEL,
    build_turn,
    check_played,
    check_walk,
    finish,
    path,
    times,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

CONFIG: dict[str, Any] = {"first_token_timeout_s": 20, "idle_timeout_s": 10, "settle_timeout_s": 5,
          "tool_timeout_s": 30}
HISTORY = [{"id": "m1", "author": "ana", "content": "look", "at": "2026-11-30T12:00:00Z",
            "reactions": [{"emoji": "👍", "users": ["bo"]}]}]
METADATA_OK = {"after": 10, "success": True, "data": {"type": "context_restart_message_metadata"}}

# A turn that visits every non-terminal state, each for a while:
#   0 P→A, 1 A→S, 2 S→ToolCall, 12 →ContextRestart (5 s of reactor look-ups), 17 →P→A,
#   18 A→S, 28 idle timeout →Settling, 33 settle timeout →TimedOut.
EVERY_STATE: dict[str, Any] = {
    "name": "every state",
    "config": CONFIG,
    "passes": [[{"at": 1, "text": "Let me look. "},
                {"at": 2, "tool_call": {"name": "reveal_message_metadata"}}],
               [{"at": 1, "text": "Found it"}, {"at": 1, "stall": True, "settles_after": 100}]],
    "tools": {"reveal_message_metadata": [METADATA_OK]},
    "history": HISTORY,
}
ENTRY = {"Preparing": 0.0, "AwaitingFirstToken": 0.0, "Streaming": 1.0, "ToolCall": 2.0,
         "ContextRestart": 12.0, "Settling": 28.0}
LATER = {"AwaitingFirstToken": 0.5, "Streaming": 1.5, "ToolCall": 7.0, "ContextRestart": 14.0,
         "Settling": 30.0}


class SlowReactors(InMemoryChannel):
    """Each reactor look-up takes 5 s of virtual time, so ContextRestart lasts a while."""

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        await asyncio.sleep(5)
        return await super().fetch_reactors(message_id, emoji, limit)


class KillOnEntry:
    """An observer that kills the turn the moment it enters `state`, by `route`."""

    def __init__(self, state: str, route: str) -> None:
        self.state = state
        self.route = route
        self.fired_at: float | None = None

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        if dest == self.state and self.fired_at is None:
            self.fired_at = t
            kill(turn, self.route)


def kill(turn: Turn, route: str) -> None:
    """`turn`: the turn's own stop; `channel`: `/kill` through the lock registry (D3)."""
    if route == "turn":
        turn.request_stop()
    else:
        assert turn.locks.request_stop(CHANNEL)


def assert_stopped_at(turn: Turn, result: Any, at: float) -> None:
    """S7, S16: Stopped at once, no timeout notice or metric, the kill is the last line."""
    assert result.status == "stopped_by_user" and turn.state == "Stopped"
    assert turn.transitions[-1]["t"] == pytest.approx(at, abs=1e-9)
    assert result.metrics == [] and "timeout_idle" not in result.notices
    assert "timeout_first_token" not in result.notices and result.deferred_notice is None


# ---------------------------------------------------------------------- kill in every state


@pytest.mark.parametrize("route", ["turn", "channel"])
@pytest.mark.parametrize("state", list(ENTRY))
async def test_kill_on_entering_each_state(state: str, route: str) -> None:
    # covers S7, S16, T3, T5, D3: a kill at the very instant a state is entered ends the turn
    # Stopped at that instant, from that state
    observer = KillOnEntry(state, route)
    turn = build_turn(EVERY_STATE, channel=SlowReactors(parse_scenario(EVERY_STATE).history),
                      observer=observer)
    if state == "Preparing":
        kill(turn, route)  # before run(): the turn must stop before its first pass
        observer.fired_at = 0.0
    result = await finish(turn)
    assert_stopped_at(turn, result, ENTRY[state])
    assert turn.transitions[-1]["from"] == state
    if state == "ToolCall":
        assert result.function_history == [], "T5: the model never sees the killed call"


@pytest.mark.parametrize("route", ["turn", "channel"])
@pytest.mark.parametrize("state", list(LATER))
async def test_kill_while_in_each_state(state: str, route: str) -> None:
    # covers S7, S16, T5, D3: a kill in the middle of a state's wait (stream, settle, tool,
    # reactor look-ups) ends the turn Stopped at the kill's instant
    turn = build_turn(EVERY_STATE, channel=SlowReactors(parse_scenario(EVERY_STATE).history))
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(LATER[state])
    assert turn.state == state
    kill(turn, route)
    result = await finish(turn, task)
    assert_stopped_at(turn, result, LATER[state])
    assert turn.transitions[-1]["from"] == state


async def test_every_state_turn_without_kill_times_out_as_planned() -> None:
    # covers S5, S10, R6: the fixture above, left alone, follows its planned path and times
    turn = build_turn(EVERY_STATE, channel=SlowReactors(parse_scenario(EVERY_STATE).history))
    result = await finish(turn)
    assert path(turn) == ["Preparing", "AwaitingFirstToken", "Streaming", "ToolCall",
                          "ContextRestart", "Preparing", "AwaitingFirstToken", "Streaming",
                          "Settling", "TimedOut"]
    assert times(turn) == [0, 0, 1, 2, 12, 17, 17, 18, 28, 33]
    assert result.status == "timeout" and result.reactor_lookups == 1


async def test_double_kill_and_kill_after_the_end_are_harmless() -> None:
    # covers S16, D3: repeated kills are idempotent, a kill after the end changes nothing
    turn = build_turn(EVERY_STATE)
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(1.5)
    turn.request_stop()
    turn.locks.request_stop(CHANNEL)
    turn.request_stop()
    result = await finish(turn, task)
    assert_stopped_at(turn, result, 1.5)
    turn.request_stop()
    turn.notify_follow_up()
    assert len(turn.transitions) == 3 and not turn.locks.request_stop(CHANNEL)


# ----------------------------------------------------------------------------- timers


@pytest.mark.parametrize("timer", ["first_token", "idle"])
async def test_timer_with_a_stop_pending_stops_without_settling(timer: str) -> None:
    # covers S9: the timer fires while a stop is pending on the channel: Stopped at once
    steps = [{"at": 30, "stall": True}] if timer == "first_token" else \
        [{"at": 1, "text": "a"}, {"at": 2, "stall": True}]
    turn = build_turn({"config": CONFIG, "passes": [steps]})
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(3)
    turn.lock.stop_requested = True
    result = await finish(turn, task)
    assert_stopped_at(turn, result, 20 if timer == "first_token" else 11)
    assert turn.transitions[-1]["event"] == f"{timer}_timeout"


# ------------------------------------------------------------------------------ tools


def _tool_turn(func: Any, *, calls: int = 1, config: dict[str, Any] | None = None,
               then: str = "completed") -> tuple[Turn, ToolRegistry]:
    """A turn whose first pass calls tool `t` `calls` times, then ends `then`."""
    registry = ToolRegistry([FunctionTool[AnyArgs](name="t", description="faulty",
                                                   args_model=AnyArgs, func=func)])
    passes = [[{"at": 1, "tool_call": {"name": "t"}}] for _ in range(calls)]
    passes.append([{"at": 1, "text": "done"}, {"at": 2, "end": then}])
    raw = {"config": {**CONFIG, **(config or {})}, "passes": passes}
    return build_turn(raw, registry=registry), registry


def _history_results(turn: Turn) -> list[dict[str, Any]]:
    return [entry.result for entry in turn.function_history]


async def test_tool_raising_is_a_failed_result_the_model_sees() -> None:
    # covers T5, T6, S15: a tool's exception is its failed result, not a crash of the turn
    async def boom(_args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(2)
        raise KeyError("missing field")

    turn, _ = _tool_turn(boom)
    result = await finish(turn)
    assert result.status == "completed" and path(turn)[-1] == "Done"
    assert times(turn)[3] == 3.0
    [seen] = _history_results(turn)
    assert seen["success"] is False and "KeyError" in seen["error"]
    assert result.consecutive_tool_errors == 1


async def test_tool_errors_reach_the_cap() -> None:
    # covers T6: consecutive failures end the turn Done/error with one notice
    async def boom(_args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        raise RuntimeError("down")

    turn, _ = _tool_turn(boom, calls=3, config={"max_consecutive_tool_errors": 3})
    result = await finish(turn)
    assert result.status == "error" and result.notices == ["tool_error_loop"]
    assert result.consecutive_tool_errors == 3 and turn.transitions[-1]["event"] == "tool_result"


async def test_tool_hanging_times_out_at_its_budget() -> None:
    # covers T5
    async def hang(_args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    turn, _ = _tool_turn(hang)
    result = await finish(turn)
    assert result.status == "completed"
    assert turn.transitions[2] == {"t": 31.0, "event": "tool_timeout", "from": "ToolCall",
                                   "to": "Preparing"}
    [seen] = _history_results(turn)
    assert seen == {"success": False, "error": "t timed out after 30 s"}


class Stubborn:
    """A tool that swallows its cancellation and finishes `grace` seconds later (a badly
    written tool doing cleanup), or never (`grace=None`)."""

    def __init__(self, grace: float | None) -> None:
        self.grace = grace
        self.cancelled = 0
        self.finished_at: float | None = None

    async def __call__(self, _args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
        while self.grace is None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
        await asyncio.sleep(self.grace)
        self.finished_at = asyncio.get_running_loop().time()
        return ToolResult.ok("late")


async def _drain_abandoned() -> None:
    """After a cell whose collaborator ignored cancellation (and was then released by the
    test), let its abandoned task finish so it does not leak into the next test."""
    current = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not current]
    for task in others:
        task.cancel()
    if others:
        _, pending = await asyncio.wait(others, timeout=1000)
        assert not pending, "a released collaborator still ignores cancellation"


@pytest.mark.parametrize("grace", [3.0, None])
async def test_tool_ignoring_cancellation_on_kill(grace: float | None) -> None:
    # covers T5, S16, D4: the kill still ends the turn Stopped at once; the driver waits the
    # settle budget for the tool, then abandons it with a warning and releases the lock
    tool = Stubborn(grace)
    turn, _ = _tool_turn(tool)
    task = asyncio.create_task(turn.run())
    loop = asyncio.get_running_loop()
    try:
        await asyncio.sleep(10)
        turn.request_stop()
        # left running: the tool's task and the task holding the turn's group, waiting for it
        result = await finish(turn, task, allow_left=0 if grace is not None else 2)
        assert_stopped_at(turn, result, 10)
        assert tool.cancelled >= 1
        assert loop.time() == (13.0 if grace is not None else 15.0)
    finally:
        tool.grace = 0.0
        await _drain_abandoned()


async def test_tool_ignoring_cancellation_on_timeout_does_not_block_the_turn() -> None:
    # covers T5, D4: the timeout is a failed result at its budget and the turn goes on
    tool = Stubborn(3.0)
    turn, _ = _tool_turn(tool)
    try:
        result = await finish(turn, allow_left=1)
        assert result.status == "completed" and times(turn)[3] == 31.0
        assert tool.cancelled == 1
    finally:
        await _drain_abandoned()


async def test_timed_out_tool_that_ends_late_does_not_outlive_the_turn() -> None:
    # covers S14, T5: whatever the engine started is finished (or reported) when run() returns
    tool = Stubborn(3.0)
    turn, _ = _tool_turn(tool)
    try:
        await finish(turn)
    finally:
        await _drain_abandoned()


GARBAGE_RESULTS: dict[str, Any] = {
    "None": None,
    "str": "all good",
    "dict": {"success": True, "data": 1},
    "int": 42,
    "success not bool": ToolResult(success="yes", data={"a": 1}),  # type: ignore[arg-type]
    "failure without error": ToolResult(success=False),
    "bytes data": ToolResult.ok(b"\x00\xff" * 100),
    "set data": ToolResult.ok({1, 2}),
    "non-str keys": ToolResult.ok({1: "one", None: "none"}),
    "restart type not str": ToolResult.ok({"type": ["context_restart_gif"]}),
    "restart key not str": ToolResult.ok({"type": "context_restart_gif",
                                          "pending_context_key": ["k"]}),
    "restart item not object": ToolResult.ok({"type": "context_restart_youtube",
                                              "enhanced_context_item": "text"}),
    "restart unknown kind": ToolResult.ok({"type": "context_restart_"}),
    "deep data": ToolResult.ok(json.loads("[" * 500 + "]" * 500)),
}


@pytest.mark.parametrize("garbage", list(GARBAGE_RESULTS))
async def test_tool_returning_garbage_never_crashes_the_turn(garbage: str) -> None:
    # covers T5, R1, R5, S15: garbage is a result the model sees (failed or ordinary) or a
    # restart that goes on without its item; the turn completes and its result serializes
    async def returns(_args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        return GARBAGE_RESULTS[garbage]  # type: ignore[no-any-return]

    turn, _ = _tool_turn(returns)
    result = await finish(turn)
    assert result.status == "completed" and result.state == "Done"
    assert "crash" not in [line["event"] for line in turn.transitions]
    json.dumps(result.as_dict(), default=repr)
    if not isinstance(GARBAGE_RESULTS[garbage], ToolResult):
        [seen] = _history_results(turn)
        assert seen["success"] is False and "not a tool result" in seen["error"]


async def test_tool_raising_a_base_exception_times_out() -> None:
    # covers T5: a BaseException that is not an Exception kills the tool's task without a
    # result; the tool budget still ends the wait (observed behaviour, RELIABILITY.md)
    class Escape(BaseException):
        pass

    async def escapes(_args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(1)
        raise Escape

    turn, _ = _tool_turn(escapes)
    result = await finish(turn)
    assert result.status == "completed" and times(turn)[3] == 31.0


# ------------------------------------------------------------------------------ stash


def _stash_turn(put: Any, *, config: dict[str, Any] | None = None,
                stash: ContextStash | None = None) -> Turn:
    """A turn whose tool stashes `put()` and asks for an image restart with its key."""
    async def stashing(_args: AnyArgs, ctx: ToolContext) -> ToolResult:
        key = put(ctx.stash)
        return ToolResult.ok({"type": "context_restart_image", "pending_context_key": key})

    registry = ToolRegistry([FunctionTool[AnyArgs](name="peek", description="stashes",
                                                   guard="image", args_model=AnyArgs,
                                                   func=stashing)])
    raw = {"config": {**CONFIG, **(config or {})},
           "passes": [[{"at": 1, "tool_call": {"name": "peek"}}],
                      [{"at": 1, "text": "ok"}, {"at": 2, "end": "completed"}]]}
    return build_turn(raw, registry=registry, stash=stash)


async def test_oversized_stash_item_is_a_failed_tool_call() -> None:
    # covers R3, T5: an item over the stash budget is refused; the tool's failure is a result
    turn = _stash_turn(lambda stash: stash.put({"role": "user", "content": "x" * 5000}),
                       config={"stash_max_bytes": 1024})
    result = await finish(turn)
    assert result.status == "completed" and result.stash_items == 0
    [seen] = _history_results(turn)
    assert seen["success"] is False and "StashFull" in seen["error"]


@pytest.mark.parametrize("item", ["a string", b"raw bytes", ["a", "list"], None, 3.5,
                                  {"role": 7}, {"parts": "no role"}])
async def test_stashed_item_of_the_wrong_type_goes_on_without_it(item: Any) -> None:
    # covers R3, R5, R8: the restart happens, the item is dropped with a warning
    turn = _stash_turn(lambda stash: stash.put(item))
    result = await finish(turn)
    assert result.status == "completed" and result.context_items_added == 0
    assert "ContextRestart" in path(turn) and result.stash_items == 0
    assert result.flags["disable_profile_picture_processing"] is True


async def test_stash_key_from_another_turn_does_not_resolve() -> None:
    # covers R4, R5: a key stashed by another turn's stash is unknown here; the other stash
    # keeps its item; the turn goes on
    other = ContextStash()
    foreign = other.put({"role": "user", "content": "someone else's avatar"})
    turn = _stash_turn(lambda _stash: foreign)
    result = await finish(turn)
    assert result.status == "completed" and result.context_items_added == 0
    assert len(other) == 1 and other.take(foreign) is not None


async def test_stash_key_drained_by_an_earlier_turn_does_not_replay() -> None:
    # covers R4: one shared stash, two turns; the second turn's restart finds the key drained
    shared = ContextStash()
    key = shared.put({"role": "user", "content": "avatar"})
    first = _stash_turn(lambda _stash: key, stash=shared)
    assert (await finish(first)).context_items_added == 1
    second = _stash_turn(lambda _stash: key, stash=shared)
    result = await finish(second)
    assert result.status == "completed" and result.context_items_added == 0


async def test_stash_flooded_by_a_tool_stays_within_bounds() -> None:
    # covers R3: 200 puts, the stash holds at most max_items and max_bytes; oldest dropped
    sizes: list[tuple[int, int]] = []

    def flood(stash: ContextStash) -> str:
        keys = []
        for i in range(200):
            keys.append(stash.put({"role": "user", "content": f"frame {i} " * 50}))
            sizes.append((len(stash), stash.total_bytes))
        return keys[-1]

    turn = _stash_turn(flood, config={"stash_max_items": 4, "stash_max_bytes": 4096})
    result = await finish(turn)
    assert len(sizes) == 200 and max(n for n, _ in sizes) == 4
    assert max(b for _, b in sizes) <= 4096
    assert result.context_items_added == 1 and result.stash_items == 3


async def test_expired_stash_item_goes_on_without_it() -> None:
    # covers R3, R5: the item outlived its TTL before the restart took it
    async def slow_stash(_args: AnyArgs, ctx: ToolContext) -> ToolResult:
        key = ctx.stash.put({"role": "user", "content": "avatar"})
        await asyncio.sleep(2)
        return ToolResult.ok({"type": "context_restart_image", "pending_context_key": key})

    registry = ToolRegistry([FunctionTool[AnyArgs](name="peek", description="",
                                                   args_model=AnyArgs, func=slow_stash)])
    raw = {"config": {**CONFIG, "stash_ttl_s": 1},
           "passes": [[{"at": 1, "tool_call": {"name": "peek"}}], [{"at": 1, "end": "empty"}]]}
    turn = build_turn(raw, registry=registry)
    result = await finish(turn)
    assert result.context_items_added == 0 and result.stash_items == 0


# --------------------------------------------------------------------------- provider


class Raise:
    """In a FaultyProvider script: raise this exception instead of yielding an event."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class FaultyProvider:
    """Yields its script one item a second (a `Raise` is raised); `tail` says what happens
    after: stall until aborted, end, or go silent and ignore both the abort (sending on after
    it) and cancellation until the test releases it."""

    name = "faulty"

    def __init__(self, events: list[Any], tail: str = "stall") -> None:
        self.events = events
        self.tail = tail
        self.released = False

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[Any]:
        return self._gen(abort)

    async def _gen(self, abort: AbortSignal) -> AsyncIterator[Any]:
        for event in self.events:
            await asyncio.sleep(1)
            if isinstance(event, Raise):
                raise event.error
            yield event
        if self.tail == "stall":
            await abort.wait()
        elif self.tail == "ignore everything":
            while not self.released:
                try:
                    await asyncio.sleep(1)
                except asyncio.CancelledError:
                    continue
                if abort.fired:
                    yield TextDelta(".")


class RaisesOnCall:
    name = "raises on call"

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[Any]:
        raise ConnectionError("refused")


def _provider_turn(provider: Any, channel: Any = None) -> Turn:
    return build_turn({"config": CONFIG}, provider=provider, channel=channel)


async def test_provider_raising_when_called() -> None:
    # covers S15: the pass's call itself fails: Done/error at once
    turn = _provider_turn(RaisesOnCall())
    result = await finish(turn)
    assert result.status == "error" and "ConnectionError" in (result.error or "")
    assert path(turn) == ["Preparing", "AwaitingFirstToken", "Done"] and times(turn)[-1] == 0


@pytest.mark.parametrize("where", ["before the first token", "mid-stream"])
async def test_provider_raising(where: str) -> None:
    # covers S15, S13: Done/error at the instant it raises, delivered text kept
    events: list[Any] = [Raise(ValueError("bad frame"))]
    if where == "mid-stream":
        events = [TextDelta("Hello"), TextDelta(" there"), Raise(ValueError("bad frame"))]
    turn = _provider_turn(FaultyProvider(events))
    result = await finish(turn)
    assert result.status == "error" and turn.transitions[-1]["event"] == "crash"
    assert times(turn)[-1] == len(events)
    assert result.delivered_text == ("Hello there" if where == "mid-stream" else "")
    assert turn.channel.text == result.delivered_text  # type: ignore[attr-defined]


async def test_provider_raising_while_settling_counts_as_settled() -> None:
    # covers S10: after the abort, an exception is just the abandoned call ending
    class RaisesAfterAbort(FaultyProvider):
        async def _gen(self, abort: AbortSignal) -> AsyncIterator[Any]:
            await asyncio.sleep(1)
            yield TextDelta("a")
            await abort.wait()
            await asyncio.sleep(2)
            raise ConnectionResetError("closed")

    turn = _provider_turn(RaisesAfterAbort([]))
    result = await finish(turn)
    assert result.status == "timeout" and turn.transitions[-1]["event"] == "settled"
    assert times(turn)[-2:] == [11, 13]


GARBAGE_EVENTS: dict[str, Any] = {
    "None": None, "str": "Hello", "dict": {"text": "Hello"}, "int": 7, "object": object(),
    "bytes": b"data: {}", "exception instance as event": RuntimeError("yielded, not raised"),
}


@pytest.mark.parametrize("garbage", list(GARBAGE_EVENTS))
async def test_provider_yielding_garbage_events(garbage: str) -> None:
    # covers S4, S8: an object that is not a provider event is ignored (not a token, not an
    # error); the pass goes on and ends as the real events say
    event = GARBAGE_EVENTS[garbage]
    provider = FaultyProvider([event, TextDelta("Hi"), event, Finish("stop")], tail="end")
    turn = _provider_turn(provider)
    result = await finish(turn)
    assert result.status == "completed" and result.text == "Hi"
    assert [line["t"] for line in turn.transitions] == [0, 2, 4]


async def test_provider_yielding_only_garbage_is_not_a_first_token() -> None:
    # covers S4: garbage never counts as a token; the first-token budget still applies
    turn = _provider_turn(FaultyProvider([None, "Hello", KeepAlive("ping")]))
    result = await finish(turn)
    assert result.status == "timeout" and result.metrics[0]["phase"] == "first_token"
    assert times(turn)[2] == 20


@pytest.mark.parametrize("text", [b"bytes", 42], ids=["bytes", "int"])
async def test_text_delta_of_the_wrong_type_ends_done_error(text: Any) -> None:
    # covers S15: a provider handing over non-text is an error of the pass, not a completion
    turn = _provider_turn(FaultyProvider([TextDelta(text), Finish("stop")], tail="end"))
    result = await finish(turn)
    assert result.status == "error"


async def test_tool_call_garbage_from_the_provider() -> None:
    # covers T2, T4: a call with no name ends the turn Done/error; arguments that are not an
    # object are refused without running, as a failed result the model sees
    turn = _provider_turn(FaultyProvider(
        [ToolCallRequest(name="x", arguments=[1, 2]),  # type: ignore[arg-type]
         ToolCallRequest(name=None, arguments={}),  # type: ignore[arg-type]
         Finish("tool_calls")], tail="end"))
    result = await finish(turn)
    assert result.status == "error" and turn.transitions[-1]["event"] == "nameless_call"
    assert [h["success"] for h in _history_results(turn)] == [False]


async def test_provider_error_with_odd_fields_is_an_error_result() -> None:
    # covers S8: a provider-level error result passes straight to the loop
    odd = ProviderError(kind="http", message="", type=None, status=599, retry_after_s=-1.0)
    turn = _provider_turn(FaultyProvider([TextDelta("a"), odd], tail="end"))
    result = await finish(turn)
    assert result.status == "error" and turn.transitions[-1]["event"] == "provider_error"
    json.dumps(result.as_dict())


async def test_provider_raising_cancelled_error_is_an_error() -> None:
    # covers S15: only the engine's own inactivity timeout becomes `timeout`
    turn = _provider_turn(FaultyProvider([TextDelta("a"), Raise(asyncio.CancelledError())]))
    result = await finish(turn)
    assert result.status == "error" and times(turn)[-1] == 2


async def test_provider_ignoring_the_abort_is_cut_off_by_the_settle_budget() -> None:
    # covers S10, S14: an adapter that keeps streaming after the abort; the settle budget
    # ends the wait and the worker is cancelled
    class Deaf(FaultyProvider):
        async def _gen(self, abort: AbortSignal) -> AsyncIterator[Any]:
            await asyncio.sleep(1)
            yield TextDelta("a")
            await asyncio.sleep(30)
            while True:
                yield TextDelta(".")
                await asyncio.sleep(1)

    turn = _provider_turn(Deaf([]))
    result = await finish(turn)
    assert result.status == "timeout" and times(turn)[-2:] == [11, 16]
    assert result.text == "a"


@pytest.mark.parametrize("how", ["kill", "timeout"])
async def test_provider_ignoring_abort_and_cancellation(how: str) -> None:
    # covers S7, S16, S14, D4: the turn still ends (Stopped at once, or TimedOut at its
    # budgets); the driver waits the settle budget for the worker, abandons it with a
    # warning, and the lock is released
    provider = FaultyProvider([TextDelta("a")], tail="ignore everything")
    turn = _provider_turn(provider)
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(turn.run())
    try:
        if how == "kill":
            await asyncio.sleep(3)
            turn.request_stop()
        result = await finish(turn, task, allow_left=2)  # the worker and its group's holder
        if how == "kill":
            assert_stopped_at(turn, result, 3)
            assert loop.time() == 8.0
        else:
            assert result.status == "timeout" and loop.time() == 21.0
    finally:
        provider.released = True
        await _drain_abandoned()


# ---------------------------------------------------------------------------- channel


class FailingSend(InMemoryChannel):
    """`deliver` raises on its `fail_at`-th call (1-based), like a Discord send failing."""

    def __init__(self, fail_at: int, hang: bool = False) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.hang = hang
        self.calls = 0

    async def deliver(self, text: str) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            if self.hang:
                await asyncio.Event().wait()
            raise ConnectionError("send failed: 503")
        await super().deliver(text)


STREAM = [TextDelta("One. "), TextDelta("Two. "), TextDelta("Three."), Finish("stop")]


@pytest.mark.parametrize("fail_at", [1, 2, 3])
async def test_failed_send_ends_done_error_with_delivered_text_kept(fail_at: int) -> None:
    # covers D2, S15, S13, D4: a failed send is reported (Done/error naming it), never lost
    # silently; the text that did reach the channel is the turn's delivered text
    channel = FailingSend(fail_at)
    turn = _provider_turn(FaultyProvider(list(STREAM), tail="end"), channel)
    result = await finish(turn)
    assert result.status == "error" and "send failed" in (result.error or "")
    assert turn.transitions[-1]["event"] == "crash" and times(turn)[-1] == fail_at
    assert result.delivered_text == channel.text == "".join(
        e.text for e in STREAM[: fail_at - 1] if isinstance(e, TextDelta))


async def test_hanging_send_is_cut_off_by_the_idle_budget() -> None:
    # covers S5, S10, D4: a send that never returns does not hang the turn
    channel = FailingSend(2, hang=True)
    turn = _provider_turn(FaultyProvider(list(STREAM), tail="end"), channel)
    result = await finish(turn)
    assert result.status == "timeout" and times(turn)[-2:] == [12, 17]
    assert result.delivered_text == "One. "


async def test_flush_failing_at_the_end_of_a_pass_is_an_error() -> None:
    # covers S15, D2
    class FlushFails(InMemoryChannel):
        async def finish_pass(self) -> None:
            raise ConnectionError("flush failed")

    turn = _provider_turn(FaultyProvider(list(STREAM), tail="end"), FlushFails())
    result = await finish(turn)
    assert result.status == "error" and result.delivered_text == "One. Two. Three."


async def test_notice_failing_to_post_does_not_change_the_outcome() -> None:
    # covers S12, D2: the turn still times out; the notice it could not post is not listed
    class NoticeFails(InMemoryChannel):
        async def post_notice(self, notice: Notice) -> None:
            raise ConnectionError("embed rejected")

    turn = _provider_turn(FaultyProvider([TextDelta("a")]), NoticeFails())
    result = await finish(turn)
    assert result.status == "timeout" and result.notices == []
    assert result.metrics == [{"name": "stream_sdk_timeout", "phase": "idle"}]


async def test_reactor_look_up_failing_degrades_to_counts() -> None:
    # covers R6: a REST failure during the reveal degrades to reaction counts; the restart
    # goes on (flag set, tail directive added) and the next pass runs
    class LookupFails(InMemoryChannel):
        async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
            raise ConnectionError("REST down")

    raw = {**EVERY_STATE, "passes": [EVERY_STATE["passes"][0],
                                     [{"at": 1, "text": "ok"}, {"at": 2, "end": "completed"}]]}
    turn = build_turn(raw, channel=LookupFails(parse_scenario(raw).history))
    result = await finish(turn)
    assert result.status == "completed" and path(turn)[4:6] == ["ContextRestart", "Preparing"]
    assert result.flags["disable_message_metadata_context"] is True
    assert result.context_items_added == 1


async def test_reactor_look_up_hanging_does_not_hang_the_turn() -> None:
    # covers R6, S14, D4
    class LookupHangs(InMemoryChannel):
        async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
            await asyncio.Event().wait()
            return []

    raw = {**EVERY_STATE, "passes": EVERY_STATE["passes"][:1]}
    turn = build_turn(raw, channel=LookupHangs(parse_scenario(raw).history))
    task = asyncio.create_task(turn.run())
    done, _ = await asyncio.wait({task}, timeout=10 * 300)
    if not done:
        turn.request_stop()
        await finish(turn, task)
    assert done, "the turn is still in ContextRestart after 3,000 s"


class ClosingProvider(FaultyProvider):
    """Notes whether its stream was closed (its `finally` ran) and its abort fired."""

    def __init__(self, events: list[Any]) -> None:
        super().__init__(events, tail="end")
        self.closed = False
        self.abort: AbortSignal | None = None

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[Any]:
        self.abort = abort
        return self._closing(abort)

    async def _closing(self, abort: AbortSignal) -> AsyncIterator[Any]:
        try:
            async for event in self._gen(abort):
                yield event
        finally:
            self.closed = True


async def test_pass_ended_by_a_channel_failure_closes_the_stream() -> None:
    # covers S3, S14: however the pass ends, the stream is aborted and closed within it
    provider = ClosingProvider(list(STREAM))
    turn = _provider_turn(provider, FailingSend(2))
    result = await finish(turn)
    assert result.status == "error"
    assert provider.abort is not None and provider.abort.fired, "the pass's abort never fired"
    assert provider.closed, "the adapter's stream was left open"


# ------------------------------------------------------------------------- follow-ups


@pytest.mark.parametrize(("at", "state", "interrupts"), [
    (0.5, "AwaitingFirstToken", True), (1.5, "Streaming", True), (30, "Settling", False),
    (7, "ToolCall", False), (14, "ContextRestart", False)])
async def test_follow_up_in_each_state(at: float, state: str, interrupts: bool) -> None:
    # covers S17, T3: interrupts a stream at once; queued during settle, tools and restarts
    turn = build_turn(EVERY_STATE, channel=SlowReactors(parse_scenario(EVERY_STATE).history))
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(at)
    assert turn.state == state
    turn.notify_follow_up()
    result = await finish(turn, task)
    if interrupts:
        assert result.status == "follow_up_interrupt" and times(turn)[-1] == at
    else:
        assert result.status == "timeout" and result.follow_up_queued
        assert {"t": at, "event": "follow_up", "state": state} in turn.internal_transitions


async def test_follow_up_past_the_interrupt_cap_stays_queued() -> None:
    # covers S17
    raw = {**EVERY_STATE, "config": {**CONFIG, "max_follow_up_interrupts": 0}}
    turn = build_turn(raw, channel=SlowReactors(parse_scenario(raw).history))
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(1.5)
    turn.notify_follow_up()
    result = await finish(turn, task)
    assert result.status == "timeout" and result.follow_up_queued


# --------------------------------------------------------------------------- journals


async def test_scenario_played_on_the_test_loop_checks_out() -> None:
    # covers S14, D4: the runner itself leaves nothing behind on a shared loop
    raw = {"name": "shared loop", "config": CONFIG, "events": [{"at": 3, "kill": True}],
           "passes": [[{"at": 1, "text": "a"}, {"at": 2, "stall": True}]]}
    played = await play(parse_scenario(raw))
    check_played(played, raw)
    check_walk(played.turn)
    assert played.result.status == "stopped_by_user"

