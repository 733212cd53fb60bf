"""The bot end to end as it runs in production: `build_client()` (an AutoShardedClient, two
shards here) started with `client.start()` against the emulated gateway and REST, the real
engine, a scripted model. Messages and `/kill` arrive as gateway dispatches; a reconnect in
the middle of a streaming turn loses no turn and sends nothing twice. Virtual time; a real
websocket on loopback.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import discord
import pytest
from gateway_support import CALLBACK, PARAGRAPH, SEND, bot_on_gateway

from discord_io.testing import Fault
from discord_io.testing.gateway import IDENTIFY, RESUME

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


def streamed(text: str, step_s: float = 0.1, size: int = 100) -> list[dict[str, Any]]:
    return [{"at": round(step_s * (i + 1), 6), "text": text[i * size:(i + 1) * size]}
            for i in range((len(text) + size - 1) // size)]


async def test_the_production_client_is_sharded_and_each_guild_on_its_shard(
        tmp_path: Path) -> None:
    # covers D4 (turns per channel, each channel's events from its guild's shard)
    passes = [[{"at": 1, "text": "first guild answer"}, {"at": 2, "end": "completed"}],
              [{"at": 1, "text": "second guild answer"}, {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(passes, tmp_path) as h:
        assert isinstance(h.client, discord.AutoShardedClient) and h.client.shard_count == 2
        assert sorted(tuple(p.data["shard"]) for p in h.emu.gateway.payloads(IDENTIFY)) == [
            (0, 2), (1, 2)]
        assert h.shard_of(h.emu.channel_id) != h.shard_of(h.other_channel)
        assert h.emu.commands[None][0]["name"] == "kill"  # synced from setup_hook
        await h.mention("hello")
        await h.mention("hello there", channel=h.other_channel)
        await h.queued(h.emu.channel_id)
        await h.queued(h.other_channel)
        await h.idle()
        await h.idle(h.other_channel)
        # the shards' connections race, so either channel may take either scripted pass
        assert sorted(h.sent() + h.sent(h.other_channel)) == [
            "first guild answer", "second guild answer"]
        assert len(h.sent()) == len(h.sent(h.other_channel)) == 1
        [first] = h.emu.sent()
        assert first.json["message_reference"]["message_id"] == int(h.posted[0]["id"])


async def test_only_messages_addressed_to_the_bot_are_answered(tmp_path: Path) -> None:
    # covers D4 (admission through the gateway: a mention, not chatter, not the bot itself)
    passes = [[{"at": 1, "text": "answer"}, {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(passes, tmp_path) as h:
        await h.emu.gateway.message_create(h.emu.channel_id, h.emu.alice_id, "just chatting")
        await h.emu.gateway.message_create(h.emu.channel_id, h.emu.bot_id, "my own words")
        await h.mention("this one")
        await h.queued(h.emu.channel_id)
        await h.idle()
        assert h.sent() == ["answer"]
        assert [r.status for r in h.bot.results] == ["completed"]


async def test_a_second_message_waits_for_the_first_turn(tmp_path: Path) -> None:
    # covers D4
    passes = [[{"at": 1, "text": "first answer"}, {"at": 30, "end": "completed"}],
              [{"at": 1, "text": "second answer"}, {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(passes, tmp_path) as h:
        await h.mention("one")
        await asyncio.sleep(5)
        await h.mention("two", author=h.bob)
        await h.queued(h.emu.channel_id, count=2)
        assert len(h.bot.queue.pending(str(h.emu.channel_id))) == 1
        await h.idle()
        assert h.sent() == ["first answer", "second answer"]


async def test_kill_as_a_real_interaction_stops_the_stream_and_empties_the_queue(
        tmp_path: Path) -> None:
    # covers D3, S7
    text = "\n\n".join(PARAGRAPH.strip() for _ in range(6))
    passes = [[*streamed(text, step_s=1.0), {"at": 120, "end": "completed"}],
              [{"at": 1, "text": "never"}, {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(passes, tmp_path) as h:
        await h.mention("a long story")
        await h.emu.wait_for(lambda r: r.route == SEND)  # the first paragraph is out
        await h.mention("and then?", author=h.bob)
        await h.queued(h.emu.channel_id, count=2)
        # a moderator's /kill (Manage Messages): the requester's own would leave bob's
        # question queued (A7)
        await h.emu.gateway.interaction("kill", channel_id=h.emu.channel_id,
                                        permissions=1 << 13)
        [answer] = await h.emu.wait_for(lambda r: r.route == CALLBACK)
        assert answer.json["data"]["content"] == (
            "Stopping the reply in this channel. Dropped 1 queued message.")
        assert answer.json["data"]["flags"] & 64  # ephemeral
        await h.idle()
        [result] = h.bot.results
        assert result.status == "stopped_by_user"
        delivered = h.sent()
        assert delivered and "never" not in delivered
        assert text.replace("\n", "").startswith("".join(delivered).replace("\n", ""))


async def test_a_reconnect_mid_stream_loses_no_turn_and_sends_nothing_twice(
        tmp_path: Path) -> None:
    # covers D2 (every delivered message recorded, none twice), D4 (no turn lost)
    text = "\n\n".join(f"{i} " + PARAGRAPH.strip() for i in range(5))
    passes = [[*streamed(text, step_s=0.2), {"at": 20, "end": "completed"}],
              [{"at": 1, "text": "answer to the message sent while away"},
               {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(passes, tmp_path) as h:
        shard = h.shard_of(h.emu.channel_id)
        session = h.emu.gateway.live_session(shard)
        assert session is not None
        await h.mention("stream please")
        await h.emu.wait_for(lambda r: r.route == SEND)  # mid-stream: some text is out
        await h.emu.gateway.drop(shard)
        await h.mention("one more", author=h.bob)  # dispatched while the shard is away
        [resume] = await h.emu.gateway.wait_for_payload(RESUME)
        assert (resume.shard_id, resume.data["session_id"]) == (shard, session.session_id)
        await h.queued(h.emu.channel_id, count=2)
        await h.idle()
        first, second = [r.status for r in h.bot.results]
        assert (first, second) == ("completed", "completed")
        sent = h.sent()
        assert sent[-1] == "answer to the message sent while away"
        assert "".join(sent[:-1]).replace("\n", "") == text.replace("\n", "")
        assert len(sent) == len(set(sent))  # nothing sent twice
        assert len(h.emu.gateway.payloads(IDENTIFY)) == 2  # one per shard, none again
        answered = [r.json["message_reference"]["message_id"] for r in h.emu.sent()
                    if "message_reference" in r.json]
        assert answered == [int(p["id"]) for p in h.posted]


async def test_a_follow_up_from_the_same_user_interrupts_the_stream(tmp_path: Path) -> None:
    # covers S17
    passes = [[{"at": 1, "text": "Thinking about"}, {"at": 50, "end": "completed"}],
              [{"at": 1, "text": "Answering the new message."}, {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(passes, tmp_path) as h:
        await h.mention("question")
        await asyncio.sleep(3)
        await h.mention("actually, another question")
        await h.queued(h.emu.channel_id, count=1)
        await asyncio.sleep(1)
        await h.idle()
        assert [r.status for r in h.bot.results] == ["follow_up_interrupt", "completed"]
        assert h.sent()[-1] == "Answering the new message."


async def test_a_rate_limited_send_is_retried_after_retry_after(tmp_path: Path) -> None:
    # covers D2 (429 retry_after honoured)
    passes = [[{"at": 1, "text": "hello"}, {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(passes, tmp_path) as h:
        h.emu.inject(SEND, Fault.rate_limited(2.0))
        await h.mention("hi")
        await h.queued(h.emu.channel_id)
        await h.idle()
        limited, delivered = h.emu.requests_to(SEND)
        assert (limited.status, delivered.status) == (429, 200)
        assert delivered.at - limited.at >= 2.0
        assert [r.status for r in h.bot.results] == ["completed"]
