"""The bot started as production starts it, for end-to-end tests: `build_client()` (an
AutoShardedClient, two shards) with `client.start()` against the emulated gateway and REST,
`TurnBot.start()` in the client's setup_hook as `turn_engine.bot.serve` wires it, and a
scripted model. Users' messages and `/kill` reach the bot as gateway dispatches.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import discord

from discord_io.enrichment_tools import EnrichmentTools, discord_avatar_lookup
from discord_io.media_fetch import MediaFetcher
from discord_io.testing import DiscordEmulator, connected_discord
from fsm.engine.generation import Attempt
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import ScriptedProvider
from turn_engine.bot import TurnBot, build_client

SEND = "POST /channels/{channel_id}/messages"
CALLBACK = "POST /interactions/{interaction_id}/{token}/callback"
PARAGRAPH = "word " * 180  # 900 characters
DELIVERY_TIMEOUT_S = 30.0


@dataclass
class Harness:
    emu: DiscordEmulator
    client: discord.Client
    bot: TurnBot
    provider: ScriptedProvider
    other_guild: int
    other_channel: int
    bob: int
    posted: list[dict[str, Any]] = field(default_factory=list)

    async def mention(self, text: str, *, author: int | None = None,
                      channel: int | None = None) -> dict[str, Any]:
        """A user mentions the bot; the gateway dispatches it to the guild's shard. Returns
        once the client has parsed it (after a RESUME, if the shard is away), with a moment
        for the bot's on_message task to reach the queue."""
        payload = await self.emu.gateway.message_create(
            channel if channel is not None else self.emu.channel_id,
            author if author is not None else self.emu.alice_id,
            f"<@{self.emu.bot_id}> {text}", mentions=[self.emu.bot_id])
        self.posted.append(payload)
        await self.received(int(payload["id"]))
        return payload

    async def received(self, message_id: int) -> None:
        """Wait until the client has parsed the MESSAGE_CREATE of `message_id`."""
        async with asyncio.timeout(DELIVERY_TIMEOUT_S):
            while not any(m.id == message_id for m in self.client.cached_messages):
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)

    async def kill(self, channel: int | None = None) -> dict[str, Any]:
        """A user runs /kill; the gateway dispatches the interaction."""
        return await self.emu.gateway.interaction(
            "kill", channel_id=channel if channel is not None else self.emu.channel_id)

    async def queued(self, channel: int, count: int = 1) -> None:
        """Wait until `count` messages have reached the channel's queue (or its turn)."""
        key = str(channel)
        async with asyncio.timeout(DELIVERY_TIMEOUT_S):
            while len(self.bot.queue.pending(key)) + int(self.bot.queue.busy(key)) < count:
                await asyncio.sleep(0.05)

    async def idle(self, channel: int | None = None) -> None:
        """Wait until the channel has no running or queued turn."""
        await self.bot.queue.join(str(channel if channel is not None else self.emu.channel_id))

    def sent(self, channel: int | None = None) -> list[str]:
        return [r.json["content"] for r in self.emu.sent(channel)]

    def bot_messages(self) -> list[dict[str, Any]]:
        return [r.json for r in self.emu.requests_to(SEND, status=200)
                if isinstance(r.json, dict)]

    def shard_of(self, channel: int) -> int:
        guild = int(self.emu.channels[channel]["guild_id"])
        return self.emu.gateway.shard_of(guild)


@asynccontextmanager
async def bot_on_gateway(passes: list[list[dict[str, Any]]], tmp_path: Path, *,
                         enrichment_tools: bool = False,
                         **bot_options: Any) -> AsyncIterator[Harness]:
    """The bot on a two-shard gateway with a second guild (its channel "elsewhere", alice
    and bob members). `enrichment_tools` gives it the real tools, downloading from the
    emulator's CDN on loopback."""
    provider = ScriptedProvider(parse_scenario({"passes": passes}).passes)
    made: dict[str, Any] = {}

    def setup(emu: DiscordEmulator, client: discord.Client) -> None:
        guild = emu.add_guild("second guild")
        emu.add_member(guild, emu.alice_id)
        made["guild"] = guild
        made["channel"] = emu.add_text_channel("elsewhere", guild_id=guild)
        made["bob"] = int(emu.add_user("bob")["id"])
        emu.add_member(guild, made["bob"])
        if enrichment_tools:
            made["fetcher"] = MediaFetcher(allow_private=True)
            bot_options["tools"] = EnrichmentTools(
                made["fetcher"], discord_avatar_lookup(client)).tools()
        bot = TurnBot(client, [Attempt(provider, "scripted")], journal_dir=tmp_path,
                      **bot_options)
        bot.attach()

        async def setup_hook() -> None:  # as turn_engine.bot.serve wires it
            await bot.start()

        client.setup_hook = setup_hook  # type: ignore[method-assign]
        made["bot"] = bot

    try:
        async with connected_discord(client_factory=build_client, setup=setup, shards=2) as (
                emu, client):
            bot = made["bot"]
            try:
                yield Harness(emu, client, bot, provider, made["guild"], made["channel"],
                              made["bob"])
            finally:
                await bot.aclose()
    finally:
        if "fetcher" in made:
            await made["fetcher"].aclose()
