"""Streams read right whatever the server's dialect (issue 25, items 4-7): think blocks in
the content, list-shaped content, every documented finish reason sorted (and the user told
when a reply is not an answer), usage wherever a server puts it. The recorded streams of
each server family are in tests/fixtures/sse/servers/ (cases.json names each one's public
source) and run through `test_providers_servers.py`; these tests cover the rules across
every split, every enum value and the engine's notice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsm.engine.generation import Attempt, run_generation_turn
from fsm.engine.prefill import TurnRequest
from fsm.engine.provider import (
    CUT_OFF_FINISHES,
    AbortSignal,
    Finish,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
)
from fsm.scenarios.scripted import InMemoryChannel
from providers.endings import ANTHROPIC, CHAT_COMPLETIONS, GEMINI, FinishReasons
from providers.factory import build_provider
from providers.replay_server import ReplayServer
from providers.stream_file import replay_request
from providers.think_tags import ThinkTags

from providers_support import (
    FIXTURES,
    anthropic_sse,
    channel_lock,
    config_for,
    run,
    serving,
    sse,
)

# --- 5: <think> blocks in the content ------------------------------------------------------

THOUGHT = "\nThe user greets me; greet back.\n"
REPLY = "<think>" + THOUGHT + "</think>\n\nHello <think> is a tag."


def through(filter_: ThinkTags, pieces: list[str]) -> tuple[str, str]:
    events: list[ProviderEvent] = []
    for piece in pieces:
        events += filter_.feed(TextDelta(piece))
    events += filter_.feed(Finish("stop")) + filter_.finish()
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    return text, thought


def test_a_leading_think_block_is_reasoning_at_every_split() -> None:
    """covers P4: wherever the stream cuts the block (inside either tag, between them), the
    thought goes to reasoning and the reply keeps only its text; a later tag is text."""
    for first in range(len(REPLY) + 1):
        for second in range(first, len(REPLY) + 1):
            pieces = [REPLY[:first], REPLY[first:second], REPLY[second:]]
            assert through(ThinkTags(), pieces) == ("Hello <think> is a tag.", THOUGHT), pieces


@pytest.mark.parametrize(("pieces", "text", "thought"), [
    (["<think>never", " closed"], "", "never closed"),
    (["<think>ends in a partial </thi"], "", "ends in a partial </thi"),
    (["  \n", "<think>x</think>", "y"], "y", "x"),
    (["<thi"], "<thi", ""),
    (["<thinking about it"], "<thinking about it", ""),
    (["Hi <think>x</think>"], "Hi <think>x</think>", ""),
    (["\n\nplain"], "\n\nplain", ""),
    (["Hello", " world", "  again"], "Hello world  again", ""),
])
def test_think_block_edges(pieces: list[str], text: str, thought: str) -> None:
    """covers P4: never closed is all reasoning; only a leading, exact tag counts."""
    assert through(ThinkTags(), pieces) == (text, thought)


@pytest.mark.asyncio
async def test_a_held_tag_start_released_by_a_heartbeat_keeps_the_text_after_it() -> None:
    """covers P4: a reply starting with `<` (it might open `<think>`) is held; a heartbeat
    before the next chunk releases it as text, and the text after it keeps its spaces."""
    script = sse({"choices": [{"index": 0, "delta": {"content": "<"}}]}) + b": ping\n\n" + \
        sse({"choices": [{"index": 0, "delta": {"content": " 3 is less than 4"},
                          "finish_reason": "stop"}]}, "[DONE]")
    _, summary, _ = await run("openai", script)
    assert ("".join(summary.text), "".join(summary.reasoning)) == ("< 3 is less than 4", "")


@pytest.mark.asyncio
async def test_each_thought_chunk_is_passed_on_as_it_arrives() -> None:
    # covers P4: inside a think block each chunk is reasoning the moment it arrives, whole;
    # only an end that could begin `</think>` waits for the next chunk
    chunks = ["<think>", "Paris", " is in France.", " </th", "ink>", "It is sunny."]
    script = sse(*({"choices": [{"index": 0, "delta": {"content": c}}]} for c in chunks),
                 {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "[DONE]")
    events, _, _ = await run("openai", script)
    said = [(type(e).__name__, e.text) for e in events
            if isinstance(e, (TextDelta, ReasoningDelta))]
    assert said == [("ReasoningDelta", "Paris"), ("ReasoningDelta", " is in France."),
                    ("ReasoningDelta", " "), ("TextDelta", "It is sunny.")]


@pytest.mark.asyncio
async def test_think_tags_are_a_per_provider_setting() -> None:
    """covers P4: `think_tags: false` keeps the content as the server sent it."""
    script = sse({"choices": [{"index": 0, "delta": {"content": "<think>x</think>y"},
                               "finish_reason": "stop"}]}, "[DONE]")
    async with ReplayServer(script) as on, ReplayServer(script) as off, \
            serving() as session:
        texts = []
        for server, setting in ((on, None), (off, False)):
            provider = build_provider(config_for(server, "openai", think_tags=setting), session)
            events = [e async for e in provider.stream(replay_request(), AbortSignal())]
            texts.append("".join(e.text for e in events if isinstance(e, TextDelta)))
    assert texts == ["y", "<think>x</think>y"]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_never_closed_think_block_posts_no_thought() -> None:
    """covers P4, G1: all thought and no answer is an empty reply: the fallback answers and
    nothing of the thought reaches the channel."""
    thinking = ReplayServer(sse({"choices": [{"index": 0, "delta": {"content": "<think>mine"},
                                              "finish_reason": "stop"}]}, "[DONE]"))
    healthy = ReplayServer(sse({"choices": [{"index": 0, "delta": {"content": "Hello."},
                                             "finish_reason": "stop"}]}, "[DONE]"))
    async with serving(thinking, healthy) as session:
        locks, lock = channel_lock()
        channel = InMemoryChannel()
        result = await run_generation_turn(
            [Attempt(build_provider(config_for(thinking, "openai"), session), "r1"),
             Attempt(build_provider(config_for(healthy, "openai"), session), "fallback")],
            channel=channel, locks=locks, lock=lock, request=TurnRequest())
    assert [a.status for a in result.attempts] == ["empty_response", "completed"]
    assert channel.text == "Hello." and result.attempts[0].passes[0].reasoning == "mine"


# --- 6: every finish reason sorted ---------------------------------------------------------

GEMINI_ENUM = {
    "STOP": None, "MAX_TOKENS": "truncated", "SAFETY": "blocked", "RECITATION": "blocked",
    "LANGUAGE": "LANGUAGE", "OTHER": "OTHER", "BLOCKLIST": "blocked",
    "PROHIBITED_CONTENT": "blocked", "SPII": "blocked",
    "MALFORMED_FUNCTION_CALL": "MALFORMED_FUNCTION_CALL", "IMAGE_SAFETY": "blocked",
    "IMAGE_PROHIBITED_CONTENT": "blocked", "IMAGE_RECITATION": "blocked",
    "IMAGE_OTHER": "IMAGE_OTHER", "NO_IMAGE": "NO_IMAGE",
    "UNEXPECTED_TOOL_CALL": "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS":
    "TOO_MANY_TOOL_CALLS", "MISSING_THOUGHT_SIGNATURE": "MISSING_THOUGHT_SIGNATURE",
    "MALFORMED_RESPONSE": "MALFORMED_RESPONSE",
    "FINISH_REASON_UNSPECIFIED": "FINISH_REASON_UNSPECIFIED", "A_FUTURE_REASON":
    "A_FUTURE_REASON",
}
"""Gemini's whole `FinishReason` enum (google-genai types.FinishReason, @google/genai 2.12),
and one word no version has: None is an answer, else the error type it becomes."""
ANTHROPIC_STOPS = {
    "end_turn": None, "stop_sequence": None, "tool_use": None, "max_tokens": "truncated",
    "pause_turn": "truncated", "refusal": "blocked",
    "model_context_window_exceeded": "context_length_exceeded", "a_future_reason":
    "a_future_reason",
}
CHAT_FINISHES = {
    "stop": None, "tool_calls": None, "function_call": None, "eos_token": None,
    "stop_sequence": None, "length": "truncated", "content_filter": "blocked",
    "model_length": "context_length_exceeded", "error": "error",
    "insufficient_system_resource": "insufficient_system_resource", "abort": "abort",
    "repetition": "repetition", "a_future_reason": "a_future_reason",
}


def ending_stream(kind: str, reason: str) -> bytes:
    if kind == "gemini":
        return sse({"candidates": [{"content": {"parts": [{"text": "Part"}]},
                                    "finishReason": reason, "index": 0}],
                    "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1}})
    if kind == "anthropic":
        return anthropic_sse(
            {"type": "content_block_start", "index": 0,
             "content_block": {"type": "text", "text": "Part"}},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": reason},
             "usage": {"output_tokens": 1}},
            {"type": "message_stop"})
    return sse({"choices": [{"index": 0, "delta": {"content": "Part"}}]},
               {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]},
               {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
               "[DONE]")


@pytest.mark.asyncio
@pytest.mark.parametrize(("kind", "reason", "expected"), [
    *(("gemini", r, e) for r, e in GEMINI_ENUM.items()),
    *(("anthropic", r, e) for r, e in ANTHROPIC_STOPS.items()),
    *(("openai", r, e) for r, e in CHAT_FINISHES.items()),
])
async def test_every_finish_reason_is_an_answer_or_an_error(kind: str, reason: str,
                                                           expected: str | None) -> None:
    """covers P6, P7: through the real client, each documented word is complete, truncated,
    blocked or an error (an unknown word too); the usage is counted and the provider's word
    kept whatever the ending."""
    _, summary, _ = await run(kind, ending_stream(kind, reason))
    assert summary.finish_reason == reason and summary.usage is not None
    assert "".join(summary.text) == "Part"
    if expected is None:
        assert summary.error is None
        return
    assert summary.error is not None
    wanted_kind = "blocked" if expected == "blocked" else "provider_stream_error"
    wanted_type = reason if expected == "blocked" else expected
    assert (summary.error.kind, summary.error.type) == (wanted_kind, wanted_type)


@pytest.mark.parametrize("table", [GEMINI, ANTHROPIC, CHAT_COMPLETIONS])
def test_the_tables_sort_each_documented_word_once(table: FinishReasons) -> None:
    """covers P6: no word is in two classes, so its meaning is never ambiguous."""
    classes = [table.complete, table.truncated, table.context, table.blocked, table.error]
    words = [word for words in classes for word in words]
    assert len(words) == len(set(words))


@pytest.mark.parametrize("table", [GEMINI, ANTHROPIC, CHAT_COMPLETIONS])
def test_every_cut_off_word_is_one_the_engine_knows(table: FinishReasons) -> None:
    """covers P6, T10: a pass a limit cut off is never taken for a finished one."""
    assert table.truncated | table.context <= CUT_OFF_FINISHES


def test_the_gemini_table_covers_the_whole_enum() -> None:
    """covers P6: every value of Gemini's enum is sorted explicitly."""
    assert all(GEMINI.known(word) for word in GEMINI_ENUM if word != "A_FUTURE_REASON")


