"""No part of a configured secret reaches an error message, a log line or a repr: secrets
are scrubbed before a message is cut, a secret's prefix left at any cut is scrubbed too, and
every configured secret counts (the key, key-like query parameters, custom auth headers)."""

from __future__ import annotations

import json
import logging
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fsm.engine.provider import AbortSignal, PassRequest, ProviderError
from providers.config import ProviderConfig
from providers.errors import REDACTED, cut_message, looks_like_key, scrub
from providers.factory import build_provider
from providers.replay_server import ReplayServer

from providers_support import config_for

KEY = "sk-live-Zq8Rb2Kd9Xw4Lm7Np3Tv6Yh1Cs5Fg0Ju"
QUERY_KEY = "AIzaSyQ7uN3bV9cX2mL8kP4rT6wY1hJ5gF0dS"
HEADER_TOKEN = "tok_9f8e7d6c5b4a39281706f5e4d3c2b1a0"
ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

secrets = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from(["sk-", "sk-ant-api03-", "AIza", "tok_", "key-", "xai-"]),
    st.text(ALNUM, min_size=16, max_size=60),
)
filler = st.text(st.characters(codec="utf-8", exclude_characters="[]"), max_size=700)


def leaked_prefixes(text: str, secret: str, shortest: int = 4) -> list[str]:
    """Every prefix of `secret` at least `shortest` long that occurs in `text`."""
    return [secret[:n] for n in range(shortest, len(secret) + 1) if secret[:n] in text]


@settings(max_examples=300, deadline=None)
@given(secret=secrets, before=filler, after=filler, limit=st.integers(1, 900))
def test_cutting_never_leaves_a_piece_of_a_secret(
    secret: str, before: str, after: str, limit: int
) -> None:
    """covers S15: wherever the secret sits relative to the cut, no prefix of it (4+ chars)
    survives, and the cut text never ends in a prefix of it (however short)."""
    message = cut_message(before + secret + after, limit, [secret])
    assert leaked_prefixes(message, secret) == []
    assert len(message) <= limit + len(REDACTED) + 1
    if len(scrub(before + secret + after, [secret])) > limit:  # it was cut
        body = message.removesuffix("…")
        assert not any(body.endswith(secret[:n]) for n in range(1, len(secret) + 1))


@settings(max_examples=300, deadline=None)
@given(secret=secrets, before=filler, cut=st.integers(4, 60), after=filler)
def test_a_secret_already_cut_upstream_is_scrubbed(
    secret: str, before: str, cut: int, after: str
) -> None:
    """covers S15: a body cut before it reached us (the 64 KB read limit, `data begins ...`
    excerpts) may end a secret early; the piece is scrubbed wherever it sits."""
    piece = secret[: min(cut, len(secret))]
    assert leaked_prefixes(scrub(before + piece + "'" + after, [secret]), secret) == []


def test_scrub_handles_overlapping_and_repeated_secrets() -> None:
    """covers S15: the longer of two overlapping secrets is removed whole."""
    text = f"a {KEY} b {KEY[:20]} c {KEY}{KEY}"
    scrubbed = scrub(text, [KEY[:12], KEY])
    assert leaked_prefixes(scrubbed, KEY) == [] and scrubbed.startswith("a [redacted] b")


async def provider_error(kind: str, status: int, body: bytes, **overrides: Any) -> ProviderError:
    server = ReplayServer(body, status=status, content_type="application/json")
    async with server, aiohttp.ClientSession() as session:
        provider = build_provider(config_for(server, kind, **overrides), session)
        events = [e async for e in provider.stream(PassRequest([], []), AbortSignal())]
    [error] = [event for event in events if isinstance(event, ProviderError)]
    return error


