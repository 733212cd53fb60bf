"""The Discord side of issue 15 (items 4, 8 and 12) and issue 12's delivery bound: real
discord.py against the loopback emulator. A channel Discord refuses ends the chain (G3), the
reply is bounded in messages (D5), a failed attempt's messages can be deleted before the
fallback answers in full, and the thought log reaches its channel (T8). Virtual time."""

from __future__ import annotations

from typing import Any

import pytest

from discord_io.delivery import DeliveryError, DestinationRefused, DiscordChannel
from discord_io.testing import DiscordEmulator, Fault, emulated_discord
from fsm.engine.channel import DeliveryCapReached, DestinationUnavailable
from fsm.engine.config import TurnConfig
from fsm.engine.generation import Attempt, GenerationResult, run_generation_turn
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import ScriptedProvider

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

SEND = "POST /channels/{channel_id}/messages"
DELETE = "DELETE /channels/{channel_id}/messages/{message_id}"


def _provider(*passes: list[dict[str, Any]]) -> ScriptedProvider:
    return ScriptedProvider(parse_scenario({"passes": list(passes)}).passes)


def _channel(client: Any, emu: DiscordEmulator, **options: Any) -> DiscordChannel:
    return DiscordChannel(client, emu.channel_id, idle_flush_s=None, **options)


async def _reply(channel: DiscordChannel, providers: list[ScriptedProvider],
                 **config: Any) -> GenerationResult:
    locks = ChannelLockRegistry()
    lock = locks.try_acquire(str(channel.channel_id), "o")
    assert lock is not None
    try:
        return await run_generation_turn(
            [Attempt(p, f"m{n}") for n, p in enumerate(providers)], channel=channel,
            locks=locks, lock=lock, request=TurnRequest(), config=TurnConfig(**config))
    finally:
        await channel.aclose()


@pytest.mark.parametrize(("status", "code", "message"), [
    (403, 50001, "Missing Access"), (403, 50013, "Missing Permissions"),
    (404, 10003, "Unknown Channel")])
async def test_a_channel_discord_refuses_ends_the_chain(status: int, code: int,
                                                        message: str) -> None:
    # covers G3, D2: no further model is spent on a channel that cannot receive the answer
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.error(status, code, message))
        fallback = _provider([{"at": 1, "text": "never sent"}, {"at": 2, "end": "completed"}])
        result = await _reply(_channel(client, emu), [
            _provider([{"at": 1, "text": "Hello."}, {"at": 2, "end": "completed"}]), fallback])
        assert result.status == "error" and len(result.attempts) == 1
        assert result.attempts[0].failure == "destination_unavailable"
        assert fallback.calls == 0 and emu.sent() == []


async def test_other_send_failures_are_not_a_dead_destination() -> None:
    # covers G3 (only the channel's own refusals), D2
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, *[Fault.server_error(500)] * 6)
        channel = _channel(client, emu)
        await channel.deliver("x")
        with pytest.raises(DeliveryError) as failure:
            await channel.finish_pass()
        assert not isinstance(failure.value, DestinationUnavailable)
        assert isinstance(DestinationRefused("x", code=50013), DestinationUnavailable)
        await channel.aclose()


async def test_the_reply_is_bounded_in_messages() -> None:
    # covers D5, D1: short lines cut into many messages reach the message bound; the turn
    # ends delivery_cap with one notice, and nothing past the bound is sent
    lines = [{"at": 1 + n * 0.1, "text": f"line {n}\n\n"} for n in range(40)]
    async with emulated_discord() as (emu, client):
        channel = _channel(client, emu, max_messages=3, flush_paragraphs=True)
        result = await _reply(channel, [_provider([*lines, {"at": 9, "end": "completed"}])])
        assert result.status == "delivery_cap" and result.notices == ["delivery_cap"]
        texts = [r.json["content"] for r in emu.sent() if r.json.get("content")]
        embeds = [r.json["embeds"][0]["title"] for r in emu.sent() if r.json.get("embeds")]
        assert texts == ["line 0", "line 1", "line 2"] and embeds == ["Reply too long"]
        assert result.delivered_text == "line 0\n\nline 1\n\nline 2\n\n"
        with pytest.raises(DeliveryCapReached):
            await channel.deliver("more")


async def test_the_reply_is_bounded_in_characters_on_discord() -> None:
    # covers D5: a model that never stops is cut at the character bound
    words = [{"at": 1 + n * 0.01, "text": "word " * 50} for n in range(200)]
    async with emulated_discord() as (emu, client):
        result = await _reply(_channel(client, emu), [_provider(words)],
                              max_delivered_chars=5000)
        assert result.status == "delivery_cap" and len(result.delivered_text) == 5000
        assert all(len(r.json.get("content") or "") <= 2000 for r in emu.sent())


async def test_a_failed_attempts_messages_can_be_deleted_before_the_fallback() -> None:
    # covers G1 (continuation is the default), D2 (every delivered message is recorded so a
    # superseded attempt's partial output can be cleaned up), issue 15 item 12
    failing = [{"at": 1, "text": "A first paragraph.\n\n"}, {"at": 2, "text": "And half"},
               {"at": 3, "error": "server_error"}]
    async with emulated_discord() as (emu, client):
        fallback = _provider([{"at": 1, "text": "The whole answer."},
                              {"at": 2, "end": "completed"}])
        result = await _reply(_channel(client, emu), [_provider(failing), fallback],
                              superseded_output="delete")
        assert result.status == "completed" and result.superseded_deleted == 1
        assert fallback.requests[0].prefill == ""
        assert len(emu.requests_to(DELETE)) == 1
        assert [m["content"] for m in emu.channel_messages()] == ["The whole answer."]
        assert result.delivered_text == "The whole answer."


async def test_the_thought_log_is_posted_in_its_own_channel() -> None:
    # covers T8 (a channel destination), D1 (cut like a reply, never a mention)
    async with emulated_discord() as (emu, client):
        log_channel = emu.add_text_channel("bot-thoughts")
        channel = _channel(client, emu)
        await channel.post_thoughts(str(log_channel), "Tomori", "think " * 500)
        posted = [r.json for r in emu.sent(log_channel)]
        assert len(posted) == 2 and all(len(p["content"]) <= 2000 for p in posted)
        assert posted[0]["content"].startswith("**Thoughts of Tomori:** think")
        assert all(p["allowed_mentions"]["parse"] == [] for p in posted)
        assert emu.sent() == []  # not in the reply channel
        await channel.aclose()
