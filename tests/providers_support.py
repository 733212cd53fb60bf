"""Shared helpers for the provider tests: fixtures on disk, inline streams, loopback runs."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import trustme
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from fsm.engine.locks import ChannelLock, ChannelLockRegistry
from fsm.engine.provider import AbortSignal, PassRequest, ProviderEvent
from providers.config import ProviderConfig
from providers.factory import build_provider
from providers.replay_server import RecordedRequest, ReplayServer
from providers.result import StreamSummary
from providers.stream_file import replay_request

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sse"
EXPECTED: dict[str, dict[str, dict[str, Any]]] = json.loads(
    (FIXTURES / "expected.json").read_text()
)
COMMENTARY_KEYS = {"notes"}
TEST_KEY = "sk-test-SECRET-0123456789abcdef"


def fixture_cases() -> list[tuple[str, str]]:
    return [(kind, case) for kind, cases in EXPECTED.items() for case in cases]


def sse(*payloads: Any, event: str | None = None, eol: str = "\n") -> bytes:
    """An SSE body: each payload (dict -> JSON, str as is) becomes one `data:` event."""
    out = []
    for payload in payloads:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        head = f"event: {event}{eol}" if event else ""
        out.append(f"{head}data: {data}{eol}{eol}")
    return "".join(out).encode()


def anthropic_sse(*payloads: dict[str, Any]) -> bytes:
    """Anthropic's framing: each event named after its `type`."""
    return b"".join(sse(payload, event=str(payload["type"])) for payload in payloads)


def assert_matches_expected(result: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Every field present in expected.json must match; `"id": null` means "any minted id"."""
    for key, want in expected.items():
        if key in COMMENTARY_KEYS:
            continue
        got = result[key]
        if key == "tool_calls":
            assert len(got) == len(want), (got, want)
            for got_call, want_call in zip(got, want, strict=True):
                for field, value in want_call.items():
                    if field == "id" and value is None:
                        assert isinstance(got_call["id"], str) and got_call["id"]
                    else:
                        assert got_call[field] == value, (field, got_call, want_call)
                assert got_call["truncated"] is want_call.get("truncated", False)
        elif key == "error" and want is not None:
            assert got is not None, result
            for field, value in want.items():
                assert got[field] == value, (field, got, want)
        else:
            assert got == want, (key, got, want)


OK_STREAMS: dict[str, bytes] = {
    "openai": sse({"choices": [{"index": 0, "delta": {"content": "ok"},
                                "finish_reason": "stop"}]}, "[DONE]"),
    "anthropic": anthropic_sse(
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
        {"type": "message_stop"}),
    "gemini": sse({"candidates": [{"content": {"parts": [{"text": "ok"}]},
                                   "finishReason": "STOP"}]}),
}
"""A short complete answer in each wire format, for tests about the request."""


def config_for(target: ReplayServer | str, kind: str, **overrides: Any) -> ProviderConfig:
    """A config pointing at a replay server (or any loopback URL)."""
    url = target if isinstance(target, str) else target.url
    return ProviderConfig.model_validate(
        {"kind": kind, "model": "test-model", "base_url": url, **overrides}
    )


async def collect(
    server: ReplayServer,
    kind: str,
    *,
    request: PassRequest | None = None,
    abort: AbortSignal | None = None,
    **overrides: Any,
) -> tuple[list[ProviderEvent], StreamSummary]:
    """Stream `server`'s recording through a real adapter; the events and their summary."""
    events: list[ProviderEvent] = []
    summary = StreamSummary()
    async with aiohttp.ClientSession() as session:
        provider = build_provider(config_for(server, kind, **overrides), session)
        async for event in provider.stream(request or replay_request(), abort or AbortSignal()):
            events.append(event)
            summary.add(event)
    return events, summary


async def run(
    kind: str, script: bytes, **server_options: Any
) -> tuple[list[ProviderEvent], StreamSummary, ReplayServer]:
    async with ReplayServer(script, **server_options) as server:
        events, summary = await collect(server, kind)
    return events, summary, server


@asynccontextmanager
async def serving(*servers: ReplayServer) -> AsyncIterator[aiohttp.ClientSession]:
    """The loopback servers started, a client session for them, everything closed after."""
    for server in servers:
        await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield session
    finally:
        for server in servers:
            await server.close()


def channel_lock(owner: str = "http") -> tuple[ChannelLockRegistry, ChannelLock]:
    """A lock registry and the held lock of channel "c", for a turn run by hand."""
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", owner)
    assert lock is not None
    return locks, lock


class LoopbackResolver(AbstractResolver):
    """Resolves the named hosts to one loopback port and refuses every other name, before
    any connection is tried: a test can use real API URLs and still never leave 127.0.0.1."""

    def __init__(self, hosts: set[str], port: int) -> None:
        self._hosts = hosts
        self._port = port

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        if host not in self._hosts:
            raise OSError(f"{host} is not one of the hosts served on loopback")
        return [{"hostname": host, "host": "127.0.0.1", "port": self._port,
                 "family": socket.AF_INET, "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        return None


class RealHosts:
    """Real API hosts (`api.mistral.ai`, ...) served over TLS on loopback: a throwaway CA
    (trustme) signs a certificate for the names, the client trusts only that CA and resolves
    only those names, to one loopback port. A provider configured with the host's real
    `base_url` builds its request exactly as it would for that host, and the request is
    recorded as it arrives. Each POST is answered with the next script (the last repeats)."""

    def __init__(self, hosts: set[str], *scripts: bytes) -> None:
        self.hosts = hosts
        self._scripts = list(scripts)
        self.requests: list[RecordedRequest] = []
        self._runner: web.AppRunner | None = None
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RealHosts:
        ca = trustme.CA()
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(*sorted(self.hosts)).configure_cert(server_ssl)
        client_ssl = ssl.create_default_context()
        ca.configure_trust(client_ssl)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=server_ssl).start()
        port = int(self._runner.addresses[0][1])
        connector = aiohttp.TCPConnector(resolver=LoopbackResolver(self.hosts, port),
                                         ssl=client_ssl)
        self.session = aiohttp.ClientSession(connector=connector)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append(RecordedRequest(request.method, request.path, dict(request.query),
                                             dict(request.headers), await request.read()))
        script = self._scripts.pop(0) if len(self._scripts) > 1 else self._scripts[0]
        return web.Response(body=script, content_type="text/event-stream")

    def bodies(self) -> list[dict[str, Any]]:
        return [recorded.json() for recorded in self.requests]