@pytest.mark.asyncio
@pytest.mark.parametrize("offset", [436, 450, 462, 466, 470, 480])
async def test_a_key_straddling_the_message_limit_does_not_leak(offset: int) -> None:
    """covers S15: the error message is cut at 500 characters; a key echoed across the cut
    used to leak its first characters (the cut came before the scrub)."""
    message = "x" * offset + f" Incorrect API key provided: {KEY}. More text follows."
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
    error = await provider_error("openai", 401, body.encode(), api_key=KEY)
    assert leaked_prefixes(error.message, KEY) == [], error.message[-60:]
    body = error.message.removesuffix("…")
    assert not any(body.endswith(KEY[:n]) for n in range(1, len(KEY) + 1)), body[-60:]


@pytest.mark.asyncio
async def test_query_parameter_keys_and_custom_auth_headers_are_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """covers S15: a key passed as a query parameter or in a custom header is scrubbed from
    errors and logs like the API key itself."""
    echo = f"bad request: key={QUERY_KEY} auth=Bearer {HEADER_TOKEN} x-token={HEADER_TOKEN}"
    body = json.dumps({"error": {"code": 400, "message": echo, "status": "INVALID_ARGUMENT"}})
    with caplog.at_level(logging.WARNING):
        error = await provider_error(
            "gemini",
            400,
            body.encode(),
            query_params={"key": QUERY_KEY},
            extra_headers={"Authorization": f"Bearer {HEADER_TOKEN}"},
        )
    for secret in (QUERY_KEY, HEADER_TOKEN):
        assert leaked_prefixes(error.message, secret) == []
        assert secret[:8] not in caplog.text


def test_config_repr_never_shows_a_secret() -> None:
    """covers S15: repr() and str() of a config hide the key, key-like query parameters,
    auth headers and credentials in a base URL."""
    config = ProviderConfig(
        kind="openai",
        model="m",
        base_url=f"https://user:{HEADER_TOKEN}@example.test/v1",
        api_key=KEY,  # type: ignore[arg-type]
        query_params={"key": QUERY_KEY, "api-version": "2024-06-01"},
        extra_headers={"x-auth-token": HEADER_TOKEN},
    )
    for shown in (repr(config), str(config), f"{config!r}"):
        for secret in (KEY, QUERY_KEY, HEADER_TOKEN):
            assert secret[:8] not in shown, shown
    assert "2024-06-01" in repr(config)
    assert {KEY, QUERY_KEY, HEADER_TOKEN} <= set(config.secrets())


@pytest.mark.parametrize(
    "pasted",
    [KEY, QUERY_KEY, "sk-ant-api03-AbCdEf0123456789", "0123456789abcdef0123456789abcdef"],
)
def test_a_key_pasted_as_the_variable_name_is_never_echoed(pasted: str) -> None:
    """covers S15: `api_key_env` names a variable; a key pasted there is refused with a
    one-line error that does not repeat it."""
    with pytest.raises(ValidationError) as raised:
        ProviderConfig(kind="openai", model="m", api_key_env=pasted)
    assert pasted[:8] not in str(raised.value)
    assert pasted[:8] not in repr(raised.value)
    assert "api_key_env" in str(raised.value)


def test_an_ordinary_variable_name_is_still_named_when_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """covers S15: the helpful message stays for a real variable name."""
    monkeypatch.delenv("OPENAI_API_KEY_FOR_TESTS", raising=False)
    with pytest.raises(ValidationError, match="OPENAI_API_KEY_FOR_TESTS"):
        ProviderConfig(kind="openai", model="m", api_key_env="OPENAI_API_KEY_FOR_TESTS")


@pytest.mark.parametrize(
    ("value", "looks"),
    [
        (KEY, True),
        (QUERY_KEY, True),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc", True),
        ("ghp_16C7e42F292c6912E7710c838347Ae178B4a", True),
        ("0123456789abcdef0123456789abcdef", True),
        ("OPENAI_API_KEY", False),
        ("claude-3-5-sonnet-20241022", False),
        ("2024-06-01-preview", False),
        ("gpt-4o-mini", False),
    ],
)
def test_what_looks_like_a_key(value: str, looks: bool) -> None:
    """covers S15: the heuristic behind "never echo a value that looks like a key"."""
    assert looks_like_key(value) is looks
