"""The bot through the emulated gateway where Discord says no: read-only and announcement
channels, a channel without READ_MESSAGE_HISTORY, threads (archived, locked, private, in an
announcement channel) and forum posts, a stall past the heartbeat, a session that expires,
a late interaction, a thousand channels at once. In each the user sees an answer or the bot
stays silent by design, and no model turn is spent where nothing can be posted (the
scripted provider counts its calls). Virtual time; a real websocket on loopback.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from gateway_support import CALLBACK, PARAGRAPH, SEND, Harness, bot_on_gateway

from discord_io.admission import AccessPolicy
from discord_io.global_pace import pace_globally
from discord_io.testing import block_event_loop
from discord_io.testing import permissions as perms
from discord_io.testing.gateway import HEARTBEAT_INTERVAL_MS, IDENTIFY, RESUME
from turn_engine.bot import bot_intents

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

TYPING = "POST /channels/{channel_id}/typing"
HISTORY = "GET /channels/{channel_id}/messages"


def long_stream() -> list[dict[str, Any]]:
    """Six 900-character paragraphs, 100 characters a second: the first goes out early."""
    text = "\n\n".join(PARAGRAPH.strip() for _ in range(6))
    return [{"at": 1.0 * (i + 1), "text": text[i * 100:(i + 1) * 100]}
            for i in range((len(text) + 99) // 100)]


def answer(text: str = "answer", *, end_at: float = 2) -> list[dict[str, Any]]:
    return [{"at": 1, "text": text}, {"at": end_at, "end": "completed"}]


async def settle(h: Harness) -> None:
    """Long enough for a turn that would start to reach the provider and Discord."""
    await asyncio.sleep(5)
    for channel in list(h.bot._channels):
        await h.bot.queue.join(channel)


def spent(h: Harness, channel: int) -> list[str]:
    """Requests the bot made to `channel` (typing, history, sends)."""
    return [r.route for r in h.emu.requests if r.params.get("channel_id") == str(channel)]


async def test_a_read_only_channel_costs_nothing_and_logs_the_missing_permission(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # covers D6
    async with bot_on_gateway([answer()], tmp_path) as h:
        await h.overwrite(h.emu.channel_id, h.emu.guild_id, deny=perms.SEND_MESSAGES)
        with caplog.at_level(logging.WARNING, logger="discord_io.channel_rights"):
            await h.mention("hello?")
            await h.mention("anyone?")
            await settle(h)
        assert h.provider.requests == []
        assert spent(h, h.emu.channel_id) == []  # not even a typing call
        lines = [r.getMessage() for r in caplog.records if r.name == "discord_io.channel_rights"]
        assert len(lines) == 1, lines
        assert "missing SEND_MESSAGES" in lines[0]
        # the administrator lets it speak again: the change reaches the cache
        await h.overwrite(h.emu.channel_id, h.emu.guild_id)
        await h.mention("now?")
        await h.queued(h.emu.channel_id)
        await h.idle()
        assert h.sent() == ["answer"]


async def test_a_role_update_that_takes_send_messages_away_silences_the_bot(
        tmp_path: Path) -> None:
    # covers D6 (the cache follows GUILD_ROLE_UPDATE of @everyone)
    async with bot_on_gateway([answer("first"), answer("never")], tmp_path) as h:
        await h.mention("one")
        await h.queued(h.emu.channel_id)
        await h.idle()
        h.emu.set_role_permissions(h.emu.guild_id,
                                   perms.DEFAULT_EVERYONE & ~perms.SEND_MESSAGES)
        await h.emu.gateway.role_update(h.emu.guild_id)
        guild = h.client.get_guild(h.emu.guild_id)
        assert guild is not None
        await h.until(lambda: not guild.default_role.permissions.send_messages)
        await h.mention("two")
        await settle(h)
        assert h.sent() == ["first"] and len(h.provider.requests) == 1


async def test_an_announcement_channel_is_silent_and_its_thread_answered(
        tmp_path: Path) -> None:
    # covers D6, D7 (SEND_MESSAGES_IN_THREADS opens an announcement channel's threads)
    async with bot_on_gateway([answer("in the thread")], tmp_path) as h:
        news = h.emu.add_announcement_channel("news")
        await h.emu.gateway.channel_create(news)
        await h.until(lambda: h.client.get_channel(news) is not None)
        await h.mention("news?", channel=news)
        await settle(h)
        assert h.provider.requests == [] and spent(h, news) == []
        thread = await h.add_thread(news, "discussion")
        await h.mention("and here?", channel=thread)
        await h.queued(thread)
        await h.idle(thread)
        assert h.sent(thread) == ["in the thread"]


async def test_without_read_message_history_it_answers_without_a_reply_or_history(
        tmp_path: Path) -> None:
    # covers D6 (a reply needs READ_MESSAGE_HISTORY: 403 160002; a history read gets [])
    async with bot_on_gateway([answer()], tmp_path) as h:
        h.emu.add_message(h.emu.channel_id, h.bob, "older chatter")
        await h.overwrite(h.emu.channel_id, h.emu.guild_id, deny=perms.READ_MESSAGE_HISTORY)
        asked = await h.mention("hi")
        await h.queued(h.emu.channel_id)
        await h.idle()
        [sent] = h.emu.sent()
        assert sent.json["content"] == "answer" and "message_reference" not in sent.json
        assert h.emu.requests_to(HISTORY) == []  # not read: Discord would answer nothing
        assert h.context_ids(0) == [asked["id"]]
        assert [r.status for r in h.emu.requests if r.status == 403] == []


async def test_a_refused_reply_is_sent_again_without_its_reference(tmp_path: Path) -> None:
    # covers D6 (the cache may be a moment behind Discord: 403 160002 is answered by a
    # plain send, not an error)
    async with bot_on_gateway([answer()], tmp_path) as h:
        h.emu.set_overwrite(h.emu.channel_id, h.emu.guild_id,
                            deny=perms.READ_MESSAGE_HISTORY)  # no CHANNEL_UPDATE yet
        await h.mention("hi")
        await h.queued(h.emu.channel_id)
        await h.idle()
        statuses = [r.status for r in h.emu.requests_to(SEND)]
        assert statuses == [403, 200]
        assert "message_reference" not in h.emu.sent()[0].json
        assert [r.status for r in h.bot.results] == ["completed"]


async def test_a_thread_is_answered_with_its_own_history_and_starter_message(
        tmp_path: Path) -> None:
    # covers D7
    async with bot_on_gateway([answer("thread answer")], tmp_path) as h:
        h.emu.add_message(h.emu.channel_id, h.bob, "chatter in the channel")
        starter = h.emu.add_message(h.emu.channel_id, h.emu.alice_id, "what about X?")
        thread = await h.add_thread(h.emu.channel_id, "X", from_message=int(starter["id"]))
        earlier = await h.say("some context", channel=thread, mention=False)
        asked = await h.mention("your view?", channel=thread)
        await h.queued(thread)
        await h.idle(thread)
        assert h.sent(thread) == ["thread answer"] and h.sent() == []
        assert h.context_ids(0) == [starter["id"], earlier["id"], asked["id"]]
        [sent] = h.emu.sent(thread)
        assert sent.json["message_reference"]["message_id"] == int(asked["id"])


async def test_an_archived_thread_is_answered_and_unarchived(tmp_path: Path) -> None:
    # covers D7 (a send unarchives the thread: THREAD_UPDATE)
    async with bot_on_gateway([answer()], tmp_path) as h:
        thread = await h.add_thread(h.emu.channel_id, "old")
        h.emu.channels[thread]["thread_metadata"]["archived"] = True
        await h.emu.gateway.thread_update(thread)
        known = h.client.get_channel(thread)
        await h.until(lambda: getattr(known, "archived", False))
        await h.mention("still there?", channel=thread)
        await h.queued(thread)
        await h.idle(thread)
        assert h.sent(thread) == ["answer"]
        await h.until(lambda: not getattr(h.client.get_channel(thread), "archived", True))


async def test_a_locked_thread_costs_nothing(tmp_path: Path) -> None:
    # covers D7 (a locked thread refuses whoever lacks MANAGE_THREADS)
    async with bot_on_gateway([answer()], tmp_path) as h:
        thread = await h.add_thread(h.emu.channel_id, "closed", locked=True)
        await h.mention("hello?", channel=thread)
        await settle(h)
        assert h.provider.requests == [] and spent(h, thread) == []


async def test_a_forum_post_is_answered_in_the_post_with_the_post_itself_first(
        tmp_path: Path) -> None:
    # covers D7 (forum posts are threads; the post's first message shares its id)
    async with bot_on_gateway([answer("forum answer")], tmp_path) as h:
        forum = h.emu.add_forum_channel("help")
        await h.emu.gateway.channel_create(forum)
        await h.until(lambda: h.client.get_channel(forum) is not None)
        post = await h.add_forum_post(forum, "Crash on start", "It crashes, see log.")
        asked = await h.mention("can you help?", channel=post)
        await h.queued(post)
        await h.idle(post)
        assert h.sent(post) == ["forum answer"]
        assert h.context_ids(0) == [str(post), asked["id"]]


async def test_a_private_thread_is_answered_once_the_mention_adds_the_bot(
        tmp_path: Path) -> None:
    # covers D7 (a mention adds the bot to a private thread; otherwise it sees nothing)
    async with bot_on_gateway([answer("private answer")], tmp_path) as h:
        thread = await h.add_thread(h.emu.channel_id, "secret", private=True)
        assert h.client.get_channel(thread) is None  # not a member: not even told of it
        await h.emu.gateway.message_create(thread, h.emu.alice_id, "between us")
        await h.mention("bot, join us", channel=thread)
        await h.queued(thread)
        await h.idle(thread)
        assert h.sent(thread) == ["private answer"] and len(h.provider.requests) == 1


async def test_access_lists_apply_to_a_threads_parent(tmp_path: Path) -> None:
    # covers D7 (a channel's deny entry covers its threads)
    blocked = AccessPolicy.of(blocked_channels=[])
    async with bot_on_gateway([answer()], tmp_path, access=blocked) as h:
        thread = await h.add_thread(h.emu.channel_id, "t")
        h.bot.policy = type(h.bot.policy)(access=AccessPolicy.of(
            blocked_channels=[h.emu.channel_id]))
        await h.mention("here?", channel=thread)
        await settle(h)
        assert h.provider.requests == [] and spent(h, thread) == []


async def test_kill_inside_a_thread_stops_the_threads_turn(tmp_path: Path) -> None:
    # covers D7, D3
    long = long_stream()
    async with bot_on_gateway([[*long, {"at": 120, "end": "completed"}]], tmp_path) as h:
        thread = await h.add_thread(h.emu.channel_id, "t")
        await h.mention("a long answer", channel=thread)
        await h.emu.wait_for(lambda r: r.route == SEND)
        text = await h.kill_answer(thread)
        assert text.startswith("Stopping the reply in this channel.")
        await h.idle(thread)
        assert [r.status for r in h.bot.results] == ["stopped_by_user"]


async def test_a_late_kill_answer_is_logged_and_the_kill_still_happens(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # covers D10 (the initial response is due within 3 s, else 10062)
    long = long_stream()
    async with bot_on_gateway([[*long, {"at": 120, "end": "completed"}]], tmp_path) as h:
        await h.mention("a long answer")
        await h.emu.wait_for(lambda r: r.route == SEND)
        with caplog.at_level(logging.WARNING):
            payload = await h.kill()
            block_event_loop(4.0)  # the bot is busy when the interaction arrives
            [late] = await h.emu.wait_for(lambda r: r.route == CALLBACK)
            await h.idle()
        assert late.status == 404
        assert h.emu.interactions.pending[payload["id"]].refusals == [10062]
        assert [r.status for r in h.bot.results] == ["stopped_by_user"]
        refused = [r for r in caplog.records if "/kill" in r.getMessage()]
        assert refused and "10062" in refused[-1].getMessage()
        assert not [r for r in caplog.records if r.exc_info]  # no traceback


async def test_a_stall_past_the_session_loses_the_gap_says_so_and_answers_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # covers D8 (stall → closed → RESUME refused → new session; the gap's messages lost)
    text = "\n\n".join(f"{i} " + ("word " * 150).strip() for i in range(4))
    stream = [{"at": 0.5 * (i + 1), "text": text[i * 200:(i + 1) * 200]}
              for i in range((len(text) + 199) // 200)]
    passes = [[*stream, {"at": 20, "end": "completed"}], answer("after the gap")]
    async with bot_on_gateway(passes, tmp_path) as h:
        shard = h.shard_of(h.emu.channel_id)
        first = h.emu.gateway.live_session(shard)
        assert first is not None
        await h.mention("stream please")
        await h.emu.wait_for(lambda r: r.route == SEND)  # the turn is streaming
        stall = h.emu.gateway.session_timeout_s + 2 * HEARTBEAT_INTERVAL_MS / 1000
        loop = asyncio.get_running_loop()
        gap: list[asyncio.Task[Any]] = []
        loop.call_later(stall - 10, lambda: gap.append(asyncio.ensure_future(
            h.emu.gateway.message_create(h.emu.channel_id, h.bob, f"<@{h.emu.bot_id}> lost",
                                         mentions=[h.emu.bot_id]))))
        with caplog.at_level(logging.WARNING, logger="discord_io.session_gaps"):
            block_event_loop(stall)
            await h.emu.gateway.wait_for(lambda: (s := h.emu.gateway.live_session(shard))
                                         is not None and s is not first
                                         and s.connection is not None)
            await h.until(lambda: bool(h.bot.session_gaps.gaps))
        await h.idle()
        # bob's mention among them (and perhaps the bot's own sends of the stalled turn)
        assert "MESSAGE_CREATE" in [name for _, name in first.lost]
        assert not any("lost" in m.clean_content for m in h.client.cached_messages)
        assert len(h.emu.gateway.payloads(RESUME, shard)) == 1  # tried, refused
        assert len(h.emu.gateway.payloads(IDENTIFY, shard)) == 2
        [line] = [r.getMessage() for r in caplog.records if r.name == "discord_io.session_gaps"]
        assert "session was lost" in line and "not delivered" in line
        await h.mention("back?")
        await h.queued(h.emu.channel_id)
        await h.idle()
        sent = h.sent()
        assert sent[-1] == "after the gap" and len(sent) == len(set(sent))  # nothing twice
        # the turn caught in the stall went on and delivered all of its text, once
        assert "".join(sent[:-1]).replace("\n", "") == text.replace("\n", "")
        assert [r.status for r in h.bot.results] == ["completed", "completed"]


async def test_an_expired_session_is_started_anew_and_the_bot_answers(tmp_path: Path) -> None:
    # covers D8 (4009: RESUME refused, IDENTIFY again)
    async with bot_on_gateway([answer("still here")], tmp_path) as h:
        shard = h.shard_of(h.emu.channel_id)
        first = h.emu.gateway.live_session(shard)
        await h.emu.gateway.close(shard, 4009)
        await h.emu.gateway.wait_for(lambda: (s := h.emu.gateway.live_session(shard))
                                     is not None and s is not first
                                     and s.connection is not None)
        await h.until(lambda: bool(h.bot.session_gaps.gaps))
        await h.mention("hello")
        await h.queued(h.emu.channel_id)
        await h.idle()
        assert h.sent() == ["still here"]


async def test_the_bot_asks_only_for_the_intents_it_uses(tmp_path: Path) -> None:
    # covers D12 (no typing, voice-state or poll events from every guild; reactions, which
    # the history windows need, D51)
    async with bot_on_gateway([], tmp_path) as h:
        identified = {p.data["intents"] for p in h.emu.gateway.payloads(IDENTIFY)}
        assert identified == {bot_intents().value}
        await h.emu.gateway.typing_start(h.emu.channel_id, h.emu.alice_id)
        await h.emu.gateway.voice_state_update(h.emu.alice_id, h.emu.channel_id)
        await h.emu.gateway.poll_vote_add(h.emu.channel_id, h.emu.next_id(), h.emu.alice_id)
        await h.emu.gateway.reaction_add(h.emu.channel_id, h.emu.next_id(), "👍",
                                         h.emu.alice_id)
        assert sum(h.emu.gateway.delivered[n] for n in (
            "TYPING_START", "VOICE_STATE_UPDATE", "MESSAGE_POLL_VOTE_ADD")) == 0
        assert h.emu.gateway.delivered["MESSAGE_REACTION_ADD"] == 1
        connection = h.emu.gateway.live_session(0).connection  # type: ignore[union-attr]
        assert connection is not None and connection.compressor is not None
        assert connection.compressor.name == "zstd-stream"  # D11: the bot, compressed


async def test_a_thousand_channels_stay_within_the_global_limit(tmp_path: Path) -> None:
    # covers D9 (a test counting requests per second of the loop clock, not a timing): a
    # thousand channels in the nightly profile (about three real minutes); by default 150,
    # already six times what one second may carry
    channels = 1000 if os.environ.get("RELIABILITY_PROFILE") == "nightly" else 150
    async with bot_on_gateway([answer(f"a{i}") for i in range(channels)], None,
                              validate=False, recent_results=channels) as h:
        ids = [h.emu.add_text_channel(f"c{i}") for i in range(channels)]
        for channel in ids:
            await h.emu.gateway.channel_create(channel)
        await h.until(lambda: all(h.client.get_channel(c) is not None for c in ids))
        start = len(h.emu.requests)
        for channel in ids:
            await h.emu.gateway.message_create(channel, h.emu.alice_id,
                                               f"<@{h.emu.bot_id}> hi", mentions=[h.emu.bot_id])
        while len(h.bot.results) < channels:  # a coarse poll: a thousand turns to wait for
            await asyncio.sleep(1.0)

        burst = h.emu.requests[start:]
        per_second = Counter(int(r.at) for r in burst)
        assert max(per_second.values()) <= 50
        assert [r for r in burst if r.status == 429] == []
        assert h.emu.limits.global_hits == 0 and h.emu.limits.invalid_in_window() == 0
        assert len(h.emu.requests_to(SEND, status=200)) == channels
        pace = pace_globally(h.client)
        assert pace.waited > 0  # the limit was within reach: the pace held requests back


async def test_a_role_given_to_the_bot_opens_a_read_only_channel(tmp_path: Path) -> None:
    # covers D6 (the cache follows GUILD_MEMBER_UPDATE of the bot's own member)
    async with bot_on_gateway([answer("allowed now")], tmp_path) as h:
        speakers = await h.add_role("speakers")
        await h.overwrite(h.emu.channel_id, h.emu.guild_id, deny=perms.SEND_MESSAGES)
        await h.overwrite(h.emu.channel_id, speakers, allow=perms.SEND_MESSAGES)
        await h.mention("before the role")
        await settle(h)
        assert h.provider.requests == []
        h.emu.member_roles[h.emu.bot_id].append(speakers)
        await h.emu.gateway.member_update(h.emu.bot_id)
        guild = h.client.get_guild(h.emu.guild_id)
        assert guild is not None
        await h.until(lambda: any(r.id == speakers for r in guild.me.roles))
        await h.mention("after the role")
        await h.queued(h.emu.channel_id)
        await h.idle()
        assert h.sent() == ["allowed now"]
