"""What Anthropic Messages requests carry and what its streams' less common shapes make of
the turn (issue 29's mutation run over providers/anthropic.py): the output limit nobody set,
call ids from other providers, a cut tool call, the usage counted. Each request and stream
goes over loopback HTTP through the real adapter."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from fsm.engine.provider import AbortSignal, HistoryEntry, KeepAlive, PassRequest, ReasoningState
from providers.factory import build_provider
from providers.replay_server import ReplayServer

from providers_support import OK_STREAMS, anthropic_sse, collect, config_for, run

pytestmark = pytest.mark.asyncio

QUESTION = [{"role": "user", "content": "alice: weather in Paris?"}]


async def sent_body(request: PassRequest, **overrides: Any) -> dict[str, Any]:
    async with ReplayServer(OK_STREAMS["anthropic"]) as server, \
            aiohttp.ClientSession() as session:
        provider = build_provider(config_for(server, "anthropic", **overrides), session)
        events = [e async for e in provider.stream(request, AbortSignal())]
    assert not any(type(e).__name__ == "ProviderError" for e in events), events
    [recorded] = server.requests
    body: dict[str, Any] = recorded.json()
    return body


def tool_block(index: int, call_id: str, *fragments: str,
               stop: bool = True) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"type": "content_block_start", "index": index,
                                     "content_block": {"type": "tool_use", "id": call_id,
                                                       "name": "get_weather", "input": {}}}]
    events += [{"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": f}} for f in fragments]
    if stop:
        events.append({"type": "content_block_stop", "index": index})
    return events


def ending(reason: str, **usage: int) -> list[dict[str, Any]]:
    return [{"type": "message_delta", "delta": {"stop_reason": reason}, "usage": usage},
            {"type": "message_stop"}]


async def test_without_an_output_limit_the_request_asks_for_4096_tokens() -> None:
    """covers P1: the Messages API requires `max_tokens`; with the limit configured away
    (`max_output_tokens: null`, which other APIs take as "no limit") the request asks for
    4,096."""
    body = await sent_body(PassRequest(context_items=QUESTION, function_history=[]),
                           max_output_tokens=None)
    assert body["max_tokens"] == 4096 and "thinking" not in body


async def test_call_ids_from_other_providers_are_made_safe_for_both_blocks() -> None:
    """covers T7, P3: a fallback's history may hold ids Anthropic refuses (another provider's
    `fc/1.a`); each unsafe character becomes `_`, the same in the call and its result."""
    entry = HistoryEntry(tool_name="get_weather", arguments={"city": "Paris"},
                         result={"forecast": "sunny"}, call_id="fc/1.a")
    body = await sent_body(PassRequest(context_items=QUESTION, function_history=[entry]))
    call, result = body["messages"][1]["content"][0], body["messages"][2]["content"][0]
    assert (call["type"], call["id"]) == ("tool_use", "fc_1_a")
    assert (result["type"], result["tool_use_id"]) == ("tool_result", "fc_1_a")


async def test_a_max_tokens_stop_cuts_the_last_call_even_when_it_parses() -> None:
    """covers T4, P6: on `max_tokens` the last tool block may have been cut where its JSON
    happened to close; it never runs, the call before it does, and the turn is no error."""
    script = anthropic_sse(*tool_block(0, "toolu_a", '{"city": "Oslo"}'),
                           *tool_block(1, "toolu_b", '{"city": "Rome"}'),
                           *ending("max_tokens", output_tokens=50))
    _, summary, _ = await run("anthropic", script)
    assert [(c.id, c.arguments, c.truncated) for c in summary.tool_calls] == [
        ("toolu_a", {"city": "Oslo"}, False), ("toolu_b", {"city": "Rome"}, True)]
    assert (summary.finish_reason, summary.error) == ("max_tokens", None)


async def test_thinking_stays_on_after_parallel_calls_with_one_signed_block() -> None:
    """covers P2, P5: after a turn of parallel calls, whose thinking rides on the first call
    only, the next request still has thinking on and sends that block back first."""
    thought = {"type": "thinking", "thinking": "Two cities.", "signature": "c2ln"}
    state = ReasoningState("anthropic:test-model", (thought,))
    calls = [HistoryEntry(tool_name="get_weather", arguments={"city": city},
                          result={"forecast": "sunny"}, call_id=f"toolu_{city}", batch="b1",
                          reasoning=state if city == "Oslo" else None)
             for city in ("Oslo", "Rome")]
    body = await sent_body(PassRequest(context_items=QUESTION, function_history=calls),
                           reasoning={"budget_tokens": 2048}, max_output_tokens=1000)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] == 3048
    turn = body["messages"][1]["content"]
    assert [block["type"] for block in turn] == ["thinking", "tool_use", "tool_use"]
    assert turn[0] == thought


async def test_an_image_by_url_goes_as_a_url_source() -> None:
    """covers R7, P3: an image the context names by URL is sent as Anthropic's `url`
    source beside its caption, not inlined and not dropped."""
    item = {"role": "user", "content": [{"type": "text", "text": "bob: look"},
                                        {"type": "image", "url": "https://x.example/cat.png"}]}
    body = await sent_body(PassRequest(context_items=[item], function_history=[]))
    assert body["messages"][0]["content"] == [
        {"type": "text", "text": "bob: look"},
        {"type": "image", "source": {"type": "url", "url": "https://x.example/cat.png"}}]


async def test_a_max_tokens_stop_cuts_a_lone_first_call() -> None:
    """covers T4, P6: the message's only block, a tool call at index 0 whose JSON closed,
    is cut by `max_tokens` like any last block."""
    script = anthropic_sse(*tool_block(0, "toolu_a", '{"city": "Oslo"}'),
                           *ending("max_tokens", output_tokens=50))
    _, summary, _ = await run("anthropic", script)
    [call] = summary.tool_calls
    assert (call.id, call.truncated) == ("toolu_a", True)


async def test_a_tool_block_never_closed_is_cut() -> None:
    """covers T4: a tool block with no `content_block_stop` before the message ended was cut
    mid-stream, even when its JSON so far parses; it never runs."""
    script = anthropic_sse(*tool_block(0, "toolu_a", '{"city": "Oslo"}', stop=False),
                           *ending("tool_use", output_tokens=20))
    _, summary, _ = await run("anthropic", script)
    [call] = summary.tool_calls
    assert (call.id, call.arguments, call.truncated) == ("toolu_a", {"city": "Oslo"}, True)


@pytest.mark.looptime
async def test_the_turn_ends_at_message_stop_though_the_server_keeps_the_stream_open() -> None:
    """covers S8, S5: `message_stop` ends the answer; a server (or proxy) that then holds the
    connection open does not keep the turn waiting into a stall error."""
    script = anthropic_sse({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": "Hi"}},
                           *ending("end_turn", output_tokens=1)) + b":@hang\n"
    async with ReplayServer(script) as server:
        _, summary = await collect(server, "anthropic", read_timeout_s=45)
    assert ("".join(summary.text), summary.finish_reason, summary.error) == ("Hi", "end_turn",
                                                                            None)


async def test_pings_reach_the_engine_as_liveness() -> None:
    """covers S5: Anthropic's `ping` events are liveness the engine's idle timer sees, never
    text."""
    script = anthropic_sse({"type": "ping"}, {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta", "text": "Hi"}},
                           {"type": "ping"}, *ending("end_turn"))
    events, summary, _ = await run("anthropic", script)
    assert events.count(KeepAlive("ping")) == 2 and "".join(summary.text) == "Hi"


async def test_an_error_event_in_its_own_words_keeps_its_first_200_characters() -> None:
    """covers S8: an `event: error` whose data is not Anthropic's error object (a proxy's
    own) ends the turn with the start of that data as the message, 200 characters."""
    data = '{"detail": "' + "upstream proxy failure; " * 20 + '"}'
    _, summary, _ = await run("anthropic", f"event: error\ndata: {data}\n\n".encode())
    assert summary.error is not None and summary.error.kind == "provider_stream_error"
    assert summary.error.message == data[:200]


async def test_a_stream_without_a_stop_reason_names_what_was_missing() -> None:
    """covers S8, S13: a Messages stream closed before any `message_delta` stop reason is an
    incomplete stream, and the error names what never came."""
    script = anthropic_sse({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": "cut"}})
    _, summary, _ = await run("anthropic", script)
    assert summary.error is not None and summary.error.type == "incomplete_stream"
    assert summary.error.message == "stream ended before message_delta with a stop reason"


async def test_thinking_opened_with_text_and_never_signed_goes_back_as_streamed() -> None:
    """covers P4, P5: a thinking block whose start already carries text, and that no
    `signature_delta` followed, is reasoning (not reply) and rides on the call exactly as
    streamed: its whole text and an empty signature."""
    script = anthropic_sse(
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "thinking", "thinking": "Let me"}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "thinking_delta", "thinking": " think."}},
        {"type": "content_block_stop", "index": 0},
        *tool_block(1, "toolu_a", "{}"), *ending("tool_use"))
    _, summary, _ = await run("anthropic", script)
    [call] = summary.tool_calls
    assert "".join(summary.reasoning) == "Let me think." and summary.text == []
    assert call.reasoning is not None
    assert call.reasoning.items == ({"type": "thinking", "thinking": "Let me think.",
                                     "signature": ""},)


async def test_a_tool_block_without_a_name_has_an_empty_name() -> None:
    """covers T4: a tool_use block that names no function still becomes a call with an empty
    name (the engine answers it as an unknown tool)."""
    script = anthropic_sse({"type": "content_block_start", "index": 0,
                            "content_block": {"type": "tool_use", "id": "toolu_a"}},
                           {"type": "content_block_stop", "index": 0}, *ending("tool_use"))
    _, summary, _ = await run("anthropic", script)
    [call] = summary.tool_calls
    assert (call.name, call.id, call.arguments) == ("", "toolu_a", {})


@pytest.mark.parametrize("block", [{"type": "redacted_thinking", "data": "ZW5j"},
                                   {"type": "redacted_thinking"}])
async def test_redacted_thinking_rides_on_the_call_as_streamed(block: dict[str, str]) -> None:
    """covers P5: a redacted_thinking block goes back with the call's turn carrying the data
    it streamed (none streamed: empty), never invented data."""
    script = anthropic_sse({"type": "content_block_start", "index": 0, "content_block": block},
                           {"type": "content_block_stop", "index": 0},
                           *tool_block(1, "toolu_a", "{}"), *ending("tool_use"))
    _, summary, _ = await run("anthropic", script)
    [call] = summary.tool_calls
    assert call.reasoning is not None
    assert call.reasoning.items == ({"type": "redacted_thinking", "data": block.get("data", "")},)


async def test_a_thinking_delta_without_its_block_start_is_still_reasoning() -> None:
    """covers P4, S8: a thinking delta for a block the stream never started (a proxy that
    dropped the start) is reasoning, and the turn still ends with its answer."""
    script = anthropic_sse({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "thinking_delta", "thinking": "Hmm."}},
                           {"type": "content_block_delta", "index": 1,
                            "delta": {"type": "text_delta", "text": "Yes."}},
                           *ending("end_turn"))
    _, summary, _ = await run("anthropic", script)
    assert ("".join(summary.reasoning), "".join(summary.text), summary.error) == (
        "Hmm.", "Yes.", None)


async def test_deltas_for_blocks_never_started_are_ignored() -> None:
    """covers S8, T4: a signature or argument fragment for a block the stream never started
    is dropped: no call is invented and the answer still arrives whole."""
    script = anthropic_sse({"type": "content_block_delta", "index": 5,
                            "delta": {"type": "signature_delta", "signature": "c2ln"}},
                           {"type": "content_block_delta", "index": 6,
                            "delta": {"type": "input_json_delta", "partial_json": "{}"}},
                           {"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": "Fine."}},
                           *ending("end_turn"))
    _, summary, _ = await run("anthropic", script)
    assert ("".join(summary.text), summary.tool_calls, summary.error) == ("Fine.", [], None)


async def test_a_later_message_delta_keeps_the_first_stop_reason() -> None:
    """covers P6, P7: a second `message_delta` that carries only usage (or no reason)
    neither replaces the stop reason nor loses its tokens."""
    script = anthropic_sse({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": "Hi"}},
                           {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                            "usage": {"output_tokens": 1}},
                           {"type": "message_delta", "delta": {"stop_reason": None},
                            "usage": {"output_tokens": 2}},
                           {"type": "message_stop"})
    _, summary, _ = await run("anthropic", script)
    assert (summary.finish_reason, summary.error) == ("end_turn", None)
    assert summary.as_json()["usage"] == {"output_tokens": 2}


async def test_a_refusal_keeps_the_explanation_anthropic_gave() -> None:
    """covers P6, G2: a `refusal` stop ends the turn blocked, and the error keeps the
    explanation in `stop_details` for the operator."""
    script = anthropic_sse({"type": "message_delta",
                            "delta": {"stop_reason": "refusal",
                                      "stop_details": {"explanation": "policy: weapons"}},
                            "usage": {"output_tokens": 3}}, {"type": "message_stop"})
    _, summary, _ = await run("anthropic", script)
    assert summary.error is not None
    assert (summary.error.kind, summary.error.type) == ("blocked", "refusal")
    assert summary.error.message == "the provider stopped the reply (refusal) (policy: weapons)"


async def test_cached_input_tokens_count_as_input() -> None:
    """covers P7: the prompt's cached parts (written and read) are input tokens too: the
    input counted is all three."""
    script = anthropic_sse({"type": "message_start", "message": {"usage": {
                               "input_tokens": 10, "cache_creation_input_tokens": 100,
                               "cache_read_input_tokens": 1000, "output_tokens": 1}}},
                           *ending("end_turn", output_tokens=7))
    _, summary, _ = await run("anthropic", script)
    assert summary.as_json()["usage"] == {"input_tokens": 1110, "output_tokens": 7}


async def test_a_max_tokens_stop_cuts_a_call_whose_events_carry_no_index() -> None:
    """covers T4: a proxy that drops `index` from the events: the one tool block is still
    the last one, so a `max_tokens` stop cuts it."""
    events = [{k: v for k, v in event.items() if k != "index"}
              for event in tool_block(0, "toolu_a", '{"city": "Oslo"}')]
    _, summary, _ = await run("anthropic", anthropic_sse(*events, *ending("max_tokens")))
    [call] = summary.tool_calls
    assert (call.id, call.arguments, call.truncated) == ("toolu_a", {"city": "Oslo"}, True)


async def test_blocks_whose_events_interleave_are_joined_by_their_index() -> None:
    # covers T4: each event names its block by `index`, so two tool blocks whose fragments
    # and stops arrive interleaved (the second started before the first ended) are still
    # two whole calls, each with its own arguments
    a = tool_block(1, "toolu_a", '{"city": ', '"Oslo"}')
    b = tool_block(2, "toolu_b", '{"city": ', '"Rome"}')
    script = anthropic_sse(a[0], a[1], b[0], b[1], a[2], b[2], a[3], b[3], *ending("tool_use"))
    _, summary, _ = await run("anthropic", script)
    assert [(c.id, c.arguments, c.truncated) for c in summary.tool_calls] == [
        ("toolu_a", {"city": "Oslo"}, False), ("toolu_b", {"city": "Rome"}, False)]


@pytest.mark.parametrize("dropped_from", ["every event", "the starts", "all but the starts",
                                          "every event, sent as true"])
async def test_blocks_whose_events_lose_their_index_stay_apart(dropped_from: str) -> None:
    # covers T4, P5: a proxy that drops `index` from every event, or only from the
    # blocks' starts, or from everything but the starts: the blocks still come one after
    # another, so each call keeps its own id and arguments, none is taken for cut, and the
    # signed thinking before them rides back on the first; an index that is not an integer
    # (`true`) is as good as none
    thinking = [{"type": "content_block_start", "index": 0,
                 "content_block": {"type": "thinking", "thinking": ""}},
                {"type": "content_block_delta", "index": 0,
                 "delta": {"type": "thinking_delta", "thinking": "Two cities."}},
                {"type": "content_block_delta", "index": 0,
                 "delta": {"type": "signature_delta", "signature": "sig-1"}},
                {"type": "content_block_stop", "index": 0}]
    events = [*thinking, *tool_block(1, "toolu_a", '{"city": ', '"Oslo"}'),
              *tool_block(2, "toolu_b", '{"city": ', '"Rome"}')]
    drops = {"every event": lambda kind: True,
             "the starts": lambda kind: kind == "content_block_start",
             "all but the starts": lambda kind: kind != "content_block_start",
             "every event, sent as true": lambda kind: True}[dropped_from]
    events = [{k: v for k, v in e.items() if k != "index" or not drops(e["type"])}
              for e in events]
    if dropped_from.endswith("as true"):
        events = [{**e, "index": True} for e in events]
    _, summary, _ = await run("anthropic", anthropic_sse(*events, *ending("tool_use")))
    assert [(c.id, c.arguments, c.truncated) for c in summary.tool_calls] == [
        ("toolu_a", {"city": "Oslo"}, False), ("toolu_b", {"city": "Rome"}, False)]
    first, second = summary.tool_calls
    assert first.reasoning is not None and second.reasoning is None
    assert first.reasoning.items == (
        {"type": "thinking", "thinking": "Two cities.", "signature": "sig-1"},)
    assert "".join(summary.reasoning) == "Two cities."


async def test_text_that_is_not_a_string_is_dropped() -> None:
    """covers S8: a text delta whose `text` is not a string (a broken proxy) adds nothing to
    the reply, and the rest of the answer arrives."""
    script = anthropic_sse({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": 42}},
                           {"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": "Hi"}}, *ending("end_turn"))
    _, summary, _ = await run("anthropic", script)
    assert ("".join(summary.text), summary.error) == ("Hi", None)
