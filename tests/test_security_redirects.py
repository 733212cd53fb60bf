"""Provider calls never follow a redirect: a 3xx is a provider error naming the status and
the target host, and the host it points at receives nothing (no key, no prompt)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from fsm.engine.provider import AbortSignal, PassRequest, ProviderError
from providers.factory import build_provider

from providers_support import TEST_KEY, config_for

SECRET_PROMPT = "system prompt: the vault code is 4711"


@asynccontextmanager
async def loopback(handler: Any) -> AsyncIterator[str]:
    """A loopback aiohttp server answering every request with `handler`; yields its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


CASES = [
    ("openai", {}),
    ("anthropic", {}),
    ("gemini", {}),
    ("openai", {"api_key_header": "api-key", "query_params": {"api-version": "2024-06-01"}}),
    ("gemini", {"api_key_header": "x-custom-key"}),
]


@pytest.mark.asyncio
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize(("kind", "overrides"), CASES)
async def test_a_redirect_is_an_error_and_the_target_receives_nothing(
    kind: str, overrides: dict[str, Any], status: int
) -> None:
    """covers S15, G1: the adapters POST with redirects off; a 3xx names its status and the
    target host only (never the path, the query or the key), and the second server sees no
    request at all (aiohttp would forward x-api-key, x-goog-api-key, custom key headers and,
    on 307/308, the whole body)."""
    stolen: list[dict[str, Any]] = []

    async def thief(request: web.Request) -> web.Response:
        stolen.append({"headers": dict(request.headers), "body": await request.read()})
        return web.Response(text="thanks")

    async with loopback(thief) as thief_url:
        target = f"{thief_url}/collect/{TEST_KEY}?token={TEST_KEY}&k=v"

        async def redirector(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(status=status, headers={"Location": target})

        async with loopback(redirector) as provider_url, aiohttp.ClientSession() as session:
            config = config_for(provider_url, kind, api_key=TEST_KEY, **overrides)
            provider = build_provider(config, session)
            request = PassRequest([], [], system_prompt=SECRET_PROMPT)
            events = [event async for event in provider.stream(request, AbortSignal())]

    assert stolen == []
    [error] = [event for event in events if isinstance(event, ProviderError)]
    assert error.status == status
    assert error.type == "redirect"
    assert error.retryable is False
    assert str(status) in error.message
    assert "127.0.0.1" in error.message
    for leak in ("/collect", "token", TEST_KEY, "k=v", TEST_KEY[:8]):
        assert leak not in error.message


@pytest.mark.asyncio
async def test_a_relative_redirect_names_the_provider_host() -> None:
    """covers S15: a Location without a host points back at the provider's own host, which
    is what the error names; the redirect is still not followed."""
    seen: list[str] = []

    async def redirector(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(status=307, headers={"Location": "/elsewhere?key=abc"})

    async with loopback(redirector) as url, aiohttp.ClientSession() as session:
        provider = build_provider(config_for(url, "anthropic", api_key=TEST_KEY), session)
        events = [e async for e in provider.stream(PassRequest([], []), AbortSignal())]
    [error] = [event for event in events if isinstance(event, ProviderError)]
    assert seen == ["/messages"]
    assert "307" in error.message and "127.0.0.1" in error.message
    assert "elsewhere" not in error.message and "abc" not in error.message
