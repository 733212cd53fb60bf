"""The emulated gateway against real discord.py started with `client.start()`: HELLO,
IDENTIFY and its checks, READY and GUILD_CREATE, heartbeats in loop time, dispatches, and
the faults a bot meets in production (a dropped connection, INVALID_SESSION, a zombie
connection, close codes 4004 and 4014), with two shards. Virtual time; a real websocket on
loopback. Every test here covers D2 (the emulated Discord the Discord tests stand on)."""

from __future__ import annotations

import asyncio
from typing import Any

import discord
import pytest
from discord import app_commands

from discord_io.testing import DiscordEmulator, connected_discord
from discord_io.testing.gateway import (
    AUTHENTICATION_FAILED,
    DISALLOWED_INTENTS,
    GUILD_MEMBERS,
    HEARTBEAT,
    HEARTBEAT_INTERVAL_MS,
    IDENTIFY,
    MESSAGE_CONTENT,
    RESUME,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


def content_intents() -> discord.Intents:
    intents = discord.Intents.default()
    intents.message_content = True
    return intents


def plain_client() -> discord.Client:
    return discord.Client(intents=content_intents())


class Inbox:
    """What the client's event handlers saw, in order."""

    def __init__(self) -> None:
        self.messages: list[discord.Message] = []
        self.reactions: list[discord.RawReactionActionEvent] = []
        self.resumed = 0

    def attach(self, _emu: DiscordEmulator, client: discord.Client) -> None:
        async def on_message(message: discord.Message) -> None:
            self.messages.append(message)

        async def on_raw_reaction_add(event: discord.RawReactionActionEvent) -> None:
            self.reactions.append(event)

        async def on_resumed() -> None:
            self.resumed += 1

        for handler in (on_message, on_raw_reaction_add, on_resumed):
            client.event(handler)

    def contents(self) -> list[str]:
        return [m.content for m in self.messages]


async def settle() -> None:
    """Let the client read what the gateway wrote (loopback I/O, a moment of loop time)."""
    await asyncio.sleep(0.5)


async def test_identify_carries_token_and_intents_and_ready_brings_the_guild() -> None:
    # covers D2
    async with connected_discord(client_factory=plain_client) as (emu, client):
        [identify] = emu.gateway.payloads(IDENTIFY)
        assert identify.data["token"] == emu.token
        assert identify.data["intents"] == content_intents().value
        [guild] = client.guilds
        assert guild.id == emu.guild_id and not guild.unavailable
        assert [c.id for c in guild.text_channels] == [emu.channel_id]
        assert guild.member_count == 2 and guild.me.id == emu.bot_id
        assert client.user is not None and client.user.id == emu.bot_id


async def test_with_the_members_intent_guild_members_are_chunked_in() -> None:
    # covers D2
    def grant(emu: DiscordEmulator, _client: discord.Client) -> None:
        emu.gateway.granted_intents |= GUILD_MEMBERS

    intents = content_intents()
    intents.members = True
    async with connected_discord(client_factory=lambda: discord.Client(intents=intents),
                                 setup=grant) as (emu, client):
        [guild] = client.guilds
        member = guild.get_member(emu.alice_id)
        assert member is not None and member.name == "alice" and guild.chunked


async def test_heartbeats_are_acknowledged_in_loop_time() -> None:
    # covers D2
    async with connected_discord(client_factory=plain_client) as (emu, client):
        beats = len(emu.gateway.payloads(HEARTBEAT))
        assert beats >= 1  # discord.py beats as soon as HELLO arrives
        await asyncio.sleep(3 * HEARTBEAT_INTERVAL_MS / 1000 + 1)
        later = emu.gateway.payloads(HEARTBEAT)
        assert len(later) >= beats + 3
        session = emu.gateway.live_session()
        assert session is not None and later[-1].data == session.seq
        assert client.latency != float("inf")  # the last beat was acknowledged
        assert [p.op for p in emu.gateway.payloads(IDENTIFY)] == [IDENTIFY]  # one session


async def test_message_reaction_and_interaction_are_dispatched() -> None:
    # covers D2
    inbox = Inbox()
    commands: list[str] = []

    def setup(emu: DiscordEmulator, client: discord.Client) -> None:
        inbox.attach(emu, client)
        tree: app_commands.CommandTree[discord.Client] = app_commands.CommandTree(client)

        @tree.command(name="ping", description="Answer pong.")
        async def ping(interaction: discord.Interaction) -> None:
            commands.append(interaction.command.name if interaction.command else "")
            await interaction.response.send_message("pong", ephemeral=True)

        async def setup_hook() -> None:
            await tree.sync()

        client.setup_hook = setup_hook  # type: ignore[method-assign]

    async with connected_discord(client_factory=plain_client, setup=setup) as (emu, _client):
        posted = await emu.gateway.message_create(emu.channel_id, emu.alice_id, "hello")
        await emu.gateway.reaction_add(emu.channel_id, int(posted["id"]), "👍", emu.alice_id)
        await emu.gateway.interaction("ping")
        await emu.wait_for(lambda r: r.route.endswith("/callback"))
        [message] = inbox.messages
        assert message.content == "hello" and isinstance(message.author, discord.Member)
        assert message.guild is not None and message.guild.id == emu.guild_id
        [reaction] = inbox.reactions
        assert (reaction.message_id, reaction.user_id, str(reaction.emoji)) == (
            int(posted["id"]), emu.alice_id, "👍")
        assert commands == ["ping"]
        assert emu.interaction_responses[-1]["data"]["content"] == "pong"


async def test_without_message_content_only_mentions_keep_their_text() -> None:
    # covers D2
    inbox = Inbox()
    client_factory = lambda: discord.Client(intents=discord.Intents.default())  # noqa: E731
    async with connected_discord(client_factory=client_factory, setup=inbox.attach) as (emu, _):
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "not for the bot")
        await emu.gateway.message_create(emu.channel_id, emu.alice_id,
                                         f"<@{emu.bot_id}> for the bot", mentions=[emu.bot_id])
        await settle()
        assert inbox.contents() == ["", f"<@{emu.bot_id}> for the bot"]


