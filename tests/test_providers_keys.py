"""Key rotation (SPEC G4, issue 15 item 10): an auth or rate-limit failure before any text
was delivered tries the provider's next key before the engine tries the next model; a key
that failed auth is benched for a while; keys are named by index, never shown. A loopback
server answers by the key each request carries; benches run in virtual time."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fsm.engine.generation import Attempt, run_generation_turn
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.provider import AbortSignal, PassRequest, ProviderError, TextDelta
from fsm.scenarios.scripted import InMemoryChannel
from providers.factory import build_provider
from providers.http import SSEProvider
from providers.keys import KeyRing

from providers_support import config_for, sse

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

KEY_A = "sk-test-FIRST-aaaaaaaaaaaaaaaaaaaa"
KEY_B = "sk-test-SECOND-bbbbbbbbbbbbbbbbbbb"
KEY_C = "sk-test-THIRD-ccccccccccccccccccccc"
ANSWER = sse({"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]},
             {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "[DONE]")
REFUSED = {401: {"error": {"message": "Incorrect API key provided.", "type":
                           "invalid_request_error", "code": "invalid_api_key"}},
           429: {"error": {"message": "Rate limit reached for requests", "type": "requests",
                           "code": "rate_limit_exceeded"}},
           500: {"error": {"message": "upstream exploded", "type": "server_error"}}}


class KeyedServer:
    """Answers each request by its bearer key: a status from `refuse`, or the answer."""

    def __init__(self, refuse: dict[str, int]) -> None:
        self.refuse = refuse
        self.seen: list[str] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        key = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.seen.append(key)
        status = self.refuse.get(key)
        if status is not None:
            return web.json_response(REFUSED[status], status=status)
        return web.Response(body=ANSWER, content_type="text/event-stream")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@asynccontextmanager
async def keyed(refuse: dict[str, int], *keys: str,
                **config: Any) -> AsyncIterator[tuple[KeyedServer, SSEProvider]]:
    server = KeyedServer(refuse)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            provider = build_provider(config_for(server.url, "openai", api_key=keys[0],
                                                 api_keys=list(keys[1:]), **config), session)
            yield server, provider
    finally:
        await server.close()


async def call(provider: SSEProvider) -> tuple[str, ProviderError | None]:
    request = PassRequest(context_items=[{"role": "user", "content": "hi"}], function_history=[])
    text, error = "", None
    async for event in provider.stream(request, AbortSignal()):
        if isinstance(event, TextDelta):
            text += event.text
        elif isinstance(event, ProviderError):
            error = event
    return text, error


def seen_as(server: KeyedServer) -> list[str]:
    names = {KEY_A: "A", KEY_B: "B", KEY_C: "C"}
    return [names[key] for key in server.seen]


async def test_rejected_key_moves_to_the_next_key() -> None:
    """covers G4: a 401 on key #0 tries key #1 within the same call; no error surfaces."""
    async with keyed({KEY_A: 401}, KEY_A, KEY_B) as (server, provider):
        assert await call(provider) == ("Hello", None)
    assert seen_as(server) == ["A", "B"]


async def test_rate_limited_key_moves_to_the_next_key() -> None:
    """covers G4: a 429 on one key is not the model's failure: the next key answers."""
    async with keyed({KEY_A: 429}, KEY_A, KEY_B) as (server, provider):
        assert await call(provider) == ("Hello", None)
    assert seen_as(server) == ["A", "B"]


async def test_a_key_that_failed_auth_is_benched_then_tried_again() -> None:
    """covers G4: while benched the key is tried last (after a healthy one); once the bench
    (key_bench_s, virtual time) is over it is back in the rotation."""
    async with keyed({KEY_A: 401}, KEY_A, KEY_B, KEY_C, key_bench_s=120) as (server, provider):
        await call(provider)  # A refused and benched, B answers
        server.refuse[KEY_B] = 429
        await call(provider)  # B rate limited: C next (A is benched)
        assert seen_as(server) == ["A", "B", "B", "C"]
        await asyncio.sleep(121)
        server.refuse = {KEY_C: 429}
        server.seen.clear()
        assert await call(provider) == ("Hello", None)  # C limited, A is back and answers
        assert seen_as(server) == ["C", "A"]


async def test_every_key_failing_names_the_last_key_by_index_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """covers G4: the error names the key by its index; no key reaches the error or logs."""
    caplog.set_level(logging.DEBUG)
    async with keyed({KEY_A: 401, KEY_B: 401}, KEY_A, KEY_B) as (_, provider):
        text, error = await call(provider)
    assert text == "" and error is not None
    assert error.status == 401 and error.message.endswith("(key #1)")
    logged = caplog.text + error.message + repr(error) + repr(provider) + repr(provider.config)
    assert "key #0 refused" in caplog.text
    for key in (KEY_A, KEY_B):
        assert key not in logged and key[8:20] not in logged


async def test_an_error_that_is_not_about_the_key_does_not_rotate() -> None:
    """covers G4: a server error is the model's failure: the chain's next attempt handles it."""
    async with keyed({KEY_A: 500}, KEY_A, KEY_B) as (server, provider):
        _, error = await call(provider)
    assert error is not None and error.status == 500 and seen_as(server) == ["A"]


async def test_ring_order_and_bench() -> None:
    """covers G4: order starts at the last key that worked; benched keys go last."""
    ring = KeyRing(3, bench_s=60)
    assert ring.order(0) == [0, 1, 2]
    ring.failed(0, ProviderError(kind="http", message="x", status=401), now=0)
    assert ring.order(10) == [1, 2, 0] and ring.benched(10) == [0]
    ring.failed(1, ProviderError(kind="http", message="x", status=429), now=10)
    assert ring.order(20) == [2, 1, 0] and ring.benched(20) == [0]  # a 429 is not benched
    assert ring.order(61) == [2, 0, 1] and ring.benched(61) == []


async def test_keys_rotate_before_the_next_model() -> None:
    """covers G4, G1: the primary's second key answers; the fallback model is never called."""
    fallback = KeyedServer({})
    await fallback.start()
    try:
        async with keyed({KEY_A: 401}, KEY_A, KEY_B) as (server, provider), \
                aiohttp.ClientSession() as session:
            locks = ChannelLockRegistry()
            lock = locks.try_acquire("c", "keys")
            assert lock is not None
            channel = InMemoryChannel()
            other = build_provider(config_for(fallback.url, "openai", api_key=KEY_C), session)
            result = await run_generation_turn(
                [Attempt(provider, "primary"), Attempt(other, "fallback")],
                channel=channel, locks=locks, lock=lock, request=TurnRequest())
    finally:
        await fallback.close()
    assert result.status == "completed" and channel.text == "Hello"
    assert len(result.attempts) == 1 and fallback.seen == []
    assert seen_as(server) == ["A", "B"]
    assert KEY_A not in json.dumps(result.as_dict()) and KEY_B not in json.dumps(result.as_dict())
