"""Error classification: HTTP statuses, in-band errors, broken connections and malformed
events all become one `ProviderError` the turn loop can act on (S8, S15, G1)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fsm.engine.provider import AbortSignal, ProviderError, TextDelta
from providers.errors import ErrorDetails, error_details, http_error, retry_after_header
from providers.factory import build_provider
from providers.replay_server import ReplayServer
from providers.stream_file import replay_request

from providers_support import collect, config_for, run, sse

JSON = "application/json"


async def http_failure(
    kind: str, status: int, body: Any, headers: dict[str, str] | None = None
) -> ProviderError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    content_type = JSON if not isinstance(body, bytes) else "text/html"
    events, summary, _ = await run(
        kind, raw, status=status, headers=headers or {}, content_type=content_type
    )
    assert len(events) == 1 and summary.error is not None, events
    return summary.error


@pytest.mark.asyncio
async def test_429_rate_limit_is_retryable_after_the_header_delay() -> None:
    """covers G1, S8: a rate limit may be retried, after `retry-after` seconds."""
    body = {
        "error": {
            "message": "Rate limit reached for gpt-4.1 on requests per min (RPM): Limit 3.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    error = await http_failure("openai", 429, body, {"retry-after": "7"})
    assert (error.kind, error.status, error.type) == ("http", 429, "requests")
    assert error.retryable and error.retry_after_s == 7


@pytest.mark.asyncio
async def test_429_insufficient_quota_is_not_retryable() -> None:
    """covers G1: quota exhaustion will not heal by retrying; fall back instead."""
    body = {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    error = await http_failure("openai", 429, body)
    assert (error.status, error.type, error.retryable) == (429, "insufficient_quota", False)


@pytest.mark.asyncio
async def test_anthropic_529_overloaded_is_retryable() -> None:
    """covers G1: Anthropic's 529 overloaded is transient."""
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    error = await http_failure("anthropic", 529, body, {"retry-after": "2"})
    assert (error.status, error.type, error.message) == (529, "overloaded_error", "Overloaded")
    assert error.retryable and error.retry_after_s == 2


@pytest.mark.asyncio
async def test_500_with_an_html_body_is_retryable() -> None:
    """covers G1: a proxy's HTML error page still yields a status-typed, retryable error."""
    error = await http_failure("openai", 500, b"<html><body>Internal Server Error</body></html>")
    assert (error.kind, error.status, error.type, error.retryable) == ("http", 500, "500", True)
    assert "Internal Server Error" in error.message


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (
            "openai",
            {
                "error": {
                    "message": "This model's maximum context length is 128000 tokens.",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            },
        ),
        (
            "anthropic",
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 215000 tokens > 200000 maximum",
                },
            },
        ),
        (
            "gemini",
            {
                "error": {
                    "code": 400,
                    "message": "The input token count (1200000) exceeds the maximum number of "
                    "tokens allowed (1048576).",
                    "status": "INVALID_ARGUMENT",
                }
            },
        ),
    ],
)
async def test_400_context_too_long_is_not_retryable(kind: str, body: dict[str, Any]) -> None:
    """covers G1: a prompt over the context window fails the same way on retry."""
    error = await http_failure(kind, 400, body)
    assert (error.status, error.type, error.retryable) == (400, "context_length_exceeded", False)


@pytest.mark.asyncio
async def test_gemini_quota_exhausted_is_not_retryable_but_keeps_the_delay() -> None:
    """covers G1: RESOURCE_EXHAUSTED with quota wording (and a per-day quota) is not retried;
    the RetryInfo delay is still reported."""
    body = {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota, please check your plan and billing "
            "details.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel"}],
                },
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"},
            ],
        }
    }
    error = await http_failure("gemini", 429, body)
    assert (error.status, error.type, error.retryable) == (429, "insufficient_quota", False)
    assert error.retry_after_s == 37


@pytest.mark.asyncio
async def test_gemini_plain_rate_limit_is_retryable() -> None:
    """covers G1: RESOURCE_EXHAUSTED without quota wording is an ordinary rate limit."""
    body = {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
        }
    }
    error = await http_failure("gemini", 429, body)
    assert (error.type, error.retryable) == ("RESOURCE_EXHAUSTED", True)


