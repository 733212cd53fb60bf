"""TomoriBot parity of the tool loop (issue 15 items 2, 5, 6 and 9, issue 12's unread tool
results): where the prefill sits after a tool call, what a history entry keeps, the
per-tool loop policy, and that the registry pins no result. Virtual time."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from fsm.engine.config import TurnConfig
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest, fold_into_history
from fsm.engine.provider import HistoryEntry
from fsm.engine.tools import AnyArgs, FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider
from providers.openai import chat_messages

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


def _entry(pre_tool_text: str = "") -> HistoryEntry:
    return HistoryEntry(tool_name="t", arguments={}, result={"success": True},
                        pre_tool_text=pre_tool_text)


async def test_the_prefill_folds_into_the_first_tool_call_turn_only() -> None:
    # covers S1
    first, second = _entry("I'll check. "), _entry("And this. ")
    folded, trailing = fold_into_history([first, second], "Tomori: ")
    assert [e.pre_tool_text for e in folded] == ["Tomori: I'll check. ", "And this. "]
    assert trailing == "" and first.pre_tool_text == "I'll check. "
    assert fold_into_history([], "Tomori: ") == ([], "Tomori: ")
    assert fold_into_history([_entry()], "  ")[0][0].pre_tool_text == ""


async def test_after_a_tool_call_the_prefill_is_not_repeated_at_the_end() -> None:
    # covers S1, T7: the model is not told to continue text that came before its own call;
    # on the wire (the OpenAI adapter) the request ends with the tool result, and the
    # tool-call turn carries the prefill and the pre-tool text
    played = await play(parse_scenario({
        "request": {"prefill": "Tomori: "},
        "passes": [[{"at": 1, "text": "Let me look. "},
                    {"at": 2, "tool_call": {"name": "weather", "args": {"city": "Oslo"}}}],
                   [{"at": 1, "text": "Snow."}, {"at": 2, "end": "completed"}]],
        "tools": {"weather": [{"after": 0, "success": True, "data": {"sky": "snow"}}]},
    }))
    first, second = played.provider.requests
    assert first.tail[-1] == {"kind": "prefill", "role": "assistant", "content": "Tomori: "}
    assert second.prefill == "" and [i["kind"] for i in second.tail] == ["tool_history"]
    assert second.function_history[0].pre_tool_text == "Tomori: Let me look. "
    messages = chat_messages(second)
    assert messages[-1]["role"] == "tool"
    assert [m.get("content") for m in messages if m["role"] == "assistant"] == [
        "Tomori: Let me look. "]


async def test_whitespace_pre_tool_text_is_not_kept_and_a_cut_call_shows_no_arguments() -> None:
    # covers T7, T4: Anthropic rejects whitespace-only text blocks; the model is not shown
    # a call it did not make
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "text": " \n\n "},
                    {"at": 2, "tool_call": {"name": "weather", "args": {"city": "Os"},
                                            "truncated": True}}],
                   [{"at": 1, "text": "Sorry."}, {"at": 2, "end": "completed"}]],
        "tools": {"weather": [{"after": 0, "success": True, "data": {}}]},
    }))
    [entry] = played.provider.requests[1].function_history
    assert entry.pre_tool_text == "" and entry.arguments == {} and not entry.success


async def test_user_errors_off_silences_still_working_and_the_iteration_cap() -> None:
    # covers T1, G2: no user-facing error notice of any kind with user errors off; with
    # them on, still working comes once, before the 21st call (iteration index 20)
    steps = [[{"at": 1, "tool_call": {"name": "t"}}]] * 22
    tools = {"t": [{"success": True, "data": {}}] * 22}
    quiet = await play(parse_scenario({"passes": steps, "tools": tools, "config": {
        "max_iterations": 22, "surface_user_errors": False}}))
    assert quiet.result.status == "timeout" and quiet.channel.notices == []
    loud = await play(parse_scenario({"passes": steps, "tools": tools,
                                      "config": {"max_iterations": 22}}))
    assert [n.kind for n in loud.channel.notices] == ["still_working", "max_iterations"]
    assert loud.turn.transitions[-1]["event"] == "iteration_cap"
    twenty = await play(parse_scenario({"passes": steps, "tools": tools,
                                        "config": {"max_iterations": 20}}))
    assert [n.kind for n in twenty.channel.notices] == ["max_iterations"]  # no 21st call


class _Marker:
    """A result the registry must not keep alive once the turn is gone."""


async def test_the_registry_pins_no_tool_result() -> None:
    # covers R3 (no multi-megabyte payload pinned in a history of results), issue 12: the
    # last 1,000 results were kept and never read
    held = [_Marker()]
    ref = weakref.ref(held[0])

    async def run(_args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        return ToolResult.ok({"blob": held.pop()})

    registry = ToolRegistry([FunctionTool("big", "returns a big result", AnyArgs, run)])
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "t")
    assert lock is not None
    passes = parse_scenario({"passes": [[{"at": 1, "tool_call": {"name": "big"}}],
                                        [{"at": 1, "end": "completed"}]]}).passes
    turn = Turn(provider=ScriptedProvider(passes), channel=InMemoryChannel(), locks=locks,
                lock=lock, tools=registry, config=TurnConfig())
    await turn.run()
    del turn
    gc.collect()
    assert ref() is None and registry.names() == ["big"]


def _loop_scenario(loop: str, text: str) -> dict[str, Any]:
    first: list[dict[str, Any]] = [{"at": 1, "text": text}] if text else []
    return {"passes": [[*first, {"at": 2, "tool_calls": [{"name": "save"}, {"name": "note"}]}],
                       [{"at": 1, "text": "more"}, {"at": 2, "end": "completed"}]],
            "tools": {"save": {"loop": loop, "outcomes": [{"success": True, "data": {}}]},
                      "note": [{"after": 1, "success": True, "data": {}}]}}


async def test_a_policy_ending_the_turn_still_runs_the_rest_of_its_batch() -> None:
    # covers T9, T7 (calls of one pass run in order)
    played = await play(parse_scenario(_loop_scenario("ends_turn", "")))
    assert played.result.status == "completed" and played.provider.calls == 1
    assert played.result.function_history == ["save", "note"]
    assert played.turn.transitions[-1]["event"] == "tool_ended_turn"


async def test_without_a_declaration_the_loop_starts_the_next_pass() -> None:
    # covers T9 (defaults keep today's behaviour)
    for loop in ("next_pass", "end_after_pre_tool_text"):
        played = await play(parse_scenario(_loop_scenario(loop, "")))
        assert played.provider.calls == 2 and played.result.text == "more", loop
    ended = await play(parse_scenario(_loop_scenario("end_after_pre_tool_text", "Saved!")))
    assert ended.provider.calls == 1 and ended.result.text == "Saved!"


async def test_a_failing_policy_tool_does_not_end_the_turn() -> None:
    # covers T9, T6: only a success ends the turn; a failure the model sees
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "tool_call": {"name": "send"}}],
                   [{"at": 1, "text": "It failed, sorry."}, {"at": 2, "end": "completed"}]],
        "tools": {"send": {"loop": "ends_turn", "outcomes": [{"success": False,
                                                             "error": "no"}]}},
    }))
    assert played.provider.calls == 2 and played.result.text == "It failed, sorry."


async def test_an_empty_first_pass_is_still_an_empty_response() -> None:
    # covers T10: only a pass after a tool, in a turn that delivered text, completes
    played = await play(parse_scenario({"passes": [[{"at": 1, "end": "empty"}]]}))
    assert played.result.status == "empty_response"
    prefilled = await play(parse_scenario({
        "request": {"prefill": "Earlier: "},
        "passes": [[{"at": 1, "tool_call": {"name": "t"}}], [{"at": 1, "end": "empty"}]],
        "tools": {"t": [{"success": True, "data": {}}]}}))
    assert prefilled.result.status == "empty_response"  # nothing delivered in this turn


async def test_the_turn_request_default_carries_no_prefill() -> None:
    # covers S1 (no prefill: nothing to fold, nothing trailing)
    assert fold_into_history([_entry("x")], TurnRequest().prefill)[1] == ""


@pytest.mark.parametrize("finish", ["length", "max_tokens", "MAX_TOKENS", "pause_turn",
                                    "model_length", "model_context_window_exceeded"])
async def test_a_token_capped_empty_pass_after_a_tool_is_no_answer(finish: str) -> None:
    # covers T10: the pass after the tool spent its output budget thinking and said nothing;
    # the pre-tool line alone is not the reply (TomoriBot: `empty_response`), so a fallback
    # may still answer
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "text": "Checking."}, {"at": 2, "tool_call": {"name": "t"}}],
                   [{"at": 1, "reasoning": "Let me think about the weather in Oslo..."},
                    {"at": 2, "finish": finish}, {"at": 2, "end": "empty"}]],
        "tools": {"t": [{"success": True, "data": {}}]}}))
    assert played.result.status == "empty_response"
    assert played.turn.transitions[-1]["event"] == "empty"
    assert played.result.passes[-1].finish_reason == finish


async def test_an_empty_pass_that_finished_cleanly_still_keeps_the_delivered_text() -> None:
    # covers T10: a clean finish after the delivered text is the reply it already gave
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "text": "Checking."}, {"at": 2, "tool_call": {"name": "t"}}],
                   [{"at": 1, "finish": "stop"}, {"at": 1, "end": "empty"}]],
        "tools": {"t": [{"success": True, "data": {}}]}}))
    assert played.result.status == "completed" and played.result.text == "Checking."