async def test_without_guild_messages_intent_no_message_arrives() -> None:
    # covers D2
    inbox = Inbox()
    intents = content_intents()
    intents.guild_messages = False
    async with connected_discord(client_factory=lambda: discord.Client(intents=intents),
                                 setup=inbox.attach) as (emu, _):
        delivered = await emu.gateway.dispatch(
            "MESSAGE_CREATE", emu.add_message(emu.channel_id, emu.alice_id, "unseen"),
            guild_id=emu.guild_id)
        await settle()
        assert not delivered and inbox.messages == []


async def test_a_privileged_intent_not_granted_closes_4014() -> None:
    # covers D2
    def deny(emu: DiscordEmulator, _client: discord.Client) -> None:
        emu.gateway.granted_intents &= ~MESSAGE_CONTENT

    with pytest.raises(discord.PrivilegedIntentsRequired):
        async with connected_discord(client_factory=plain_client, setup=deny):
            pass


async def test_a_token_the_gateway_refuses_closes_4004() -> None:
    # covers D2
    emulators: list[DiscordEmulator] = []

    def revoke(emu: DiscordEmulator, _client: discord.Client) -> None:
        emu.gateway.token = "revoked-after-login"
        emulators.append(emu)

    with pytest.raises(discord.ConnectionClosed) as caught:
        async with connected_discord(client_factory=plain_client, setup=revoke):
            pass
    assert caught.value.code == AUTHENTICATION_FAILED
    assert emulators[0].gateway.closes == [(1, AUTHENTICATION_FAILED)]
    assert DISALLOWED_INTENTS not in [code for _, code in emulators[0].gateway.closes]