@pytest.mark.asyncio
@pytest.mark.parametrize(("kind", "reason", "notice"), [
    ("gemini", "OTHER", "failed_other"),
    ("gemini", "SAFETY", "failed_blocked"),
    ("anthropic", "max_tokens", "failed_other"),
    ("anthropic", "model_context_window_exceeded", "failed_context_too_long"),
    ("openai", "content_filter", "failed_blocked"),
    ("openai", "length", "failed_other"),
    ("openai", "a_future_reason", "failed_other"),
])
@pytest.mark.looptime
async def test_a_reply_that_is_not_an_answer_tells_the_user(kind: str, reason: str,
                                                            notice: str) -> None:
    """covers P6, G2: the delivered part stays, the turn is not `completed`, and the user gets
    the notice of its kind (the engine's existing notices)."""
    server = ReplayServer(ending_stream(kind, reason))
    async with serving(server) as session:
        locks, lock = channel_lock()
        channel = InMemoryChannel()
        result = await run_generation_turn(
            [Attempt(build_provider(config_for(server, kind), session), "only")],
            channel=channel, locks=locks, lock=lock, request=TurnRequest())
    assert result.status == "error" and channel.text == "Part"
    assert [n.kind for n in channel.notices] == [notice]
    assert result.attempts[0].passes[-1].usage is not None


