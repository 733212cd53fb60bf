"""The bot started as production starts it, for end-to-end tests: `build_client()` (an
AutoShardedClient, two shards) with `client.start()` against the emulated gateway and REST,
`TurnBot.start()` in the client's setup_hook as `turn_engine.bot.serve` wires it, and a
scripted model. Users' messages and `/kill` reach the bot as gateway dispatches, and so do
the roles and channels an administrator creates while it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import discord

from discord_io.enrichment_tools import EnrichmentTools, discord_avatar_lookup
from discord_io.media_fetch import MediaFetcher
from discord_io.rate_limits import guard_rate_limits
from discord_io.testing import DiscordEmulator, connected_discord
from discord_io.testing.gateway import GUILD_MEMBERS
from fsm.engine.generation import Attempt
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import ScriptedProvider
from turn_engine.bot import TurnBot, bot_intents, build_client

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
        return await self.say(text, author=author, channel=channel)

    async def say(self, text: str, *, author: int | None = None, channel: int | None = None,
                  mention: bool = True, reply_to: int | None = None,
                  attachments: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        """A user posts, mentioning the bot or not (`mention=False`: chatter), perhaps as a
        reply or with uploads, in a guild channel or a DM (`dm`); as `mention` returns."""
        content = f"<@{self.emu.bot_id}> {text}" if mention else text
        payload = await self.emu.gateway.message_create(
            channel if channel is not None else self.emu.channel_id,
            author if author is not None else self.emu.alice_id, content,
            mentions=[self.emu.bot_id] if mention else [], reply_to=reply_to,
            attachments=attachments)
        self.posted.append(payload)
        await self.received(int(payload["id"]))
        return payload

    def earlier(self, channel: int, author: int, text: str, **options: Any) -> dict[str, Any]:
        """A message from before the bot connected (`emu.add_message` options): stored,
        never dispatched. The bot then never saw the channel whole, so its next turn there
        reads the history over REST (D51), as it would after connecting to a channel with
        a past."""
        message = self.emu.add_message(channel, author, text, **options)
        self.bot.history_cache.forget(channel)
        return message

    async def received(self, message_id: int) -> None:
        """Wait until the client has parsed the MESSAGE_CREATE of `message_id`."""
        async with asyncio.timeout(DELIVERY_TIMEOUT_S):
            while not any(m.id == message_id for m in self.client.cached_messages):
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)

    async def kill(self, channel: int | None = None, *, user: int | None = None,
                   permissions: int = 0) -> dict[str, Any]:
        """A user (alice unless `user`) runs /kill; the gateway dispatches the interaction
        with the member's `permissions` in the channel."""
        return await self.emu.gateway.interaction(
            "kill", channel_id=channel if channel is not None else self.emu.channel_id,
            user_id=user, permissions=permissions)

    async def kill_answer(self, channel: int | None = None, *, user: int | None = None,
                          permissions: int = 0) -> str:
        """/kill as `kill` runs it; the text the bot answered the interaction with."""
        payload = await self.kill(channel, user=user, permissions=permissions)
        [answer] = await self.emu.wait_for(
            lambda r: r.route == CALLBACK and r.params.get("interaction_id") == payload["id"],
            timeout=DELIVERY_TIMEOUT_S)
        return str(answer.json["data"]["content"])

    def user(self, name: str) -> int:
        """A new user, a member of the emulated guild (their messages carry the member)."""
        return int(self.emu.add_user(name)["id"])

    def dm(self, user: int | None = None) -> int:
        """The DM channel of `user` (alice) with the bot; Discord announces none to a bot."""
        return self.emu.add_dm_channel(user if user is not None else self.emu.alice_id)

    async def add_role(self, name: str, *, permissions: int = 0) -> int:
        """A role created in the emulated guild while the bot runs (GUILD_ROLE_CREATE);
        returns once the client knows it. Give it with `emu.member_roles[user].append`."""
        role = self.emu.add_role(name, permissions=permissions)
        await self.emu.gateway.role_create(role)
        guild = self.client.get_guild(self.emu.guild_id)
        assert guild is not None
        await self.until(lambda: guild.get_role(role) is not None)
        return role

    async def add_text_channel(self, name: str, *, guild: int | None = None) -> int:
        """A text channel created while the bot runs (CHANNEL_CREATE); returns once the
        client knows it."""
        channel = self.emu.add_text_channel(name, guild_id=guild)
        await self.emu.gateway.channel_create(channel)
        await self.until(lambda: self.client.get_channel(channel) is not None)
        return channel

    async def add_thread(self, parent: int, name: str, **options: Any) -> int:
        """A thread made while the bot runs (`emu.add_thread` options; THREAD_CREATE if the
        bot may view it); returns once the client knows it, or at once if it may not."""
        thread = self.emu.add_thread(parent, name, **options)
        await self.emu.gateway.thread_create(thread)
        if self.emu.can_view(thread, self.emu.bot_id):
            await self.until(lambda: self.client.get_channel(thread) is not None)
        return thread

    async def add_forum_post(self, forum: int, title: str, text: str, *,
                             author: int | None = None) -> int:
        """A forum post made while the bot runs (THREAD_CREATE, then its first message as
        MESSAGE_CREATE, as Discord sends them); returns the post's id once parsed."""
        author = author if author is not None else self.emu.alice_id
        post = self.emu.add_forum_post(forum, author, title, text)
        await self.emu.gateway.thread_create(post)
        await self.until(lambda: self.client.get_channel(post) is not None)
        first = dict(self.emu.messages[post][post])
        first["member"] = self.emu.member_payload(author)
        await self.emu.gateway.dispatch("MESSAGE_CREATE", first, guild_id=self.emu.guild_id)
        await self.received(post)
        return post

    async def overwrite(self, channel: int, target: int, *, allow: int = 0, deny: int = 0,
                        member: bool = False) -> None:
        """An administrator changes a channel's overwrites (CHANNEL_UPDATE); returns once
        the client has them."""
        self.emu.set_overwrite(channel, target, allow=allow, deny=deny, member=member)
        await self.emu.gateway.channel_update(channel)

        def applied() -> bool:
            known = self.client.get_channel(channel)
            return any(o.id == target and (o.allow, o.deny) == (allow, deny)
                       for o in getattr(known, "_overwrites", ()))

        await self.until(applied)
        await asyncio.sleep(0.01)

    @staticmethod
    async def until(done: Callable[[], bool]) -> None:
        """Wait (loop clock, bounded) until `done()` holds."""
        async with asyncio.timeout(DELIVERY_TIMEOUT_S):
            while not done():
                await asyncio.sleep(0.01)

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

    def context_ids(self, request_index: int) -> list[str]:
        """The ids of the dialogue messages the model saw in its `request_index`th call."""
        return [item["message_id"] for item in self.provider.requests[request_index].context_items
                if item.get("type") == "dialogue"]

    def bot_messages(self) -> list[dict[str, Any]]:
        return [r.json for r in self.emu.requests_to(SEND, status=200)
                if isinstance(r.json, dict)]

    def shard_of(self, channel: int) -> int:
        guild = int(self.emu.channels[channel]["guild_id"])
        return self.emu.gateway.shard_of(guild)


