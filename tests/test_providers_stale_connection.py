"""A pooled keep-alive connection the server has already given up on (P8).

HTTP/1.1 lets a server close an idle persistent connection at any time (RFC 9112 §9.6), so
a client may write its next request into a connection the server is closing. llama.cpp's
`llama-server` does this between passes. The request never reached the server, so it is sent
once more on a fresh connection instead of failing the pass (and spending a fallback).
The server here is a raw asyncio socket server, so the close happens exactly when the
second request arrives on the reused connection, every time."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from fsm.engine.provider import AbortSignal, ProviderError, TextDelta
from providers.factory import build_provider
from providers.stream_file import replay_request

from providers_support import config_for, sse

_BODY = sse({"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]},
            "[DONE]")


class ClosesReusedConnections:
    """Answers the first request of every connection (keep-alive, a complete SSE body) and
    closes a connection, without a byte of answer, when a second request arrives on it."""

    def __init__(self) -> None:
        self.requests = 0
        self.refused = 0
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            for served in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                json.loads(await reader.readexactly(length))
                self.requests += 1
                if served:
                    self.refused += 1
                    return  # the idle connection is closed as the request lands
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Content-Length: %d\r\nConnection: keep-alive\r\n\r\n%s"
                             % (len(_BODY), _BODY))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.asyncio
async def test_a_request_written_into_a_closing_pooled_connection_is_sent_again() -> None:
    # covers P8
    server = ClosesReusedConnections()
    async with server as url, aiohttp.ClientSession() as session:
        provider = build_provider(config_for(url, "openai"), session)
        for _ in range(3):
            events = [e async for e in provider.stream(replay_request(), AbortSignal())]
            assert not [e for e in events if isinstance(e, ProviderError)], events
            assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "ok"
    # passes 2 and 3 each met a connection closed under them and were sent once more
    assert (server.connections, server.refused, server.requests) == (3, 2, 5)


@pytest.mark.asyncio
async def test_a_connection_lost_after_the_answer_began_is_not_sent_again() -> None:
    # covers P8: only a request the server never answered is repeated; once a response
    # arrived, a dropped connection is the pass's failure (nothing may be generated twice)
    body = _BODY[: len(_BODY) // 2]

    async def half_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(_BODY), body))
        await writer.drain()
        writer.close()
        served.append(1)

    served: list[int] = []
    listener = await asyncio.start_server(half_answer, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as session:
            provider = build_provider(config_for(f"http://127.0.0.1:{port}/v1", "openai"),
                                      session)
            events = [e async for e in provider.stream(replay_request(), AbortSignal())]
    finally:
        listener.close()
        await listener.wait_closed()
    assert isinstance(events[-1], ProviderError)
    assert served == [1]
