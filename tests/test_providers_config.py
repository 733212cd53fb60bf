"""Provider attempt configuration (G1) and secret hygiene: the API key is never shown in a
repr, a validation error, an error event or a log line."""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import pydantic
import pytest

from fsm.engine.provider import AbortSignal
from providers.anthropic import AnthropicProvider
from providers.config import ProviderConfig
from providers.factory import build_provider
from providers.gemini import GeminiProvider
from providers.openai import OpenAIProvider
from providers.replay_server import ReplayServer
from providers.stream_file import replay_request

from providers_support import TEST_KEY, collect, config_for, sse


def test_key_is_read_from_the_named_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """covers G1: each attempt names the variable holding its key; the key stays secret."""
    monkeypatch.setenv("TEST_PROVIDER_KEY", TEST_KEY)
    config = ProviderConfig(kind="anthropic", model="claude", api_key_env="TEST_PROVIDER_KEY")
    assert config.api_key is not None and config.api_key.get_secret_value() == TEST_KEY
    assert TEST_KEY not in repr(config) and TEST_KEY not in str(config)
    assert config.endpoint_base == "https://api.anthropic.com/v1"


def test_missing_environment_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """covers G1: a misconfigured attempt fails at load time, naming the field and variable."""
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(pydantic.ValidationError, match="api_key_env: environment variable"):
        ProviderConfig(kind="openai", model="m", api_key_env="NOT_SET_ANYWHERE")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"kind": "mistral"}, "kind"),
        ({"model": ""}, "model"),
        ({"base_url": "ftp://example.com"}, "base_url"),
        ({"connect_timeout_s": 0}, "connect_timeout_s"),
        ({"read_timeout_s": -1}, "read_timeout_s"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 0.5}, "temperature"),
    ],
)
def test_invalid_values_name_the_field(overrides: dict[str, Any], field: str) -> None:
    """covers G1: every invalid value is reported against its field; inputs are not echoed
    (they might be secrets)."""
    data = {"kind": "openai", "model": "m", "api_key": TEST_KEY, **overrides}
    with pytest.raises(pydantic.ValidationError) as info:
        ProviderConfig.model_validate(data)
    assert info.value.errors()[0]["loc"] == (field,)
    assert TEST_KEY not in str(info.value)


@pytest.mark.asyncio
async def test_build_provider_picks_the_adapter_by_kind() -> None:
    """covers G1: one factory for every kind in an attempt chain."""
    async with aiohttp.ClientSession() as session:
        for kind, adapter in [
            ("openai", OpenAIProvider),
            ("anthropic", AnthropicProvider),
            ("gemini", GeminiProvider),
        ]:
            config = ProviderConfig.model_validate(
                {"kind": kind, "model": "m", "api_key": TEST_KEY}
            )
            provider = build_provider(config, session)
            assert isinstance(provider, adapter)
            assert provider.name == f"{kind}:m"
            assert TEST_KEY not in repr(provider)


@pytest.mark.asyncio
async def test_api_key_echoed_by_the_server_is_scrubbed(caplog: pytest.LogCaptureFixture) -> None:
    """covers S8, G1: a 401 body that quotes the key (OpenAI does) reaches neither the error
    event nor the log."""
    message = (
        f"Incorrect API key provided: {TEST_KEY}. You can find your API key at "
        "https://platform.openai.com/account/api-keys."
    )
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}}
    ).encode()
    caplog.set_level(logging.DEBUG)
    async with ReplayServer(body, status=401, content_type="application/json") as server:
        events, summary = await collect(server, "openai", api_key=TEST_KEY)
    assert summary.error is not None
    assert (summary.error.status, summary.error.retryable) == (401, False)
    assert "Incorrect API key provided: [redacted]." in summary.error.message
    assert all(TEST_KEY not in repr(event) for event in events)
    assert caplog.records, "the error should be logged"
    assert TEST_KEY not in caplog.text


@pytest.mark.asyncio
async def test_api_key_echoed_in_band_is_scrubbed(caplog: pytest.LogCaptureFixture) -> None:
    """covers S8: an in-band error quoting the key is scrubbed too."""
    caplog.set_level(logging.DEBUG)
    script = sse({"type": "error", "error": {"type": "api_error", "message": f"bad {TEST_KEY}"}})
    async with ReplayServer(script) as server:
        _, summary = await collect(server, "anthropic", api_key=TEST_KEY)
    assert summary.error is not None and summary.error.message == "bad [redacted]"
    assert TEST_KEY not in caplog.text


@pytest.mark.asyncio
async def test_connection_error_message_carries_no_key(caplog: pytest.LogCaptureFixture) -> None:
    """covers S8: the key travels in a header, so connection errors (which quote the URL)
    cannot leak it, Gemini included."""
    caplog.set_level(logging.DEBUG)
    async with aiohttp.ClientSession() as session:
        provider = build_provider(
            config_for("http://127.0.0.1:9", "gemini", api_key=TEST_KEY), session
        )
        events = [e async for e in provider.stream(replay_request(), AbortSignal())]
    assert len(events) == 1 and TEST_KEY not in repr(events[0])
    assert TEST_KEY not in caplog.text
