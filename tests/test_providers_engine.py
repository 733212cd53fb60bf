"""Server behaviours that only matter once the engine acts on them: a whitespace-only reply
is an empty response, an error after partial text falls back, and the fallback continuation
(G1) works on a provider that takes no trailing prefill (instruction mode) and on one that
echoes it (llama.cpp), with no text delivered twice. Real adapters over loopback HTTP, the
engine's generation chain, virtual time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fsm.engine.generation import Attempt, run_generation_turn
from fsm.engine.prefill import TurnRequest
from fsm.engine.turn import Turn
from fsm.scenarios.scripted import InMemoryChannel
from providers.factory import build_provider
from providers.prefill import continuation_instruction
from providers.replay_server import ReplayServer

from providers_support import FIXTURES, anthropic_sse, channel_lock, config_for, serving, sse

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

SERVERS = FIXTURES / "servers"
PARTIAL = "The forecast for Paris: sunny in the morning,"


def chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": text} if text else {},
                         "finish_reason": finish}]}


def cut_primary() -> ReplayServer:
    """A primary that writes part of its answer and drops the connection without a finish."""
    return ReplayServer(sse(chunk("The forecast for Paris:"), chunk(" sunny in the morning,")))


async def test_whitespace_only_reply_is_an_empty_response() -> None:
    """covers S8: a reply of whitespace only would show nothing on Discord: empty_response,
    which the generation chain falls back on, not completed."""
    server = ReplayServer((SERVERS / "ollama_whitespace_only_reply.sse").read_bytes())
    async with serving(server) as session:
        locks, lock = channel_lock()
        provider = build_provider(config_for(server, "openai"), session)
        result = await Turn(provider=provider, channel=InMemoryChannel(), locks=locks,
                            lock=lock).run()
    assert result.status == "empty_response"


async def test_llamacpp_error_field_after_text_falls_back() -> None:
    """covers G1, S8: llama.cpp's `error:` line then [DONE] ends the attempt in an error
    (today's empty_response hid it); the fallback answers."""
    failing = ReplayServer((SERVERS / "llamacpp_error_field_then_done.sse").read_bytes())
    healthy = ReplayServer(sse(chunk(" fox."), chunk("", "stop"), "[DONE]"))
    async with serving(failing, healthy) as session:
        locks, lock = channel_lock()
        channel = InMemoryChannel()
        result = await run_generation_turn(
            [Attempt(build_provider(config_for(failing, "openai"), session), "llama"),
             Attempt(build_provider(config_for(healthy, "openai"), session), "fallback")],
            channel=channel, locks=locks, lock=lock, request=TurnRequest())
    first = result.attempts[0]
    assert first.status == "error" and first.passes[-1].error is not None
    assert first.passes[-1].error["type"] == "context_length_exceeded"
    assert result.status == "completed" and channel.text == " The quick brown fox."


async def test_fallback_continues_on_a_provider_without_trailing_prefill() -> None:
    """covers G1, S1: the fallback is Claude 4.6 (instruction mode by default): its request
    ends in a user instruction quoting the delivered text, never in an assistant turn, and
    the channel shows the answer once."""
    primary = cut_primary()
    claude = ReplayServer(anthropic_sse(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text",
                                                                      "text": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": " then rain by evening."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
        {"type": "message_stop"}))
    async with serving(primary, claude) as session:
        locks, lock = channel_lock()
        channel = InMemoryChannel()
        result = await run_generation_turn(
            [Attempt(build_provider(config_for(primary, "openai"), session), "primary"),
             Attempt(build_provider(config_for(claude, "anthropic", model="claude-opus-4-6"),
                                    session), "claude")],
            channel=channel, locks=locks, lock=lock,
            request=TurnRequest(context_items=[{"role": "user", "content": "weather?"}]))
    assert [a.status for a in result.attempts] == ["error", "completed"]
    assert channel.text == PARTIAL + " then rain by evening."
    body = json.loads(claude.requests[0].body)
    assert body["system"].endswith(continuation_instruction(PARTIAL))  # A4: the system role
    assert all(m["role"] != "assistant" for m in body["messages"])


async def test_fallback_configured_without_trailing_prefill_on_openai_kind() -> None:
    """covers G1, S1: any provider configured `prefill: "instruction"` gets the same."""
    primary = cut_primary()
    fallback = ReplayServer(sse(chunk(" then rain."), chunk("", "stop"), "[DONE]"))
    async with serving(primary, fallback) as session:
        locks, lock = channel_lock()
        channel = InMemoryChannel()
        result = await run_generation_turn(
            [Attempt(build_provider(config_for(primary, "openai"), session), "primary"),
             Attempt(build_provider(config_for(fallback, "openai", prefill="instruction"),
                                    session), "fallback")],
            channel=channel, locks=locks, lock=lock, request=TurnRequest())
    assert result.status == "completed" and channel.text == PARTIAL + " then rain."
    messages = json.loads(fallback.requests[0].body)["messages"]
    assert messages[-1] == {"role": "system", "content": continuation_instruction(PARTIAL)}


async def test_fallback_onto_an_echoing_server_delivers_nothing_twice() -> None:
    """covers G1, S1: llama.cpp echoes the native prefill in its first chunk; the echo is
    dropped, so the channel shows the first attempt's text once, then the continuation."""
    primary = ReplayServer(sse(chunk("The first attempt"), chunk(" wrote this much")))
    llama = ReplayServer((SERVERS / "llamacpp_prefill_echo.sse").read_bytes())
    async with serving(primary, llama) as session:
        locks, lock = channel_lock()
        channel = InMemoryChannel()
        result = await run_generation_turn(
            [Attempt(build_provider(config_for(primary, "openai"), session), "primary"),
             Attempt(build_provider(config_for(llama, "openai"), session), "llama")],
            channel=channel, locks=locks, lock=lock, request=TurnRequest())
    assert result.status == "completed"
    assert channel.text == "The first attempt wrote this much and the fallback goes on."
    messages = json.loads(llama.requests[0].body)["messages"]
    assert messages[-1] == {"role": "assistant", "content": "The first attempt wrote this much"}
