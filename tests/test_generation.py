"""The generation turn around the loop (SPEC G1, G2), with scripted providers on a virtual
clock. The same chain over real HTTP is tested with the provider clients."""

from __future__ import annotations

from typing import Any

import pytest

from fsm.engine.config import TurnConfig
from fsm.engine.generation import Attempt, run_generation_turn, should_fall_back
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.stash import ContextStash
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider, ScriptedTools

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


def _provider(*passes: list[dict[str, Any]]) -> ScriptedProvider:
    return ScriptedProvider(parse_scenario({"passes": list(passes)}).passes)


async def _run(attempts: list[Attempt], tools: dict[str, Any] | None = None,
               **config: Any) -> tuple[Any, InMemoryChannel]:
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "gen")
    assert lock is not None
    channel = InMemoryChannel()
    stash = ContextStash()
    registry = ScriptedTools(parse_scenario({"tools": tools or {}}).tools, stash, {}).registry
    result = await run_generation_turn(attempts, channel=channel, locks=locks, lock=lock,
                                       request=TurnRequest(), config=TurnConfig(**config),
                                       tools=registry, stash=stash)
    locks.release(lock)
    return result, channel


STALL = [{"at": 1, "text": "Partial answer"}, {"at": 2, "stall": True}]


async def test_fallback_continues_from_delivered_text_with_errors_suppressed() -> None:
    # covers G1, S1, S12
    primary = _provider(STALL)
    fallback = _provider([{"at": 1, "text": " and the rest."}, {"at": 2, "end": "completed"}])
    result, channel = await _run([Attempt(primary, "primary"), Attempt(fallback, "fb")])
    assert result.status == "completed"
    assert [a.status for a in result.attempts] == ["timeout", "completed"]
    assert result.attempts[0].deferred_notice == "timeout_idle"
    assert channel.notices == [] and result.deferred_notice_posted is None
    assert fallback.requests[0].prefill == "Partial answer"
    assert fallback.requests[0].tail[-1] == {"kind": "prefill", "role": "assistant",
                                             "content": "Partial answer"}
    assert result.delivered_text == "Partial answer and the rest."


async def test_every_attempt_failing_names_the_last_failure_once() -> None:
    # covers G2, S12: the primary's deferred timeout notice is cleared by the fallback,
    # whose own failure is what the user is told
    primary = _provider([{"at": 0, "stall": True}])
    fallback = _provider([{"at": 1, "error": "overloaded"}])
    result, channel = await _run([Attempt(primary, "primary"), Attempt(fallback, "fb")])
    assert result.status == "error"
    assert result.attempts[0].deferred_notice == "timeout_first_token"
    assert [n.kind for n in channel.notices] == ["failed_other"]
    assert result.deferred_notice_posted is None


async def test_last_attempt_timing_out_posts_only_its_own_notice() -> None:
    # covers G2 (once): the final attempt's own timeout notice is not doubled
    result, channel = await _run([Attempt(_provider(STALL), "a"),
                                  Attempt(_provider(STALL), "b")])
    assert [n.kind for n in channel.notices] == ["timeout_idle"]
    assert result.deferred_notice_posted is None


async def test_completed_tool_calls_are_named_to_the_replacement_attempt() -> None:
    # covers G1, S1 (the prefill folded into the replayed call's turn, not repeated at the
    # end; the request-only notice last), R10 (no restart replay)
    primary = _provider([{"at": 1, "tool_call": {"name": "weather", "args": {"city": "Oslo"}}}],
                        [{"at": 1, "text": "It is"}, {"at": 2, "error": "server_error"}])
    fallback = _provider([{"at": 1, "text": " cold."}, {"at": 2, "end": "completed"}])
    result, _ = await _run([Attempt(primary, "primary"), Attempt(fallback, "fb")],
                           tools={"weather": [{"after": 1, "success": True, "data": {"c": -3}}]})
    request = fallback.requests[0]
    kinds = [item["kind"] for item in request.tail]
    assert kinds == ["tool_history", "notice"]
    assert "weather" in request.tail[1]["content"] and "Oslo" in request.tail[1]["content"]
    assert request.function_history[0].pre_tool_text == "It is"
    assert request.prefill == "" and result.status == "completed"


async def test_attempts_with_the_same_label_keep_their_calls_apart() -> None:
    # covers G1, T7: a fallback onto the same provider and model (two endpoints, one label)
    # is a turn of its own: its id differs (its journal does not overwrite the first's), and
    # the call it makes is not merged into the replayed call's model turn
    primary = _provider([{"at": 1, "tool_call": {"name": "weather", "args": {"city": "Oslo"}}}],
                        [{"at": 1, "error": "server_error"}])
    fallback = _provider([{"at": 1, "tool_call": {"name": "weather", "args": {"city": "Rome"}}}],
                         [{"at": 1, "text": "Cold and warm."}, {"at": 2, "end": "completed"}])
    result, _ = await _run([Attempt(primary, "openai:m"), Attempt(fallback, "openai:m")],
                           tools={"weather": [{"success": True, "data": {"c": 1}}] * 2})
    assert result.status == "completed"
    oslo, rome = fallback.requests[1].function_history
    assert oslo.batch is not None and rome.batch is not None and oslo.batch != rome.batch


async def test_kill_or_tool_loop_failure_does_not_fall_back() -> None:
    # covers G1: only a model failure moves to the next attempt
    fallback = _provider([{"at": 1, "text": "never"}])
    result, _ = await _run(
        [Attempt(_provider([{"at": 1, "tool_call": {"name": "x"}}]), "a"),
         Attempt(fallback, "b")],
        max_consecutive_tool_errors=1)
    assert result.status == "error" and len(result.attempts) == 1 and fallback.calls == 0
    assert not should_fall_back(result.attempts[0])


async def test_each_attempt_journals_and_replays_with_its_prefill_and_calls() -> None:
    # covers G1 with the journal rule: every live attempt replays to the same result
    from fsm.engine.turn import Turn
    from fsm.journal import JournalRecorder, journal_document
    from fsm.review.replay import replay_on_loop

    primary = _provider([{"at": 1, "tool_call": {"name": "weather", "args": {"city": "Oslo"}}}],
                        [{"at": 1, "text": "It is"}, {"at": 2, "stall": True}])
    fallback = _provider([{"at": 1, "text": " cold."}, {"at": 2, "end": "completed"}])
    recorded: list[tuple[Turn, JournalRecorder]] = []
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "gen")
    assert lock is not None
    stash = ContextStash()
    tools = ScriptedTools(parse_scenario({"tools": {"weather": [
        {"after": 1, "success": True, "data": {"c": -3}}]}}).tools, stash, {}).registry

    def on_attempt(turn: Turn) -> None:
        recorder = JournalRecorder(turn.turn_id, turn.config, tools, request=turn.request)
        turn.recorder = recorder
        recorded.append((turn, recorder))

    result = await run_generation_turn(
        [Attempt(primary, "primary"), Attempt(fallback, "fb")], channel=InMemoryChannel(),
        locks=locks, lock=lock, request=TurnRequest(), tools=tools, stash=stash,
        on_attempt=on_attempt)
    assert result.status == "completed" and len(recorded) == 2
    for turn, recorder in recorded:
        document = journal_document(recorder.scenario(), turn.transitions,
                                    turn.result().as_dict())
        assert await replay_on_loop(document, turn.turn_id) is None
    assert recorded[1][1].scenario()["request"]["prefill"] == "It is"
