"""Requests per reply (D50, D51, D52, D59): a streamed reply of seven messages costs its seven
sends, one typing post and no history read; the history a turn reads from the gateway's
window is exactly what the REST read returns, after edits, deletes, reactions and a lost
session too. The bot runs as production starts it (the sharded client on the emulated
gateway, the REST emulator counting every request). Virtual time.
"""

from __future__ import annotations

from typing import Any

import discord
import pytest
from gateway_support import Harness, bot_on_gateway

from discord_io.history import (
    HistoryPolicy,
    dialogue_item,
    recent_messages,
    referenced,
    reply_chain,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

SEND = "POST /channels/{channel_id}/messages"
TYPING = "POST /channels/{channel_id}/typing"
HISTORY = "GET /channels/{channel_id}/messages"
CHUNK = 300
REPLY = "\n\n".join(f"{n} " + "word " * 178 for n in range(14))  # 12,600 characters


def streamed_reply() -> list[dict[str, Any]]:
    """The full-bot benchmark's reply: 300-character chunks every 50 ms, 7 messages."""
    chunks = [REPLY[i:i + CHUNK] for i in range(0, len(REPLY), CHUNK)]
    steps: list[dict[str, Any]] = [{"at": round(0.05 * (n + 1), 3), "text": text}
                                   for n, text in enumerate(chunks)]
    return [*steps, {"at": round(0.05 * (len(chunks) + 1), 3), "end": "completed"}]


def _requests(h: Harness, since: int, channel: int) -> list[str]:
    return [r.route for r in h.emu.requests[since:]
            if r.params.get("channel_id") == str(channel)]


async def _items(h: Harness, messages: list[discord.Message]) -> list[dict[str, Any]]:
    return [dialogue_item(m, h.emu.bot_id, 4000) for m in messages]


async def _served_and_fetched(h: Harness, channel_id: int, limit: int
                              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The same read from the window (which must answer it) and over REST."""
    channel = h.client.get_channel(channel_id)
    assert isinstance(channel, discord.TextChannel)
    served_before = h.bot.history_cache.counts.served
    served = await h.bot.history_cache.read(channel, limit=limit)
    assert h.bot.history_cache.counts.served == served_before + 1
    fetched = await recent_messages(channel, limit=limit)
    return await _items(h, served), await _items(h, fetched)


async def test_a_seven_message_reply_costs_eight_requests() -> None:
    # covers D50, D51, D52 (7 sends + 1 typing post; the history from the window)
    async with bot_on_gateway([streamed_reply(), streamed_reply()], None) as h:
        for turn in range(2):
            since = len(h.emu.requests)
            await h.mention(f"tell me a long story {turn}")
            await h.queued(h.emu.channel_id)
            await h.idle()
            routes = _requests(h, since, h.emu.channel_id)
            assert routes.count(SEND) == 7
            assert routes.count(TYPING) == 1
            assert routes.count(HISTORY) == 0
            assert len(routes) <= 8
        assert h.bot.history_cache.counts.fetched == 0
        assert h.bot.history_cache.counts.served == 2
        # the second turn saw the first one's reply, from the window
        replies = [m["id"] for m in h.emu.channel_messages()
                   if m["author"]["id"] == str(h.emu.bot_id)][:7]
        assert set(replies) <= set(h.context_ids(1))


async def test_a_cold_channel_is_read_once_then_kept_by_the_gateway() -> None:
    # covers D51 (a channel with a past the bot never saw: one REST read, then none)
    answers = [[{"at": 1, "text": f"answer {n}"}, {"at": 2, "end": "completed"}]
               for n in range(3)]
    async with bot_on_gateway(answers, None) as h:
        h.earlier(h.emu.channel_id, h.bob, "from before the bot came")
        reads = []
        for n in range(3):
            await h.mention(f"question {n}")
            await h.queued(h.emu.channel_id)
            await h.idle()
            reads.append(len(h.emu.requests_to(HISTORY)))
        assert reads == [1, 1, 1]
        seen = [item["content"] for item in h.provider.requests[2].context_items
                if item.get("type") == "dialogue"]
        assert seen[0] == "from before the bot came"
        assert "answer 0" in seen and "answer 1" in seen


async def test_the_window_answers_exactly_what_the_rest_read_returns() -> None:
    # covers D51, D53 (nicknames and mentions resolved as for a fetched message; edits,
    # deletes; a reaction and a lost session send the next read to REST)
    answers = [[{"at": 1, "text": "noted"}, {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(answers, None) as h:
        channel = await h.add_text_channel("fresh")
        carol = h.user("carol")
        h.emu.add_member(h.emu.guild_id, carol, nick="Caz")
        first = await h.say("carol: hello", author=carol, mention=False, channel=channel)
        second = await h.say("bob: hi carol", author=h.bob, mention=False, channel=channel)
        await h.say("reply to carol", author=h.bob, mention=False, channel=channel,
                    reply_to=int(first["id"]))
        await h.mention("what do you think?", channel=channel)
        await h.queued(channel)
        await h.idle(channel)
        served, fetched = await _served_and_fetched(h, channel, 10)
        assert len(served) == 5 and served == fetched
        assert {item["author"] for item in served} >= {"carol", "bob"}

        # a reaction: the counts are part of a read, so the next read goes to REST and
        # refills the window (with fetched messages, which discord.py's own cache lacks)
        await h.emu.gateway.reaction_add(channel, int(first["id"]), "👍", h.bob)
        await h.until(lambda: not h.bot.history_cache.holds(channel))
        fetched_before = h.bot.history_cache.counts.fetched
        messages = await h.bot.history_cache.read(h.client.get_channel(channel), limit=10)  # type: ignore[arg-type]
        assert h.bot.history_cache.counts.fetched == fetched_before + 1
        assert any(i["reactions"] for i in await _items(h, messages))
        served, fetched = await _served_and_fetched(h, channel, 10)
        assert served == fetched

        await h.emu.gateway.message_update(channel, int(second["id"]), "edited words")
        await h.until(lambda: any(m.content == "edited words" for m in h.client.cached_messages))
        await h.say("after the edit", author=h.bob, mention=False, channel=channel)
        served, fetched = await _served_and_fetched(h, channel, 10)
        assert served == fetched and any(i["content"] == "edited words" for i in served)

        # a delete of a message another one replies to: a read now shows that reply's
        # parent as deleted (`referenced_message: null`), which the window cannot
        # reproduce, so the next read goes to REST (D59)
        await h.emu.gateway.message_delete(channel, int(first["id"]))
        await h.until(lambda: not h.bot.history_cache.holds(channel))
        await h.say("after the delete", author=h.bob, mention=False, channel=channel)
        fetched_before = h.bot.history_cache.counts.fetched
        messages = await h.bot.history_cache.read(h.client.get_channel(channel), limit=10)  # type: ignore[arg-type]
        assert h.bot.history_cache.counts.fetched == fetched_before + 1
        [reply] = [m for m in messages if m.content == "reply to carol"]
        assert isinstance(reply.reference.resolved, discord.DeletedReferencedMessage)  # type: ignore[union-attr]
        served, fetched = await _served_and_fetched(h, channel, 3)
        assert served == fetched and all(i["message_id"] != first["id"] for i in served)
        served, fetched = await _served_and_fetched(h, channel, 10)
        assert served == fetched and len(served) == 6

        shard = h.shard_of(channel)
        old = h.emu.gateway.live_session(shard)
        await h.emu.gateway.invalidate_session(shard)
        await h.emu.gateway.wait_for(lambda: (s := h.emu.gateway.live_session(shard))
                                     is not None and s is not old
                                     and s.connection is not None)
        await h.until(lambda: bool(h.bot.session_gaps.gaps))
        h.emu.add_message(channel, carol, "sent while the bot was away")
        assert not h.bot.history_cache.holds(channel)
        messages = await h.bot.history_cache.read(h.client.get_channel(channel), limit=10)  # type: ignore[arg-type]
        assert messages[0].content == "sent while the bot was away"
        served, fetched = await _served_and_fetched(h, channel, 10)
        assert served == fetched


FETCH_ONE = "GET /channels/{channel_id}/messages/{message_id}"


def _chain_ids(h: Harness, request_index: int) -> list[str]:
    return [item["message_id"] for item in h.provider.requests[request_index].context_items
            if item.get("type") == "dialogue"]


async def test_a_reply_chain_is_read_from_the_window_not_message_by_message() -> None:
    # covers D59 (a chain of parents the client's own cache lacks: one read fills the
    # window, which answers every parent; the next turn in the chain reads nothing)
    answers = [[{"at": 1, "text": f"answer {n}"}, {"at": 2, "end": "completed"}]
               for n in range(2)]
    async with bot_on_gateway(answers, None) as h:
        h.bot.history = HistoryPolicy(mode="reply_chain", max_messages=10)
        channel = h.emu.channel_id
        root = h.earlier(channel, h.bob, "root")
        chain = [root]
        for n in range(4):
            chain.append(h.earlier(channel, h.bob if n % 2 else h.emu.alice_id, f"step {n}",
                                   reply_to=int(chain[-1]["id"])))
        h.earlier(channel, h.bob, "noise, not in the chain")
        since = len(h.emu.requests)
        trigger = await h.say("and then?", reply_to=int(chain[-1]["id"]))
        await h.queued(channel)
        await h.idle()
        routes = _requests(h, since, channel)
        assert routes.count(FETCH_ONE) == 0 and routes.count(HISTORY) == 1
        assert _chain_ids(h, 0) == [m["id"] for m in chain] + [trigger["id"]]
        assert h.bot.history_cache.counts.parents_fetched == 0

        since = len(h.emu.requests)
        await h.say("more?", reply_to=int(trigger["id"]))
        await h.queued(channel)
        await h.idle()
        routes = _requests(h, since, channel)
        assert routes.count(FETCH_ONE) == 0 and routes.count(HISTORY) == 0
        assert _chain_ids(h, 1)[:len(chain) + 1] == [m["id"] for m in chain] + [trigger["id"]]


async def test_a_window_chain_is_what_the_rest_chain_is() -> None:
    # covers D59 (the same messages, authors and contents as reading each parent over REST;
    # a parent deleted inside the window's span ends the chain, as the fetch's 404 does)
    answers = [[{"at": 1, "text": "ok"}, {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(answers, None) as h:
        channel = h.emu.channel_id
        carol = h.user("carol")
        h.emu.add_member(h.emu.guild_id, carol, nick="Caz")
        root = h.earlier(channel, carol, "root by carol")
        gone = h.earlier(channel, h.bob, "deleted later", reply_to=int(root["id"]))
        kept = h.earlier(channel, carol, "replies to the deleted one",
                         reply_to=int(gone["id"]))
        last = h.earlier(channel, h.bob, "replies to carol", reply_to=int(kept["id"]))
        await h.mention("fill the window")  # a recent-mode turn reads the channel once
        await h.queued(channel)
        await h.idle()
        await h.emu.gateway.message_delete(channel, int(gone["id"]))
        trigger = await h.say("and?", reply_to=int(last["id"]))
        message = await h.client.get_channel(channel).fetch_message(int(trigger["id"]))  # type: ignore[union-attr]
        assert h.bot.history_cache.holds(channel)
        since = len(h.emu.requests)
        served = await reply_chain(message, limit=10, parent=h.bot.history_cache.referenced)
        assert _requests(h, since, channel) == []
        fetched = await reply_chain(message, limit=10, parent=referenced)
        assert FETCH_ONE in _requests(h, since, channel)
        assert [m.id for m in served] == [m.id for m in fetched] == [
            int(kept["id"]), int(last["id"]), int(trigger["id"])]
        assert await _items(h, served) == await _items(h, fetched)
