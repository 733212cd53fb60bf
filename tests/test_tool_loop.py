"""The tool loop around the passes (SPEC T1-T8) beyond the scenario files."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.provider import PassRequest
from fsm.engine.tools import FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider
from providers.anthropic import anthropic_messages
from providers.context import normalize_items
from providers.openai import chat_messages

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def test_pre_tool_text_kept_on_the_history_entry() -> None:
    # covers T7
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "text": "Let me check. "},
                    {"at": 2, "tool_call": {"name": "weather", "args": {"city": "Oslo"}}}],
                   [{"at": 1, "text": "Snowing."}, {"at": 2, "end": "completed"}]],
        "tools": {"weather": [{"after": 1, "success": True, "data": {"sky": "snow"}}]},
    }))
    second_request = played.provider.requests[1]
    [entry] = second_request.function_history
    assert entry.tool_name == "weather" and entry.pre_tool_text == "Let me check. "
    assert entry.arguments == {"city": "Oslo"}
    assert entry.result == {"success": True, "data": {"sky": "snow"}}


async def test_parallel_calls_of_one_pass_share_a_batch_and_go_back_as_one_turn() -> None:
    # covers T7, T5: the calls one pass made together are one model turn in the history
    # (the pre-tool text once, every call, then every result), each later pass's its own;
    # OpenAI-style messages and Anthropic's blocks are built that way from the same entries
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "text": "Checking both. "},
                    {"at": 2, "tool_calls": [{"name": "weather", "args": {"city": "Oslo"}},
                                             {"name": "weather", "args": {"city": "Rome"}}]}],
                   [{"at": 1, "tool_call": {"name": "weather", "args": {"city": "Bern"}}}],
                   [{"at": 1, "text": "Done."}, {"at": 2, "end": "completed"}]],
        "tools": {"weather": [{"success": True, "data": {"sky": "sun"}}] * 3},
    }))
    history = played.provider.requests[2].function_history
    oslo, rome, bern = history
    assert oslo.batch == rome.batch != bern.batch and bern.batch is not None
    assert (oslo.pre_tool_text, rome.pre_tool_text) == ("Checking both. ", "")
    request = PassRequest(context_items=[{"role": "user", "content": "weather?"}],
                          function_history=history)
    messages = chat_messages(request)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool",
                                             "assistant", "tool"]
    assert messages[1]["content"] == "Checking both. "
    assert [c["function"]["arguments"] for c in messages[1]["tool_calls"]] == [
        '{"city": "Oslo"}', '{"city": "Rome"}']
    blocks = anthropic_messages(request, normalize_items(request.context_items))
    assert [m["role"] for m in blocks] == ["user", "assistant", "user", "assistant", "user"]
    assert [b["type"] for b in blocks[1]["content"]] == ["text", "tool_use", "tool_use"]
    assert [b["type"] for b in blocks[2]["content"]] == ["tool_result", "tool_result"]


async def test_turn_result_carries_passes_text_and_thoughts() -> None:
    # covers T8
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "tool_call": {"name": "t"}}],
                   [{"at": 1, "text": "Answer."}, {"at": 2, "end": "completed"}]],
        "tools": {"t": [{"after": 0, "success": True, "data": 1}]},
    }))
    result = played.result
    assert [p.status for p in result.passes] == ["function_call", "completed"]
    assert result.text == "Answer." and result.thoughts["owner"] == "assistant"
    assert result.as_dict()["passes"] == 2


class CityArgs(BaseModel):
    city: str


async def _weather(args: CityArgs, ctx: ToolContext) -> ToolResult:
    return ToolResult.ok({"city": args.city})


def _turn_with(registry: ToolRegistry, passes: list[Any]) -> Turn:
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "t")
    assert lock is not None
    scenario = parse_scenario({"passes": passes})
    return Turn(provider=ScriptedProvider(scenario.passes), channel=InMemoryChannel(),
                locks=locks, lock=lock, tools=registry)


async def test_bad_arguments_are_a_failed_result_the_model_sees() -> None:
    # covers T6 (bad input: arguments of the wrong type never crash the turn)
    registry = ToolRegistry([FunctionTool("weather", "w", CityArgs, _weather)])
    turn = _turn_with(registry, [
        [{"at": 1, "tool_call": {"name": "weather", "args": {"city": 5}}}],
        [{"at": 1, "tool_call": {"name": "weather", "args": ["Oslo"]}}],
        [{"at": 1, "tool_call": {"name": "weather", "args": {"city": "Oslo"}}}],
        [{"at": 1, "text": "ok"}, {"at": 2, "end": "completed"}],
    ])
    result = await turn.run()
    assert result.status == "completed" and result.consecutive_tool_errors == 0
    first, second, third = turn.function_history
    assert not first.success and "city" in first.result["error"]
    assert not second.success and "expected an object" in second.result["error"]
    assert third.success and third.result["data"] == {"city": "Oslo"}


async def test_tool_returning_garbage_is_a_failed_result() -> None:
    # covers T5, T6
    async def broken(args: CityArgs, ctx: ToolContext) -> ToolResult:
        return "not a result"  # type: ignore[return-value]

    registry = ToolRegistry([FunctionTool("weather", "w", CityArgs, broken)])
    turn = _turn_with(registry, [
        [{"at": 1, "tool_call": {"name": "weather", "args": {"city": "Oslo"}}}],
        [{"at": 1, "end": "completed"}],
    ])
    await turn.run()
    assert "not a tool result" in turn.function_history[0].result["error"]


async def test_refused_guarded_call_says_not_available_for_the_turn() -> None:
    # covers R8, T6
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "tool_call": {"name": "process_gif"}}],
                   [{"at": 1, "tool_call": {"name": "process_gif"}}],
                   [{"at": 1, "end": "completed"}]],
        "tools": {"process_gif": {"guard": "gif", "outcomes": [
            {"after": 0, "success": True,
             "data": {"type": "context_restart_gif",
                      "enhanced_context_item": {"role": "user", "content": "<frames>"}}}]}},
    }))
    entry = played.turn.function_history[0]
    assert entry.result["error"] == "process_gif is not available for the current turn"
    assert "provider" not in entry.result["error"]
    second_tools = [t["name"] for t in played.provider.requests[1].tools]
    assert "process_gif" not in second_tools  # availability check reads the flag too


async def test_text_before_a_restart_call_is_not_lost_to_the_next_pass() -> None:
    # covers T7 with R10 (drafting off: the restart call has no history entry to carry it)
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "text": "Let me look."},
                    {"at": 2, "tool_call": {"name": "process_gif"}}],
                   [{"at": 1, "text": "A cat."}, {"at": 2, "end": "completed"}]],
        "tools": {"process_gif": {"guard": "gif", "outcomes": [
            {"after": 0, "success": True,
             "data": {"type": "context_restart_gif",
                      "enhanced_context_item": {"role": "user", "content": "<frames>"}}}]}},
    }))
    second = played.provider.requests[1]
    assert second.function_history == []
    assert any("Let me look." in notice for notice in second.request_notices)
    assert [item["kind"] for item in second.tail] == ["notice"]
    assert played.result.context_items_added == 1
