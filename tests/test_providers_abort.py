"""The abort handle (S3, S7): firing it closes the HTTP connection at once, the stream ends
without raising, and nothing (task or connection) outlives the pass."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import aiohttp
import pytest
from aiohttp import web

from fsm.engine.provider import AbortSignal, ProviderEvent, TextDelta
from providers.factory import build_provider
from providers.replay_server import ReplayServer
from providers.stream_file import replay_request

from providers_support import FIXTURES, config_for, sse

OPENAI_HANGING = (
    sse({"choices": [{"index": 0, "delta": {"content": "partial"}, "finish_reason": None}]})
    + b":@hang\n"
)


def _other_tasks() -> set[asyncio.Task[object]]:
    current = asyncio.current_task()
    return {task for task in asyncio.all_tasks() if task is not current and not task.done()}


async def _drain_until_idle(server: ReplayServer) -> None:
    """Wait (virtual time) until the server saw the client go and its tasks are gone."""
    async with asyncio.timeout(5):
        await server.client_gone.wait()
        while _other_tasks():
            await asyncio.wait(_other_tasks(), return_when=asyncio.FIRST_COMPLETED)


@pytest.mark.asyncio
@pytest.mark.looptime
@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_abort_mid_stream_closes_the_connection(kind: str) -> None:
    """covers S3, S7: abort fired after the first chunk of a hanging stream: the stream ends
    quietly at once, the server sees the client disconnect, no task or connection remains."""
    script = (FIXTURES / kind / "stall.sse").read_bytes()
    abort = AbortSignal()
    loop = asyncio.get_running_loop()
    events: list[ProviderEvent] = []
    async with ReplayServer(script) as server:
        connector = aiohttp.TCPConnector()
        async with aiohttp.ClientSession(connector=connector) as session:
            provider = build_provider(config_for(server, kind), session)
            start = loop.time()
            async for event in provider.stream(replay_request(), abort):
                events.append(event)
                if isinstance(event, TextDelta):
                    abort.fire("kill")
            assert loop.time() - start < 1, "the abort must not wait for a timeout"
            await _drain_until_idle(server)
            assert server.disconnected == 1
            assert server.completed == 0
            assert not connector._acquired  # no connection checked out after the pass
    assert [type(e) for e in events if isinstance(e, TextDelta)] == [TextDelta]
    assert not _other_tasks()


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_abort_from_another_task_unblocks_a_waiting_read() -> None:
    """covers S3, S7: a kill from elsewhere (the engine's driver) while the adapter is blocked
    on a read ends the stream immediately, without an error event."""
    abort = AbortSignal()
    loop = asyncio.get_running_loop()
    async with ReplayServer(OPENAI_HANGING) as server, aiohttp.ClientSession() as session:
        provider = build_provider(config_for(server, "openai"), session)
        loop.call_later(60, abort.fire, "kill")
        events = [event async for event in provider.stream(replay_request(), abort)]
        assert loop.time() == pytest.approx(60, abs=0.5)
        await _drain_until_idle(server)
    assert events == [TextDelta("partial")]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_abort_before_the_response_headers_cancels_the_request() -> None:
    """covers S3: the abort also works while the request waits for response headers."""
    handler_cancelled = asyncio.Event()

    async def slow_headers(request: web.Request) -> web.StreamResponse:
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            handler_cancelled.set()
            raise
        return web.Response()

    app = web.Application()
    app.router.add_post("/{tail:.*}", slow_headers)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    abort = AbortSignal()
    loop = asyncio.get_running_loop()
    try:
        async with aiohttp.ClientSession() as session:
            provider = build_provider(config_for(f"http://127.0.0.1:{port}", "openai"), session)
            loop.call_later(10, abort.fire, "kill")
            events = [event async for event in provider.stream(replay_request(), abort)]
        async with asyncio.timeout(5):
            await handler_cancelled.wait()
    finally:
        await runner.cleanup()
    assert events == []
    assert loop.time() == pytest.approx(10, abs=0.5)


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_abort_already_fired_sends_no_request() -> None:
    """covers S3: a pass whose abort fired before it started never touches the network."""
    abort = AbortSignal()
    abort.fire("kill")
    async with ReplayServer(OPENAI_HANGING) as server, aiohttp.ClientSession() as session:
        provider = build_provider(config_for(server, "openai"), session)
        events = [event async for event in provider.stream(replay_request(), abort)]
    assert events == []
    assert server.requests == []


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_abort_during_a_pause_closes_the_connection() -> None:
    """covers S3, S10: an abort during a server-side pause (a long think before the first
    token) closes the connection; the server notices while still paused."""
    script = (FIXTURES / "openai" / "keepalive_comments.sse").read_bytes()
    abort = AbortSignal()
    loop = asyncio.get_running_loop()
    async with ReplayServer(script) as server, aiohttp.ClientSession() as session:
        provider = build_provider(config_for(server, "openai"), session)
        loop.call_later(1, abort.fire, "first-token timeout")
        events = [event async for event in provider.stream(replay_request(), abort)]
        await _drain_until_idle(server)
    assert [type(e).__name__ for e in events] == ["KeepAlive"]
    assert server.disconnected == 1


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_cancelling_the_consumer_still_propagates_and_cleans_up() -> None:
    """covers S15: cancelling the task that reads the stream is not swallowed as an abort;
    the connection is still closed."""
    async with ReplayServer(OPENAI_HANGING) as server, aiohttp.ClientSession() as session:
        provider = build_provider(config_for(server, "openai"), session)

        async def consume() -> list[ProviderEvent]:
            stream: AsyncIterator[ProviderEvent] = provider.stream(replay_request(), AbortSignal())
            return [event async for event in stream]

        task = asyncio.create_task(consume())
        loop = asyncio.get_running_loop()
        loop.call_later(5, task.cancel)
        with pytest.raises(asyncio.CancelledError):
            await task
        await _drain_until_idle(server)
    assert server.disconnected == 1


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_consumer_that_stops_early_closes_the_connection() -> None:
    """covers S3, S14: a consumer that stops reading and closes the stream (aclose) leaves
    no open connection behind."""
    async with ReplayServer(OPENAI_HANGING) as server, aiohttp.ClientSession() as session:
        provider = build_provider(config_for(server, "openai"), session)
        stream = cast(
            AsyncGenerator[ProviderEvent, None],
            provider.stream(replay_request(), AbortSignal()),
        )
        first = await anext(stream)
        await stream.aclose()
        await _drain_until_idle(server)
    assert first == TextDelta("partial")
    assert server.disconnected == 1
