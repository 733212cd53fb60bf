"""Fault cells through the real HTTP layer for the Anthropic Messages and Gemini adapters: the
engine drives each adapter streaming its own wire format from a loopback aiohttp server
(`ReplayServer`), and every cell asserts the terminal state and status docs/spec.md requires, the
delivered text kept, the connection closed (the server sees the client leave) where the client
must close it, nothing checked out of the aiohttp pool, no task left, and the API key (sent, and
echoed back by the hostile error bodies) never in the result, the errors, the logs or the
journal. `test_reliability_io.py` runs the same cells for the OpenAI-compatible adapter; its
helpers are reused here."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from fsm.engine.result import TurnResult
from fsm.engine.turn import Turn
from fsm.journal import JournalRecorder, journal_document, jsonable
from providers import build_provider
from providers.replay_server import Hang, Pause, ReplayServer, Send, Step, parse_script

from providers_support import EXPECTED, FIXTURES, TEST_KEY, anthropic_sse, config_for, sse
from reliability_support import (
    EPS,
    HTTP_TURN_CONFIG,
    build_turn,
    finish,
    no_task_left,
    server_saw_the_client_leave,
    times,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

KINDS = ["anthropic", "gemini"]


# --------------------------------------------------------------------- the two wire formats


@dataclass(frozen=True)
class Wire:
    """How one provider frames what the cells need: the stream's opening, a text chunk, a
    keep-alive, its clean end, an in-band error and the body of an HTTP error."""

    kind: str
    key_header: str
    head: bytes
    text: Callable[[str], bytes]
    keepalive: bytes
    end: bytes
    in_band_error: Callable[[str], bytes]
    http_error: Callable[[int, str], tuple[bytes, dict[str, str]]]
    error_type: dict[int, str]
    """The `type` a 500 / 429 body classifies as."""


def _anthropic_delta(text: str) -> bytes:
    delta = {"type": "text_delta", "text": text}
    return anthropic_sse({"type": "content_block_delta", "index": 0, "delta": delta})


def _anthropic_http_error(status: int, message: str) -> tuple[bytes, dict[str, str]]:
    kind = "rate_limit_error" if status == 429 else "api_error"
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return json.dumps(body).encode(), ({"retry-after": "7"} if status == 429 else {})


ANTHROPIC = Wire(
    kind="anthropic",
    key_header="x-api-key",
    head=anthropic_sse(
        {
            "type": "message_start",
            "message": {
                "id": "msg_cell",
                "type": "message",
                "role": "assistant",
                "content": [],
                "usage": {"input_tokens": 9, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ),
    text=_anthropic_delta,
    keepalive=anthropic_sse({"type": "ping"}),
    end=anthropic_sse(
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
        {"type": "message_stop"},
    ),
    in_band_error=lambda message: anthropic_sse(
        {"type": "error", "error": {"type": "overloaded_error", "message": message}}
    ),
    http_error=_anthropic_http_error,
    error_type={500: "api_error", 429: "rate_limit_error"},
)


def _gemini_chunk(text: str) -> bytes:
    content = {"parts": [{"text": text}], "role": "model"}
    return sse({"candidates": [{"index": 0, "content": content}]})


def _gemini_http_error(status: int, message: str) -> tuple[bytes, dict[str, str]]:
    if status == 429:
        retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}
        error = {
            "code": 429,
            "message": message,
            "status": "RESOURCE_EXHAUSTED",
            "details": [retry],
        }
    else:
        error = {"code": status, "message": message, "status": "INTERNAL"}
    return json.dumps({"error": error}).encode(), {}


GEMINI = Wire(
    kind="gemini",
    key_header="x-goog-api-key",
    head=b"",
    text=_gemini_chunk,
    keepalive=b": keepalive\n\n",
    end=sse(
        {
            "candidates": [
                {"index": 0, "content": {"parts": [], "role": "model"}, "finishReason": "STOP"}
            ]
        }
    ),
    in_band_error=lambda message: sse(
        {"error": {"code": 503, "message": message, "status": "UNAVAILABLE"}}
    ),
    http_error=_gemini_http_error,
    error_type={500: "INTERNAL", 429: "RESOURCE_EXHAUSTED"},
)

WIRES = {"anthropic": ANTHROPIC, "gemini": GEMINI}
ECHO = f"request rejected for key {TEST_KEY}"
"""Error bodies sometimes echo the request back: every hostile body here carries the key."""


def fixture_steps(kind: str, case: str) -> list[Step]:
    return parse_script((FIXTURES / kind / f"{case}.sse").read_bytes())


# ---------------------------------------------------------------------------------- harness


@dataclass
class HttpCell:
    kind: str
    turn: Turn
    server: ReplayServer
    connector: aiohttp.TCPConnector
    recorder: JournalRecorder


@asynccontextmanager
async def adapter_turn(server: ReplayServer, kind: str) -> AsyncIterator[HttpCell]:
    """A journaled turn streaming from `server` through the `kind` adapter (with an API key)
    and its own connection pool; once the server and the session are closed, no task at all
    is left."""
    await server.start()
    connector = aiohttp.TCPConnector()
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            provider = build_provider(config_for(server, kind, api_key=TEST_KEY), session)
            turn = build_turn({"name": f"http-{kind}", "config": HTTP_TURN_CONFIG},
                              provider=provider)
            recorder = JournalRecorder(turn.turn_id, turn.config, turn.tools, request=turn.request)
            turn.recorder = recorder
            yield HttpCell(kind, turn, server, connector, recorder)
    finally:
        await server.close()
    await no_task_left()


def assert_key_never_shown(
    cell: HttpCell, result: TurnResult, caplog: pytest.LogCaptureFixture
) -> None:
    """The key was sent (so it could leak) and shows nowhere a person or a file sees it."""
    assert cell.server.requests[0].headers[WIRES[cell.kind].key_header] == TEST_KEY
    journal = journal_document(cell.recorder.scenario(), cell.turn.transitions, result.as_dict())
    seen = {
        "result": json.dumps(jsonable(result.as_dict())),
        "error": str(result.error),
        "journal": json.dumps(jsonable(journal)),
        "log": caplog.text,
    }
    for where, text in seen.items():
        assert TEST_KEY not in text, f"the API key leaked into the {where}"


@pytest.fixture(autouse=True)
def _capture_everything(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


# ------------------------------------------------------------------------------------ cells


@pytest.mark.parametrize("kind", KINDS)
async def test_stall_mid_stream_times_out_idle_and_closes_the_connection(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # covers S3, S5, S10, S11, S13, S14: each chunk re-arms the idle timer; the stalled request
    # is aborted, settles at once, and the server sees the client go
    w = WIRES[kind]
    server = ReplayServer(
        [Send(w.head + w.text("Working")), Pause(2.0), Send(w.text(" on it")), Hang()]
    )
    async with adapter_turn(server, kind) as cell:
        result = await finish(cell.turn, engine_tasks_only=True)
        assert result.state == "TimedOut" and result.status == "timeout"
        assert result.text == result.delivered_text == "Working on it"
        assert [t["event"] for t in cell.turn.transitions][-2:] == ["idle_timeout", "settled"]
        assert times(cell.turn)[-2:] == [pytest.approx(32.0, abs=EPS)] * 2
        assert result.metrics == [{"name": "stream_sdk_timeout", "phase": "idle"}]
        assert not cell.connector._acquired
        await server_saw_the_client_leave(server)
        assert_key_never_shown(cell, result, caplog)
    assert server.disconnected == 1 and server.completed == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_recorded_stall_times_out_with_the_recorded_text(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # covers S5, S10, S13: the recorded stall (fixtures/sse/<kind>/stall.sse) keeps its text
    server = ReplayServer(fixture_steps(kind, "stall"))
    async with adapter_turn(server, kind) as cell:
        result = await finish(cell.turn, engine_tasks_only=True)
        assert result.state == "TimedOut" and result.status == "timeout"
        assert result.delivered_text == EXPECTED[kind]["stall"]["text"]
        assert times(cell.turn)[-2] == pytest.approx(HTTP_TURN_CONFIG["idle_timeout_s"], abs=EPS)
        assert not cell.connector._acquired
        await server_saw_the_client_leave(server)
        assert_key_never_shown(cell, result, caplog)


@pytest.mark.parametrize("kind", KINDS)
async def test_keepalives_only_time_out_at_the_first_token_budget(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # covers S4, S11, S12: pings / keep-alive comments are liveness, not tokens: the
    # first-token timer is not re-armed by them and the notice is the first-token one
    w = WIRES[kind]
    server = ReplayServer([Send(w.head + w.keepalive), Pause(20.0), Send(w.keepalive), Hang()])
    async with adapter_turn(server, kind) as cell:
        result = await finish(cell.turn, engine_tasks_only=True)
        assert result.state == "TimedOut" and result.delivered_text == ""
        assert [t["event"] for t in cell.turn.transitions] == [
            "begin",
            "first_token_timeout",
            "settled",
        ]
        first_token_s = HTTP_TURN_CONFIG["first_token_timeout_s"]
        assert times(cell.turn)[-2] == pytest.approx(first_token_s, abs=EPS)
        assert result.metrics == [{"name": "stream_sdk_timeout", "phase": "first_token"}]
        assert result.notices == ["timeout_first_token"]
        assert not cell.connector._acquired
        await server_saw_the_client_leave(server)
        assert_key_never_shown(cell, result, caplog)


@pytest.mark.parametrize("kind", KINDS)
async def test_kill_mid_stream_disconnects_at_once(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # covers S7, S16, D3, D4: /kill aborts the HTTP request at the kill's instant, text kept
    w = WIRES[kind]
    server = ReplayServer([Send(w.head + w.text("Once")), Hang()])
    async with adapter_turn(server, kind) as cell:
        task = asyncio.create_task(cell.turn.run())
        await asyncio.sleep(10)
        assert cell.turn.state == "Streaming"
        cell.turn.locks.request_stop(cell.turn.lock.channel_id)
        result = await finish(cell.turn, task, engine_tasks_only=True)
        assert result.state == "Stopped" and result.status == "stopped_by_user"
        assert times(cell.turn)[-1] == pytest.approx(10.0, abs=EPS)
        assert result.delivered_text == "Once" and result.notices == []
        assert not cell.connector._acquired
        await server_saw_the_client_leave(server)
        assert_key_never_shown(cell, result, caplog)
    assert server.disconnected == 1


@dataclass(frozen=True)
class Failure:
    """A cell ending Done/error: the server's answer and what the pass's error must say."""

    steps: list[Step]
    delivered: str
    error: dict[str, Any]
    status: int = 200
    content_type: str = "text/event-stream"
    headers: dict[str, str] | None = None
    client_closes: bool = False
    """The server is still sending (hangs) when the error arrives: the client must close."""


def failure(kind: str, script: str) -> Failure:
    w = WIRES[kind]
    part = w.head + w.text("Part")
    stream_error: dict[str, Any] = {"kind": "provider_stream_error"}
    error: dict[str, Any]
    steps: list[Step]
    if script == "closed before the end marker":
        error = {**stream_error, "type": "incomplete_stream"}
        return Failure([Send(part)], "Part", error)
    if script == "connection reset mid-body":
        # the body is cut short of its Content-Length: the client sees the transfer break
        error = {**stream_error, "type": "connection_error"}
        return Failure([Send(part)], "Part", error, headers={"Content-Length": "100000"})
    if script in ("http 500", "http 429"):
        status = int(script.split()[1])
        body, headers = w.http_error(status, ECHO)
        error = {"kind": "http", "status": status, "type": w.error_type[status], "retryable": True}
        if status == 429:
            error["retry_after_s"] = 7.0
        return Failure([Send(body)], "", error, status, "application/json", headers)
    if script == "in-band error":
        steps = [Send(part), Send(w.in_band_error(ECHO)), Hang()]
        return Failure(steps, "Part", {**stream_error, "retryable": True}, client_closes=True)
    if script == "recorded in-band error":
        expected = EXPECTED[kind]["midstream_error"]
        error = {"kind": expected["error"]["kind"], "type": expected["error"]["type"]}
        steps = [*fixture_steps(kind, "midstream_error"), Hang()]
        return Failure(steps, expected["text"], error, client_closes=True)
    if script == "malformed json":
        bad = f'data: {{"echo": "{TEST_KEY}", not json\n\n'.encode()
        if kind == "anthropic":
            bad = b"event: content_block_delta\n" + bad
        error = {**stream_error, "type": "malformed_event"}
        return Failure([Send(part), Send(bad), Hang()], "Part", error, client_closes=True)
    assert script == "deep nesting"
    deep = b"data: " + b"[" * 50_000 + b"\n\n"
    error = {**stream_error, "type": "malformed_event"}
    return Failure([Send(part), Send(deep), Hang()], "Part", error, client_closes=True)


FAILURES = [
    "closed before the end marker",
    "connection reset mid-body",
    "http 500",
    "http 429",
    "in-band error",
    "recorded in-band error",
    "malformed json",
    "deep nesting",
]


@pytest.mark.parametrize("script", FAILURES)
@pytest.mark.parametrize("kind", KINDS)
async def test_failures_end_done_error_at_once(
    kind: str, script: str, caplog: pytest.LogCaptureFixture
) -> None:
    # covers S8, S14, S15, D4: a stream cut short (cleanly or mid-body), an HTTP error (the
    # 429's retry-after kept), an in-band error after HTTP 200, a malformed event and one the
    # JSON decoder cannot parse all end the turn Done/error at that instant with the text that
    # arrived kept; when the server is still sending, the client closes the connection
    f = failure(kind, script)
    server = ReplayServer(f.steps, status=f.status, content_type=f.content_type, headers=f.headers)
    async with adapter_turn(server, kind) as cell:
        result = await finish(cell.turn, engine_tasks_only=True)
        assert result.state == "Done" and result.status == "error"
        assert result.delivered_text == result.text == f.delivered
        assert [t["event"] for t in cell.turn.transitions][-1] == "provider_error"
        assert times(cell.turn)[-1] == pytest.approx(0.0, abs=EPS)
        error = result.passes[-1].error
        assert error is not None and {k: error.get(k) for k in f.error} == f.error, error
        assert result.error == f"{error['kind']}: {error['message']}"
        assert not cell.connector._acquired
        if f.client_closes:
            await server_saw_the_client_leave(server)
        assert_key_never_shown(cell, result, caplog)


@pytest.mark.parametrize("kind", KINDS)
async def test_recorded_clean_end_completes_and_returns_the_connection(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # covers S8, S14, T8: the recorded plain answer completes with its text and usage, and
    # nothing stays checked out of the pool
    expected = EXPECTED[kind]["plain_text"]
    server = ReplayServer(fixture_steps(kind, "plain_text"))
    async with adapter_turn(server, kind) as cell:
        result = await finish(cell.turn, engine_tasks_only=True)
        assert result.state == "Done" and result.status == "completed"
        assert result.text == result.delivered_text == expected["text"]
        assert result.passes[-1].finish_reason == expected["finish_reason"]
        assert times(cell.turn)[-1] == pytest.approx(0.0, abs=EPS)
        assert not cell.connector._acquired
        assert_key_never_shown(cell, result, caplog)
    assert server.completed == 1 and server.disconnected == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_inline_clean_end_completes(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    # covers S5, S8, S14: chunks a second apart, then the provider's own end marker
    w = WIRES[kind]
    server = ReplayServer(
        [Send(w.head + w.text("Hello")), Pause(1.0), Send(w.text(" there")), Send(w.end)]
    )
    async with adapter_turn(server, kind) as cell:
        result = await finish(cell.turn, engine_tasks_only=True)
        assert result.status == "completed" and result.text == "Hello there"
        assert times(cell.turn)[-1] == pytest.approx(1.0, abs=EPS)
        assert not cell.connector._acquired
        assert_key_never_shown(cell, result, caplog)
