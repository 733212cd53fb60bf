"""Fault cells across the real I/O layers: the engine driving the OpenAI-compatible adapter
over a loopback HTTP server (stall, kill, dropped connection, HTTP error, malformed and
pathological events), and the engine delivering through `DiscordChannel` to real discord.py
against the Discord REST emulator (failed and rate-limited sends). Every cell asserts the
terminal state docs/spec.md implies, the lock released, no task left and no HTTP connection
checked out of the pool."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from discord_io.delivery import DiscordChannel
from discord_io.testing import Fault, emulated_discord
from fsm.engine.turn import Turn
from providers import build_provider
from providers.replay_server import Hang, Pause, ReplayServer, Send

from providers_support import config_for, sse
from reliability_support import (
    HTTP_TURN_CONFIG,
    build_turn,
    finish,
    no_task_left,
    server_saw_the_client_leave,
    times,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]



def chunk(text: str) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


STOP = {"id": "c1", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


@asynccontextmanager
async def http_turn(server: ReplayServer) -> AsyncIterator[tuple[Turn, aiohttp.TCPConnector]]:
    """A turn streaming from `server` through the real adapter and its own connection pool;
    once the server and the session are closed, no task at all is left."""
    await server.start()
    connector = aiohttp.TCPConnector()
    try:
        async with aiohttp.ClientSession(connector=connector) as session:
            provider = build_provider(config_for(server, "openai"), session)
            yield build_turn({"config": HTTP_TURN_CONFIG}, provider=provider), connector
    finally:
        await server.close()
    await no_task_left()


async def test_http_stall_times_out_and_closes_the_connection() -> None:
    # covers S3, S5, S10, S14: the stalled request is aborted, the server sees it go
    server = ReplayServer([Send(sse(chunk("Working"))), Pause(2.0),
                           Send(sse(chunk(" on it"))), Hang()])
    async with http_turn(server) as (turn, connector):
        result = await finish(turn, engine_tasks_only=True)
        assert result.status == "timeout" and result.text == "Working on it"
        assert times(turn)[-2] == pytest.approx(32.0, abs=0.01)
        assert not connector._acquired
        await server_saw_the_client_leave(server)
    assert server.disconnected == 1 and server.completed == 0


async def test_http_kill_mid_stream_disconnects_at_once() -> None:
    # covers S7, S16, D3: /kill aborts the HTTP request at the kill's instant
    server = ReplayServer([Send(sse(chunk("Once"))), Hang()])
    async with http_turn(server) as (turn, connector):
        task = asyncio.create_task(turn.run())
        await asyncio.sleep(10)
        assert turn.state == "Streaming"
        turn.locks.request_stop(turn.lock.channel_id)
        result = await finish(turn, task, engine_tasks_only=True)
        assert result.status == "stopped_by_user" and times(turn)[-1] == pytest.approx(10, abs=0.01)
        assert not connector._acquired
        await server_saw_the_client_leave(server)


@pytest.mark.parametrize("script", ["dropped", "http 500", "malformed json", "deep nesting"])
async def test_http_failures_end_done_error(script: str) -> None:
    # covers S8, S15, D4: a dropped connection, an HTTP error, a malformed event, and an event
    # the JSON decoder cannot even parse (deep nesting) all end the turn Done/error with the
    # text that arrived kept
    status = 200
    content_type = "text/event-stream"
    steps: list[Any] = [Send(sse(chunk("Part")))]
    if script == "http 500":
        steps = [Send(json.dumps({"error": {"message": "upstream down"}}).encode())]
        status, content_type = 500, "application/json"
    elif script == "malformed json":
        steps.append(Send(b"data: {not json\n\n"))
    elif script == "deep nesting":
        steps.append(Send(b"data: " + b"[" * 50_000 + b"\n\n"))
    server = ReplayServer(steps, status=status, content_type=content_type)
    async with http_turn(server) as (turn, connector):
        result = await finish(turn, engine_tasks_only=True)
        assert result.status == "error" and turn.state == "Done"
        assert result.delivered_text == ("" if script == "http 500" else "Part")
        assert not connector._acquired


async def test_http_complete_stream_returns_the_connection_to_the_pool() -> None:
    # covers S14: a stream read to its end releases (not closes) its connection
    server = ReplayServer([Send(sse(chunk("Hello"), STOP)), Send(b"data: [DONE]\n\n")])
    async with http_turn(server) as (turn, connector):
        result = await finish(turn, engine_tasks_only=True)
        assert result.status == "completed" and result.text == "Hello"
        assert not connector._acquired


# ---------------------------------------------------------------------------- Discord


class Scripted:
    """A provider streaming `pieces` one a second, then finishing."""

    name = "scripted pieces"

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def stream(self, request: Any, abort: Any) -> AsyncIterator[Any]:
        from fsm.engine.provider import Finish, TextDelta

        async def events() -> AsyncIterator[Any]:
            for piece in self.pieces:
                await asyncio.sleep(1)
                yield TextDelta(piece)
            yield Finish("stop")

        return events()


PARAGRAPHS = [f"Paragraph {i}: " + "word " * 30 + "\n\n" for i in range(4)]


async def test_discord_failed_send_ends_done_error_and_releases_the_lock() -> None:
    # covers D2, S15, D4: the first message fails with a 500 (discord.py retries 5xx, so every
    # attempt fails); the failure is reported on the next deliver/flush and the turn ends
    # Done/error with its lock released; what reached Discord is recorded on the channel
    async with emulated_discord() as (emu, client):
        emu.inject("POST /channels/{channel_id}/messages", *[Fault.server_error()] * 10)
        channel = DiscordChannel(client, emu.channel_id, flush_paragraphs=True,
                                 idle_flush_s=None)
        turn = build_turn({"config": HTTP_TURN_CONFIG}, provider=Scripted(PARAGRAPHS),
                          channel=channel)
        result = await finish(turn, engine_tasks_only=True)
        await channel.aclose()
        assert result.status == "error" and "could not send" in (result.error or "")
        assert channel.delivered_text == "" and emu.sent() == []
        assert turn.transitions[-1]["event"] == "crash"
    await no_task_left()


async def test_discord_failed_send_delivered_text_is_what_discord_received() -> None:
    # covers G1, S10, D2: the delivered text a fallback continues from is what was sent
    async with emulated_discord() as (emu, client):
        emu.inject("POST /channels/{channel_id}/messages", *[Fault.server_error()] * 10)
        channel = DiscordChannel(client, emu.channel_id, flush_paragraphs=True,
                                 idle_flush_s=None)
        turn = build_turn({"config": HTTP_TURN_CONFIG}, provider=Scripted(PARAGRAPHS),
                          channel=channel)
        result = await finish(turn, engine_tasks_only=True)
        await channel.aclose()
    await no_task_left()
    assert result.delivered_text == channel.delivered_text


async def test_discord_rate_limited_send_is_retried_and_completes() -> None:
    # covers D2: a 429 with retry_after is honoured and the reply completes in order
    async with emulated_discord() as (emu, client):
        emu.inject("POST /channels/{channel_id}/messages", Fault.rate_limited(2.0))
        channel = DiscordChannel(client, emu.channel_id, flush_paragraphs=True,
                                 idle_flush_s=None)
        turn = build_turn({"config": HTTP_TURN_CONFIG}, provider=Scripted(PARAGRAPHS),
                          channel=channel)
        result = await finish(turn, engine_tasks_only=True)
        await channel.aclose()
        assert result.status == "completed"
        assert channel.delivered_text == result.delivered_text == "".join(PARAGRAPHS)
    await no_task_left()
