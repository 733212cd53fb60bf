"""Which messages the bot answers, and recent messages as dialogue context items."""

from __future__ import annotations

import datetime

import discord
import pytest

from discord_io.admission import AdmissionPolicy, MessageFacts, decide, facts_of, should_reply
from discord_io.history import dialogue_items, recent_messages
from discord_io.testing import DiscordEmulator, emulated_discord

BOT = 1000
POLICY = AdmissionPolicy(trigger_words=("aria", "hey bot"))


def _facts(**overrides: object) -> MessageFacts:
    values: dict[str, object] = {
        "author_id": 7,
        "author_is_bot": False,
        "is_dm": False,
        "mentions_bot": False,
        "replies_to_bot": False,
        "content": "just chatting",
    }
    values.update(overrides)
    return MessageFacts(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "reply", "reason"),
    [
        ({}, False, "not_addressed"),
        ({"mentions_bot": True}, True, "mention"),
        ({"replies_to_bot": True}, True, "reply"),
        ({"is_dm": True}, True, "dm"),
        ({"content": "ARIA, what do you think?"}, True, "trigger_word"),
        ({"content": "so hey bot, hi"}, True, "trigger_word"),
        ({"content": "variable names"}, False, "not_addressed"),  # "aria" inside a word
        ({"author_is_bot": True, "mentions_bot": True}, False, "bot"),
        ({"author_id": BOT, "is_dm": True}, False, "self"),
    ],
)
def test_admission_rules(overrides: dict[str, object], reply: bool, reason: str) -> None:
    # covers D4 (what becomes a queued turn)
    decision = decide(_facts(**overrides), BOT, POLICY)
    assert (decision.reply, decision.reason) == (reply, reason)


def test_dms_can_be_switched_off() -> None:
    # covers D4
    decision = decide(_facts(is_dm=True), BOT, AdmissionPolicy(reply_in_dms=False))
    assert not decision.reply


async def _fetch(client: discord.Client, channel_id: int, message_id: str) -> discord.Message:
    channel = await client.fetch_channel(channel_id)
    assert isinstance(channel, (discord.TextChannel, discord.DMChannel))
    return await channel.fetch_message(int(message_id))


@pytest.mark.asyncio
async def test_admission_reads_real_discord_messages() -> None:
    # covers D4
    async with emulated_discord() as (emu, client):
        bot_id = emu.bot_id
        c = emu.channel_id
        plain = emu.add_message(c, emu.alice_id, "hello all")
        mention = emu.add_message(c, emu.alice_id, f"<@{bot_id}> hi", mentions=[bot_id])
        bot_message = emu.add_message(c, bot_id, "I am the bot")
        reply = emu.add_message(c, emu.alice_id, "agreed", reply_to=int(bot_message["id"]))
        reply_to_alice = emu.add_message(c, emu.alice_id, "me too", reply_to=int(plain["id"]))
        other_bot = emu.add_user("otherbot", bot=True)
        from_bot = emu.add_message(c, int(other_bot["id"]), f"<@{bot_id}>", mentions=[bot_id])
        dm = emu.add_message(emu.add_dm_channel(emu.alice_id), emu.alice_id, "psst")

        async def decided(channel_id: int, payload: dict[str, object]) -> str:
            message = await _fetch(client, channel_id, str(payload["id"]))
            return should_reply(message, bot_id, POLICY).reason

        assert await decided(c, plain) == "not_addressed"
        assert await decided(c, mention) == "mention"
        assert await decided(c, reply) == "reply"
        assert await decided(c, reply_to_alice) == "not_addressed"
        assert await decided(c, from_bot) == "bot"
        assert await decided(c, bot_message) == "self"
        assert await decided(int(dm["channel_id"]), dm) == "dm"


@pytest.mark.asyncio
async def test_reply_to_a_known_bot_message_without_the_resolved_message() -> None:
    # covers D4
    async with emulated_discord() as (emu, client):
        reply = emu.add_message(emu.channel_id, emu.alice_id, "yes", reply_to=424242424242424242)
        message = await _fetch(client, emu.channel_id, reply["id"])
        assert facts_of(message, emu.bot_id, {424242424242424242}).replies_to_bot
        assert not facts_of(message, emu.bot_id).replies_to_bot


def _seed_dialogue(emu: DiscordEmulator) -> list[dict[str, object]]:
    c = emu.channel_id
    first = emu.add_message(c, emu.alice_id, "What's a monad?")
    answer = emu.add_message(c, emu.bot_id, "A monoid in the category of endofunctors.")
    follow = emu.add_message(
        c,
        emu.alice_id,
        f"<@{emu.bot_id}> be serious",
        mentions=[emu.bot_id],
        reply_to=int(answer["id"]),
    )
    emu.add_reaction(int(answer["id"]), "😂", emu.alice_id)
    emu.add_reaction(int(answer["id"]), "😂", emu.bot_id)
    emu.add_reaction(int(answer["id"]), "party:1234567890123456789", emu.alice_id)
    return [first, answer, follow]


@pytest.mark.asyncio
async def test_history_becomes_dialogue_items_oldest_first() -> None:
    # covers R6 (ordinary turns see reaction counts only)
    async with emulated_discord() as (emu, client):
        first, answer, follow = _seed_dialogue(emu)
        channel = await client.fetch_channel(emu.channel_id)
        assert isinstance(channel, discord.TextChannel)

        messages = await recent_messages(channel, limit=50)
        items = dialogue_items(messages, bot_user_id=emu.bot_id)

        assert [i["message_id"] for i in items] == [first["id"], answer["id"], follow["id"]]
        assert [i["role"] for i in items] == ["user", "assistant", "user"]
        assert items[0] == {
            "type": "dialogue",
            "role": "user",
            "message_id": first["id"],
            "author": "Alice",
            "author_id": str(emu.alice_id),
            "content": "What's a monad?",
            "sent_at": items[0]["sent_at"],
            "reply_to": None,
            "reactions": [],
        }
        assert datetime.datetime.fromisoformat(str(items[0]["sent_at"])).tzinfo is not None
        assert items[1]["author"] == "Turn Bot"
        assert items[1]["reactions"] == [
            {"emoji": "😂", "count": 2},
            {"emoji": "<:party:1234567890123456789>", "count": 1},
        ]
        assert items[2]["reply_to"] == answer["id"]
        assert items[2]["content"] == "@Turn Bot be serious"


@pytest.mark.asyncio
async def test_history_is_bounded() -> None:
    # covers R6
    async with emulated_discord() as (emu, client):
        for n in range(30):
            emu.add_message(emu.channel_id, emu.alice_id, f"message {n} " + "x" * 100)
        channel = await client.fetch_channel(emu.channel_id)
        assert isinstance(channel, discord.TextChannel)
        messages = await recent_messages(channel, limit=20)
        assert len(messages) == 20
        assert emu.requests_to("GET /channels/{channel_id}/messages")[-1].query["limit"] == "20"

        items = dialogue_items(messages, bot_user_id=emu.bot_id, limit=5, max_chars=40)
        assert [str(i["content"]).split()[1] for i in items] == ["25", "26", "27", "28", "29"]
        assert all(len(str(i["content"])) <= 40 for i in items)