def test_retry_after_forms() -> None:
    """covers G1: `retry-after-ms` wins, seconds are parsed, a past HTTP date means now."""
    assert retry_after_header({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_header({"retry-after": "12"}) == 12
    assert retry_after_header({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0
    assert retry_after_header({"retry-after": "soon"}) is None
    assert retry_after_header({}) is None


def test_error_body_shapes() -> None:
    """covers S8: the error shapes of each provider (and OpenRouter) are understood."""
    openrouter = error_details({"error": {"code": 502, "message": "Provider returned error"}})
    assert openrouter == ErrorDetails("Provider returned error", "502", 502)
    gemini_list = error_details([{"error": {"code": 503, "message": "x", "status": "UNAVAILABLE"}}])
    assert gemini_list is not None and (gemini_list.type, gemini_list.code) == ("UNAVAILABLE", 503)
    assert error_details({"choices": []}) is None
    unknown = http_error(418, None, {}, "")
    assert (unknown.type, unknown.message, unknown.retryable) == ("418", "HTTP 418", False)


@pytest.mark.asyncio
async def test_connection_refused_is_a_retryable_http_error() -> None:
    """covers S8, G1: an unreachable server is an error event, not an exception."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with aiohttp.ClientSession() as session:
        provider = build_provider(config_for(f"http://127.0.0.1:{port}", "openai"), session)
        events = [e async for e in provider.stream(replay_request(), AbortSignal())]
    assert len(events) == 1 and isinstance(events[0], ProviderError)
    assert (events[0].kind, events[0].type, events[0].retryable) == (
        "http",
        "connection_error",
        True,
    )


@pytest.mark.asyncio
async def test_connection_reset_mid_stream_keeps_the_text_and_reports_it() -> None:
    """covers S8, S13: a connection dropped mid-answer yields the text so far, then one
    provider_stream_error; nothing is raised."""

    async def drop(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(
            sse({"choices": [{"index": 0, "delta": {"content": "half"}, "finish_reason": None}]})
        )
        assert request.transport is not None
        request.transport.abort()
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", drop)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            provider = build_provider(config_for(url, "openai"), session)
            events = [e async for e in provider.stream(replay_request(), AbortSignal())]
    finally:
        await runner.cleanup()
    assert events[0] == TextDelta("half")
    assert isinstance(events[-1], ProviderError) and len(events) == 2
    assert (events[-1].kind, events[-1].type, events[-1].retryable) == (
        "provider_stream_error",
        "connection_error",
        True,
    )


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("kind", "line", "problem"),
    [
        ("openai", b'data: {"choices": [{"delta": {"content": "x"\n\n', "malformed JSON"),
        ("anthropic", b"event: message_start\ndata: {not json}\n\n", "malformed JSON"),
        ("gemini", b"data: [1, 2]\r\n\r\n", "expected an object"),
    ],
)
async def test_malformed_event_data_is_a_clear_error(kind: str, line: bytes, problem: str) -> None:
    """covers S8: bad JSON in a data line ends the stream with an error naming the problem
    and quoting the data, never with a traceback."""
    _, summary, _ = await run(kind, line)
    assert summary.error is not None and summary.error.kind == "provider_stream_error"
    assert summary.error.type == "malformed_event"
    assert problem in summary.error.message and "data begins" in summary.error.message


@pytest.mark.asyncio
async def test_json_body_instead_of_a_stream() -> None:
    """covers S8: a server that ignores `stream: true` (or a proxy answering 200 with an
    error object) is reported, not parsed as an empty stream."""
    not_stream = json.dumps({"choices": [{"message": {"content": "hi"}}]}).encode()
    _, summary, _ = await run("openai", not_stream, content_type=JSON)
    assert summary.error is not None and summary.error.type == "not_a_stream"
    error_200 = json.dumps({"error": {"message": "bad model", "type": "invalid_request_error"}})
    _, summary, _ = await run("openai", error_200.encode(), content_type=JSON)
    assert summary.error is not None
    assert (summary.error.type, summary.error.message) == ("invalid_request_error", "bad model")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("kind", "script"),
    [
        ("openai", sse({"choices": [{"index": 0, "delta": {"content": "cut"}}]})),
        (
            "anthropic",
            sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "cut"},
                }
            ),
        ),
        ("gemini", sse({"candidates": [{"content": {"parts": [{"text": "cut"}]}}]})),
    ],
)
async def test_clean_close_before_the_end_marker_is_incomplete(kind: str, script: bytes) -> None:
    """covers S8, S13: a connection closed before the provider's finish marker is an error
    (the reply may be cut), with the text kept."""
    _, summary, _ = await run(kind, script)
    assert "".join(summary.text) == "cut"
    assert summary.error is not None and summary.error.type == "incomplete_stream"
    assert summary.finish_reason is None


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_read_timeout_is_a_stall_error() -> None:
    """covers S5: the optional per-read timeout (for callers without their own idle timer)
    turns a silent stream into a stall_timeout error after exactly that long."""
    script = sse({"choices": [{"index": 0, "delta": {"content": "wait"}}]}) + b":@hang\n"
    loop = asyncio.get_running_loop()
    async with ReplayServer(script) as server:
        start = loop.time()
        _, summary = await collect(server, "openai", read_timeout_s=45)
        assert loop.time() - start == pytest.approx(45, abs=0.5)
        async with asyncio.timeout(5):
            await server.client_gone.wait()
    assert summary.error is not None
    assert (summary.error.kind, summary.error.type) == ("stall_timeout", "read_timeout")
    assert "".join(summary.text) == "wait"