@asynccontextmanager
async def bot_on_gateway(passes: list[list[dict[str, Any]]], tmp_path: Path | None, *,
                         enrichment_tools: bool = False,
                         attempts: Sequence[Attempt] | None = None,
                         members_intent: bool = False,
                         validate: bool = True,
                         **bot_options: Any) -> AsyncIterator[Harness]:
    """The bot on a two-shard gateway with a second guild (its channel "elsewhere", alice
    and bob members). `enrichment_tools` gives it the real tools, downloading from the
    emulator's CDN on loopback. `attempts` replace the one scripted attempt of `passes`
    (a fallback chain, a real adapter against a loopback model); `tmp_path` None keeps no
    journals. `members_intent`: the application is granted the privileged members intent
    and the client asks for it (so GUILD_MEMBER_UPDATE reaches it); production does not."""
    provider = ScriptedProvider(parse_scenario({"passes": passes}).passes)
    made: dict[str, Any] = {}

    def setup(emu: DiscordEmulator, client: discord.Client) -> None:
        if members_intent:
            emu.gateway.granted_intents |= GUILD_MEMBERS
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
        chain = list(attempts) if attempts is not None else [Attempt(provider, "scripted")]
        bot = TurnBot(client, chain, journal_dir=tmp_path, **bot_options)
        bot.attach()

        async def setup_hook() -> None:  # as turn_engine.bot.serve wires it
            await bot.start()

        client.setup_hook = setup_hook  # type: ignore[method-assign]
        made["bot"] = bot

    try:
        factory = _with_members_intent if members_intent else build_client
        async with connected_discord(client_factory=factory, setup=setup, shards=2,
                                     validate=validate) as (emu, client):
            bot = made["bot"]
            try:
                yield Harness(emu, client, bot, provider, made["guild"], made["channel"],
                              made["bob"])
            finally:
                await bot.aclose()
    finally:
        if "fetcher" in made:
            await made["fetcher"].aclose()


def _with_members_intent() -> discord.Client:
    """The client `build_client` makes, asking for the members intent as well."""
    intents = bot_intents()
    intents.members = True
    client = discord.AutoShardedClient(intents=intents,
                                       allowed_mentions=discord.AllowedMentions.none())
    guard_rate_limits(client)
    return client