# --- 4: list-shaped content -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_list_content_keeps_text_chunks_and_skips_others() -> None:
    """covers P4: in a list-shaped delta only text chunks are reply text and thinking chunks
    reasoning; a reference chunk, an image or a chunk of an unknown type is neither, and a
    malformed chunk does not break the stream."""
    content: list[Any] = [
        {"type": "thinking", "thinking": [{"type": "text", "text": "a"}, {"type": "x"}]},
        {"type": "reference", "reference_ids": [1]}, {"type": "text", "text": "b"}, 7, None,
        {"type": "text", "text": 5}, {"type": "thinking", "thinking": "c"}]
    script = sse({"choices": [{"index": 0, "delta": {"content": content}}]},
                 {"choices": [{"index": 0, "delta": {"content": "d"}, "finish_reason": "stop"}]},
                 "[DONE]")
    _, summary, _ = await run("openai", script)
    assert ("".join(summary.text), "".join(summary.reasoning)) == ("bd", "ac")
    assert summary.error is None


# --- 7: usage wherever it is ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_usage_after_an_anthropic_refusal_is_counted_by_the_engine() -> None:
    """covers P7: the refusal's final message_delta output count reaches the pass result."""
    server = ReplayServer(ending_stream("anthropic", "refusal"))
    async with serving(server) as session:
        locks, lock = channel_lock()
        result = await run_generation_turn(
            [Attempt(build_provider(config_for(server, "anthropic"), session), "claude")],
            channel=InMemoryChannel(), locks=locks, lock=lock, request=TurnRequest())
    assert result.attempts[0].passes[-1].usage == {"output_tokens": 1}


def test_cases_name_their_public_source() -> None:
    """covers P1: every recorded server stream names the public document it follows."""
    cases = json.loads((FIXTURES / "servers" / "cases.json").read_text())
    new = {name: case for name, case in cases.items() if "source" in case}
    assert len(new) >= 21
    assert all(case["source"].strip() and case["server"].strip() for case in new.values())
