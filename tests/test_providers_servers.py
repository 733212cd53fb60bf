"""Streams modelled on real servers' documented behaviour (tests/fixtures/sse/servers/),
replayed over loopback HTTP through the real adapters: the endings that are not clean ends,
heartbeats, rate limits versus quota, tool-call identity, Anthropic's refusal and window
stops, Gemini's candidates and Vertex's streamed arguments (issue 14, items 1-8)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsm.engine.provider import Finish, KeepAlive, TextDelta
from providers.errors import error_details, http_error
from providers.replay_server import ReplayServer
from providers.stream_file import stream_file
from providers.stream_filters import LeadingBlank

from providers_support import FIXTURES, assert_matches_expected, collect, run, sse

SERVERS = FIXTURES / "servers"
CASES: dict[str, dict[str, Any]] = json.loads((SERVERS / "cases.json").read_text())
META_KEYS = {"format", "server", "source", "notes"}


def recording(name: str) -> bytes:
    return (SERVERS / f"{name}.sse").read_bytes()


@pytest.mark.asyncio
@pytest.mark.parametrize("name", sorted(CASES))
async def test_recorded_server_stream(name: str) -> None:
    """covers S8, S4, T4: each server's stream normalizes to what cases.json says."""
    case = CASES[name]
    result = await stream_file(case["format"], recording(name))
    assert_matches_expected(result, {k: v for k, v in case.items() if k not in META_KEYS})


# --- 1: endings without a finish reason --------------------------------------------------


@pytest.mark.asyncio
async def test_llamacpp_error_field_is_an_error_not_an_empty_reply() -> None:
    """covers S8, G1: llama.cpp's `error:` line then [DONE]: the turn sees a context error
    (not retryable with the same context), the partial text kept, no finish."""
    _, summary, _ = await run("openai", recording("llamacpp_error_field_then_done"))
    assert summary.error is not None
    assert (summary.error.type, summary.error.retryable) == ("context_length_exceeded", False)
    assert "exceeds the available context size" in summary.error.message
    assert summary.finish_reason is None and "".join(summary.text) == " The quick brown"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "ending", [b"data: [DONE]\n\n", b""], ids=["done-without-finish", "eof-without-finish"]
)
async def test_no_finish_reason_is_an_incomplete_stream(ending: bytes) -> None:
    """covers S8, G1: [DONE] or a close with no finish reason is retryable and incomplete."""
    script = sse({"choices": [{"index": 0, "delta": {"content": "Half"}}]}) + ending
    _, summary, _ = await run("openai", script)
    assert summary.error is not None
    assert (summary.error.type, summary.error.retryable) == ("incomplete_stream", True)


# --- 2: heartbeats ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_empty_data_events_are_keepalives_not_tokens() -> None:
    """covers S4: an empty `data:` event is liveness, never text, never an error."""
    events, summary, _ = await run("openai", recording("openrouter_empty_data_heartbeats"))
    assert summary.error is None and "".join(summary.text) == "Still here."
    keepalives = [e for e in events if isinstance(e, KeepAlive)]
    assert len(keepalives) == 3  # one comment, two empty data events
    assert all(not isinstance(e, TextDelta) or e.text for e in events)


# --- 3: rate limit versus exhausted quota -------------------------------------------------

PER_MINUTE = {
    "error": {
        "code": 429,
        "message": "You exceeded your current quota, please check your plan and billing "
        "details.",
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [{"quotaId": "GenerateRequestsPerMinutePerProjectPerModel"}],
            },
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "41s"},
        ],
    }
}


@pytest.mark.asyncio
async def test_gemini_per_minute_limit_in_stream_is_a_retryable_rate_limit() -> None:
    """covers G1: classified by the PerMinute quota id and RetryInfo, not the wording."""
    _, summary, _ = await run("gemini", recording("gemini_per_minute_limit_in_stream"))
    error = summary.error
    assert error is not None
    assert (error.type, error.retryable, error.retry_after_s) == ("RESOURCE_EXHAUSTED", True, 41)


@pytest.mark.asyncio
async def test_gemini_per_minute_limit_over_http_is_a_retryable_rate_limit() -> None:
    """covers G1: the same body as an HTTP 429 answer."""
    server = ReplayServer(json.dumps(PER_MINUTE).encode(), status=429,
                          content_type="application/json")
    async with server:
        _, summary = await collect(server, "gemini")
    error = summary.error
    assert error is not None and error.status == 429
    assert (error.type, error.retryable, error.retry_after_s) == ("RESOURCE_EXHAUSTED", True, 41)


def test_wording_alone_still_means_quota_without_structured_details() -> None:
    """covers G1: OpenAI's insufficient_quota keeps its meaning (no details to go by)."""
    body = {"error": {"message": "You exceeded your current quota, please check your plan.",
                      "type": "insufficient_quota", "code": "insufficient_quota"}}
    error = http_error(429, error_details(body), {}, "")
    assert (error.type, error.retryable) == ("insufficient_quota", False)


# --- 8 and 11: named HTTP 400s ------------------------------------------------------------


