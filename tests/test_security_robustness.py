"""Small edges that used to fail a reply or spend the channel: an emoji split across two
stream events, and a refusal per message beyond a full queue."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from discord_io.channel_queue import QUEUE_FULL_TEXT, ChannelQueue
from discord_io.delivery import DiscordChannel
from discord_io.splitting import StreamSplitter
from discord_io.testing import emulated_discord
from fsm.engine.locks import ChannelLock, ChannelLockRegistry
from fsm.engine.provider import AbortSignal, PassRequest, ProviderError, TextDelta
from providers.factory import build_provider
from providers.replay_server import ReplayServer

from providers_support import anthropic_sse, config_for, sse

SPLIT_EMOJI = ['"\\ud83d"', '"\\ude00 and "', '"\\udc00 alone"']
"""JSON string literals as a provider may stream them: a pair cut in two, then a lone low
surrogate (JSON allows both; Python decodes them to lone surrogates)."""


def _streams() -> dict[str, bytes]:
    openai = [
        f'{{"choices":[{{"index":0,"delta":{{"content":{part}}}}}]}}' for part in SPLIT_EMOJI
    ]
    anthropic = [
        {"type": "message_start", "message": {"usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
    ]
    gemini = [
        f'{{"candidates":[{{"content":{{"parts":[{{"text":{part}}}]}}}}]}}' for part in SPLIT_EMOJI
    ]
    anthropic_text = b"".join(
        f'event: content_block_delta\ndata: {{"type":"content_block_delta","index":0,'
        f'"delta":{{"type":"text_delta","text":{part}}}}}\n\n'.encode()
        for part in SPLIT_EMOJI
    )
    return {
        "openai": sse(
            *openai,
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            "[DONE]",
        ),
        "anthropic": anthropic_sse(*anthropic)
        + anthropic_text
        + anthropic_sse(
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
            {"type": "message_stop"},
        ),
        "gemini": sse(
            *gemini,
            {"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP"}]},
        ),
    }


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_an_emoji_split_across_events_arrives_whole(kind: str) -> None:
    """covers S4, D1: the adapters join a surrogate pair cut across two events and replace
    a lone surrogate, so no text event carries what no encoder accepts (one emoji used to
    fail the whole reply with a traceback)."""
    async with ReplayServer(_streams()[kind]) as server, aiohttp.ClientSession() as session:
        provider = build_provider(config_for(server, kind), session)
        events = [e async for e in provider.stream(PassRequest([], []), AbortSignal())]
    assert not [e for e in events if isinstance(e, ProviderError)], events
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "\U0001f600 and \ufffd alone"
    text.encode("utf-8")  # well formed


@pytest.mark.asyncio
async def test_delivery_survives_lone_surrogates() -> None:
    """covers D1: text from any other source (a tool, a scripted provider) may still hold a
    lone surrogate: the splitter counts it and the message goes out with U+FFFD instead of
    the reply failing in `discord_length`."""
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None)  # type: ignore[arg-type]
        await channel.deliver("smile \ud83d")
        await channel.deliver("\ude00 and \udc00")
        await channel.finish_pass()
        assert [r.json["content"] for r in emu.sent()] == ["smile \U0001f600 and \ufffd"]
        assert channel.delivered_text == "smile \ud83d\ude00 and \udc00"


def test_a_hard_cut_never_splits_a_surrogate_pair() -> None:
    """covers D1: an unbroken run of emoji cut at the limit keeps each pair in one message."""
    splitter = StreamSplitter(64)
    text = "\ud83d\ude00" * 100  # as a stream of lone halves would carry it
    chunks = splitter.feed(text) + splitter.flush()
    assert all("\ufffd" not in chunk.content for chunk in chunks)
    assert "".join(chunk.source for chunk in chunks) == text


# ---------------------------------------------------------------- refusals beyond the queue

CHANNEL = "chan-1"


async def _held_turn(message: str, lock: ChannelLock) -> None:
    await asyncio.Event().wait()


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_spammer_is_refused_once_per_window() -> None:
    """covers D4: beyond a full queue each sender gets one refusal text per window per
    channel; their further messages are refused without text (they were told), another
    sender is still told, and after the window the spammer is told again."""
    registry = ChannelLockRegistry()
    queue: ChannelQueue[str] = ChannelQueue(
        registry, _held_turn, max_queued=1, user_of=lambda message: message.split(":")[0],
        refusal_window_s=60.0,
    )
    try:
        assert queue.submit(CHANNEL, "ana:first").status == "started"
        assert queue.submit(CHANNEL, "ana:second").status == "queued"
        spam = [queue.submit(CHANNEL, f"bob:{n}") for n in range(20)]
        assert [s.status for s in spam] == ["full"] * 20
        assert [s.refusal for s in spam] == [QUEUE_FULL_TEXT] + [None] * 19
        assert not any(s.accepted for s in spam)
        assert queue.submit(CHANNEL, "cy:hello").refusal == QUEUE_FULL_TEXT
        assert queue.submit("other-channel", "bob:x").status == "started"
        await asyncio.sleep(59.0)
        assert queue.submit(CHANNEL, "bob:still").refusal is None
        await asyncio.sleep(1.0)
        assert queue.submit(CHANNEL, "bob:later").refusal == QUEUE_FULL_TEXT
    finally:
        await queue.aclose()