async def test_a_dropped_connection_resumes_and_replays_what_was_missed() -> None:
    # covers D2
    inbox = Inbox()
    async with connected_discord(client_factory=plain_client, setup=inbox.attach) as (emu, _):
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "before")
        await settle()
        session = emu.gateway.live_session()
        assert session is not None
        seen_seq = session.seq
        await emu.gateway.drop()
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "while away")
        [resume] = await emu.gateway.wait_for_payload(RESUME)
        assert resume.data["session_id"] == session.session_id
        assert resume.data["seq"] == seen_seq
        assert resume.connection == 2
        await emu.gateway.wait_for(lambda: inbox.resumed == 1)
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "after")
        await settle()
        assert inbox.contents() == ["before", "while away", "after"]
        assert len(emu.gateway.payloads(IDENTIFY)) == 1  # resumed, never re-identified
        assert session.resumes == 1


async def test_invalid_session_makes_the_client_identify_anew() -> None:
    # covers D2
    inbox = Inbox()
    async with connected_discord(client_factory=plain_client, setup=inbox.attach) as (emu, _):
        first = emu.gateway.live_session()
        await emu.gateway.invalidate_session()
        await emu.gateway.wait_for_payload(IDENTIFY, count=2)
        await emu.gateway.wait_for(lambda: (s := emu.gateway.live_session()) is not None
                                   and s is not first and s.connection is not None)
        await settle()
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "new session")
        await settle()
        assert first is not None and first.invalid
        assert emu.gateway.payloads(RESUME) == []
        assert inbox.contents() == ["new session"]


async def test_a_zombie_connection_is_abandoned_and_resumed() -> None:
    # covers D2: heartbeats unanswered and nothing arriving; discord.py gives up on the
    # connection after its heartbeat timeout (loop time) and resumes
    inbox = Inbox()
    async with connected_discord(client_factory=plain_client, setup=inbox.attach) as (emu, _):
        session = emu.gateway.live_session()
        assert session is not None
        zombie = session.connection
        assert zombie is not None
        emu.gateway.stop_acking()
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "into the void")
        [resume] = await emu.gateway.wait_for_payload(RESUME)
        assert resume.data["session_id"] == session.session_id
        # discord.py's heartbeat_timeout (60 s) counts from the last frame it received
        assert resume.at - zombie.last_sent >= 60.0
        await emu.gateway.wait_for(lambda: inbox.resumed == 1)
        await settle()
        assert inbox.contents() == ["into the void"]


async def test_two_shards_each_get_their_own_guilds_events() -> None:
    # covers D2
    inbox = Inbox()
    second: dict[str, int] = {}

    def setup(emu: DiscordEmulator, client: discord.Client) -> None:
        inbox.attach(emu, client)
        guild = emu.add_guild("second guild")
        emu.add_member(guild, emu.alice_id)
        second["guild"] = guild
        second["channel"] = emu.add_text_channel("elsewhere", guild_id=guild)

    def sharded() -> discord.Client:
        return discord.AutoShardedClient(intents=content_intents())

    async with connected_discord(client_factory=sharded, setup=setup, shards=2) as (emu, client):
        assert isinstance(client, discord.AutoShardedClient) and client.shard_count == 2
        shards = sorted(tuple(p.data["shard"]) for p in emu.gateway.payloads(IDENTIFY))
        assert shards == [(0, 2), (1, 2)]
        owner = {g.id: g.shard_id for g in client.guilds}
        assert owner == {emu.guild_id: emu.gateway.shard_of(emu.guild_id),
                         second["guild"]: emu.gateway.shard_of(second["guild"])}
        assert sorted(owner.values()) == [0, 1]
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "first guild")
        await emu.gateway.message_create(second["channel"], emu.alice_id, "second guild")
        await emu.gateway.drop(shard_id=owner[second["guild"]])
        await emu.gateway.message_create(second["channel"], emu.alice_id, "while shard away")
        await emu.gateway.wait_for(lambda: inbox.resumed == 1)
        await settle()
        by_shard: dict[str, Any] = {m.content: m.guild.shard_id if m.guild else None
                                    for m in inbox.messages}
        assert by_shard == {"first guild": owner[emu.guild_id],
                            "second guild": owner[second["guild"]],
                            "while shard away": owner[second["guild"]]}
        resumed = emu.gateway.payloads(RESUME)
        assert [p.shard_id for p in resumed] == [owner[second["guild"]]]