@pytest.mark.asyncio
async def test_llamacpp_context_overflow_400_is_context_length_exceeded() -> None:
    """covers G1: llama.cpp's wording and type are labelled like the other servers'."""
    body = {"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 300,
                      "n_ctx": 256, "message": "the request exceeds the available context "
                      "size, try increasing it"}}
    server = ReplayServer(json.dumps(body).encode(), status=400, content_type="application/json")
    async with server:
        _, summary = await collect(server, "openai")
    assert summary.error is not None
    assert (summary.error.type, summary.error.retryable) == ("context_length_exceeded", False)


def test_context_wording_alone_is_recognised() -> None:
    """covers G1: the wording without llama.cpp's type still says context too long."""
    details = error_details({"error": "the request exceeds the available context size"})
    assert http_error(400, details, {}, "").type == "context_length_exceeded"


@pytest.mark.asyncio
async def test_ollama_does_not_support_tools_is_named() -> None:
    """covers G1: Ollama's 400 for any request with tools is classified, not a bare 400."""
    body = {"error": "registry.ollama.ai/library/gemma3:4b does not support tools"}
    server = ReplayServer(json.dumps(body).encode(), status=400, content_type="application/json")
    async with server:
        _, summary = await collect(server, "openai")
    error = summary.error
    assert error is not None
    assert (error.status, error.type, error.retryable) == (400, "tools_unsupported", False)
    assert error.message.startswith("the model does not support tools")
    assert "gemma3:4b does not support tools" in error.message


def test_prefill_rejection_is_named() -> None:
    """covers S1: Anthropic's 400 for a trailing assistant turn on Claude 4.6 is named."""
    body = {"type": "error", "error": {"type": "invalid_request_error", "message":
            "This model does not support assistant message prefill. The conversation must "
            "end with a user message."}}
    error = http_error(400, error_details(body), {}, "")
    assert (error.type, error.retryable) == ("prefill_unsupported", False)


# --- 4: tool-call identity ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_changing_ids_do_not_split_a_call() -> None:
    """covers T4: one call whose id changes after the first delta stays one runnable call."""
    _, summary, _ = await run("openai", recording("groq_changing_call_ids"))
    [call] = summary.tool_calls
    assert (call.id, call.arguments, call.truncated) == ("call_FIXTUREfirst", {"city": "Paris"},
                                                         False)


@pytest.mark.asyncio
async def test_repeated_names_are_not_concatenated() -> None:
    """covers T4: a name repeated on every delta is the name, not `get_weatherget_weather`."""
    _, summary, _ = await run("openai", recording("deepseek_repeated_id_and_name"))
    assert [(c.name, c.arguments) for c in summary.tool_calls] == [
        ("get_weather", {"city": "Oslo"}), ("get_time", {"tz": "CET"})]


@pytest.mark.asyncio
async def test_same_function_twice_at_index_zero_is_two_calls() -> None:
    """covers T4: whole calls reusing index 0 are told apart once the first is complete."""
    _, summary, _ = await run("openai", recording("ollama_parallel_calls_at_index_zero"))
    assert [c.arguments for c in summary.tool_calls] == [
        {"city": "Paris"}, {"city": "Rome"}, {"tz": "CET"}]


# --- 6: Gemini and Vertex -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_vertex_streamed_arguments_make_one_call_with_its_signature() -> None:
    """covers T4: the parts of a streamed call make one call under the model's own id."""
    _, summary, _ = await run("gemini", recording("vertex_streamed_function_args"))
    [call] = summary.tool_calls
    assert call.id == "fc-FIXTUREvx1" and not call.truncated


@pytest.mark.asyncio
async def test_vertex_call_left_open_at_the_end_never_runs() -> None:
    """covers T4: a streamed call still `willContinue` when the stream finishes is cut."""
    lines = recording("vertex_streamed_function_args").split(b"\r\n\r\n")
    closing = {"candidates": [{"content": {"role": "model", "parts": [{"text": "."}]},
                               "finishReason": "MAX_TOKENS", "index": 0}]}
    script = b"\r\n\r\n".join(lines[:4]) + b"\r\n\r\n" + sse(closing)
    _, summary, _ = await run("gemini", script)
    [call] = summary.tool_calls
    assert call.truncated and call.name == "get_weather"


# --- 7: a whitespace-only reply -------------------------------------------------------------


def blanks(pieces: list[str]) -> list[str]:
    strip = LeadingBlank()
    out = [e for piece in pieces for e in strip.feed(TextDelta(piece))]
    out += strip.feed(Finish("stop")) + strip.finish()
    return [e.text for e in out if isinstance(e, TextDelta)]


def test_whitespace_only_reply_reaches_the_engine_as_no_text() -> None:
    """covers S8: nothing Discord could show, so the engine sees an empty response."""
    assert blanks(["\n\n", " ", "\t"]) == []


def test_blanks_before_visible_text_are_kept_with_it() -> None:
    """covers S5: held blanks are released with the first visible text, unchanged; blanks
    later in the reply pass at once."""
    assert blanks(["\n", " ", "Hi", " ", "\n", "there"]) == ["\n Hi", " ", "\n", "there"]
