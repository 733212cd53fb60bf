"""Edges that only fault injection or exact timing reaches: a crash or a kill in states that
scenarios pass through instantly, and follow-ups past the per-lock interrupt cap."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from fsm.engine.config import TurnConfig
from fsm.engine.flags import TurnFlags
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.stash import ContextStash
from fsm.engine.tools import AnyArgs, ToolRegistry
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider, ScriptedTools, history_items

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

METADATA_TOOL = {"reveal_message_metadata": [
    {"after": 0, "success": True, "data": {"type": "context_restart_message_metadata"}}]}
HISTORY = [{"id": "m1", "author": "ana", "content": "hi", "at": "t",
            "reactions": [{"emoji": "👍", "users": ["bo"]}]}]


class SlowChannel(InMemoryChannel):
    """Each reactor look-up takes 5 s, so a turn sits in ContextRestart for a while."""

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        await asyncio.sleep(5)
        return await super().fetch_reactors(message_id, emoji, limit)


def _turn(raw: dict[str, Any], *, channel: InMemoryChannel | None = None,
          registry: ToolRegistry | None = None, stash: ContextStash | None = None,
          locks: ChannelLockRegistry | None = None) -> Turn:
    scenario = parse_scenario(raw)
    stash = stash if stash is not None else ContextStash()
    tools = ScriptedTools(scenario.tools, stash, {})
    locks = locks if locks is not None else ChannelLockRegistry()
    lock = locks.try_acquire("c", "t")
    assert lock is not None
    return Turn(provider=ScriptedProvider(scenario.passes),
                channel=channel if channel is not None else InMemoryChannel(scenario.history),
                locks=locks, lock=lock, request=TurnRequest(history_items(scenario.history)),
                tools=registry if registry is not None else tools.registry, stash=stash,
                config=scenario.turn_config())


def _path(turn: Turn) -> list[str]:
    return ["Preparing"] + [t["to"] for t in turn.transitions]


async def test_kill_and_follow_up_during_context_restart() -> None:
    # covers S16, T3, R6: the reveal's look-ups run in ContextRestart; a follow-up stays
    # queued there and a kill ends the turn at once
    raw = {"passes": [[{"at": 1, "tool_call": {"name": "reveal_message_metadata"}}]],
           "tools": METADATA_TOOL, "history": HISTORY}
    history = parse_scenario(raw).history
    turn = _turn(raw, channel=SlowChannel(history))
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(2)
    assert turn.state == "ContextRestart"
    turn.notify_follow_up()
    await asyncio.sleep(1)
    assert turn.state == "ContextRestart" and turn.follow_up_queued
    turn.request_stop()
    result = await task
    assert result.status == "stopped_by_user"
    assert _path(turn)[-2:] == ["ContextRestart", "Stopped"]
    assert turn.transitions[-1]["t"] == pytest.approx(3.0)


async def test_crash_while_preparing_ends_done_error() -> None:
    # covers S15: a failure building the request (here the registry's tool declarations)
    class FailingRegistry(ToolRegistry):
        def schemas(self, flags: TurnFlags) -> list[dict[str, Any]]:
            raise RuntimeError("schema unavailable")

    turn = _turn({"passes": [[{"at": 1, "end": "completed"}]]}, registry=FailingRegistry())
    result = await turn.run()
    assert result.status == "error" and "schema unavailable" in (result.error or "")
    assert _path(turn) == ["Preparing", "Done"]


async def test_tool_whose_schema_cannot_be_built_is_refused_at_registration() -> None:
    # covers R8 (the declarations offered per pass) and S15: they are built once, when the
    # bot registers its tools, so a
    # broken arguments model fails at start-up, not in every turn
    class Broken:
        name = "broken"
        description = "a tool whose arguments model fails"
        guard = None

        @property
        def args_model(self) -> type[BaseModel]:
            raise RuntimeError("schema unavailable")

        async def run(self, args: BaseModel, ctx: Any) -> Any:
            raise AssertionError("never runs")

    registry = ToolRegistry()
    with pytest.raises(RuntimeError, match="schema unavailable"):
        registry.register(Broken())
    assert registry.names() == [] and registry.schemas(TurnFlags()) == []


async def test_crash_in_tool_call_ends_done_error() -> None:
    # covers S15 (in ToolCall): a registry failing to check a call
    class FailingRegistry(ToolRegistry):
        def refusal(self, name: str, flags: Any) -> str | None:
            raise RuntimeError("registry corrupted")

    turn = _turn({"passes": [[{"at": 1, "tool_call": {"name": "x"}}]]},
                 registry=FailingRegistry())
    result = await turn.run()
    assert result.status == "error" and _path(turn)[-2:] == ["ToolCall", "Done"]


async def test_crash_in_context_restart_ends_done_error() -> None:
    # covers S15 (in ContextRestart): the stash failing while resolving an item
    class FailingStash(ContextStash):
        def take(self, key: str) -> Any:
            raise RuntimeError("stash corrupted")

    raw = {"passes": [[{"at": 1, "tool_call": {"name": "process_gif"}}]],
           "tools": {"process_gif": [{"after": 0, "success": True,
                                      "data": {"type": "context_restart_gif",
                                               "pending_context_key": "k"}}]}}
    turn = _turn(raw, stash=FailingStash())
    result = await turn.run()
    assert result.status == "error" and _path(turn)[-2:] == ["ContextRestart", "Done"]
    assert turn.lock.turn_kill is None


async def test_first_token_timer_with_stop_pending_stops() -> None:
    # covers S9 (before the first token)
    locks = ChannelLockRegistry()
    turn = _turn({"passes": [[{"at": 0, "stall": True}]],
                  "config": {"first_token_timeout_s": 60, "idle_timeout_s": 30}}, locks=locks)
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(30)
    lock = locks.get("c")
    assert lock is not None
    lock.stop_requested = True
    result = await task
    assert result.status == "stopped_by_user" and result.notices == [] and result.metrics == []
    assert turn.transitions[-1] == {"t": 60.0, "event": "first_token_timeout",
                                    "from": "AwaitingFirstToken", "to": "Stopped"}


async def test_follow_ups_past_the_per_lock_cap_stay_queued() -> None:
    # covers S17: at most max_follow_up_interrupts interrupts per lock
    locks = ChannelLockRegistry(max_follow_up_interrupts=1)
    turn = _turn({"passes": [[{"at": 1, "text": "a"}, {"at": 20, "text": "b"},
                               {"at": 21, "end": "completed"}]]}, locks=locks)
    lock = locks.get("c")
    assert lock is not None
    lock.follow_up_interrupts = 1
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(0.5)
    turn.notify_follow_up()  # while awaiting the first token
    await asyncio.sleep(5)
    turn.notify_follow_up()  # while streaming
    result = await task
    assert result.status == "completed" and result.follow_up_queued
    assert {(t["event"], t["state"]) for t in turn.internal_transitions} == {
        ("follow_up", "AwaitingFirstToken"), ("follow_up", "Streaming")}


async def test_tool_args_model_unused_by_scripted_tools() -> None:
    # covers T6: scripted tools accept any object, so a scenario's own args reach them
    assert AnyArgs.model_validate({"anything": [1, 2]}).model_extra == {"anything": [1, 2]}
    assert TurnConfig().max_consecutive_tool_errors == 5


class FailingSendChannel(InMemoryChannel):
    """The third send fails, as a Discord 5xx after retries would."""

    async def deliver(self, text: str) -> None:
        if len(self.delivered) == 2:
            raise RuntimeError("HTTP 503 from Discord")
        await super().deliver(text)

    async def post_notice(self, notice: Any) -> None:
        raise RuntimeError("HTTP 503 from Discord")


async def test_failed_send_ends_turn_with_delivered_text_kept() -> None:
    # covers D2, S15: a failed send is reported and the turn ends cleanly in one state
    raw = {"passes": [[{"at": 1, "text": "one "}, {"at": 2, "text": "two "},
                       {"at": 3, "text": "three"}, {"at": 4, "end": "completed"}]]}
    turn = _turn(raw, channel=FailingSendChannel())
    result = await turn.run()
    assert result.status == "error" and "503" in (result.error or "")
    assert result.text == "one two " and result.delivered_text == "one two "
    assert turn.lock.turn_kill is None and turn.lock.stream_kill is None


async def test_failed_notice_does_not_break_the_turn() -> None:
    # covers S12: a notice that cannot be posted is logged, the turn still ends TimedOut
    turn = _turn({"passes": [[{"at": 0, "stall": True}]]}, channel=FailingSendChannel())
    result = await turn.run()
    assert result.state == "TimedOut" and result.notices == []
