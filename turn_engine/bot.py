"""The Discord bot: gateway messages in, the engine's generation turn out.

A message the bot should answer (mention, reply, DM, trigger word) goes to the channel's
queue; one turn per channel runs at a time (D4). Each turn streams into a `DiscordChannel`
(D1, D2) under a typing indicator with one owner, sees the tools of the bot with the turn's
flags (R8), and is journaled so it can be replayed. `/kill` stops the channel's turn and
clears its queue (D3); a follow-up from the same user may interrupt a stream (S17).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import discord
from discord import app_commands

from discord_io.admission import AdmissionPolicy, should_reply
from discord_io.channel_queue import ChannelQueue
from discord_io.delivery import DiscordChannel
from discord_io.enrichment_tools import EnrichmentTools, discord_avatar_lookup
from discord_io.history import dialogue_items, recent_messages
from discord_io.kill_command import install_kill_command
from discord_io.media_fetch import MediaFetcher
from discord_io.stale_sweeper import StaleLockSweeper
from discord_io.typing_indicator import TypingIndicator
from fsm.engine.config import TurnConfig
from fsm.engine.generation import Attempt, GenerationResult, run_generation_turn
from fsm.engine.locks import ChannelLock, ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.stash import ContextStash
from fsm.engine.tools import Tool, ToolRegistry
from fsm.engine.turn import Turn
from fsm.review.journal import JournalRecorder, journal_document, write_journal
from providers import build_provider

from .gc_tuning import tune_gc
from .settings import AppSettings

log = logging.getLogger(__name__)


class TurnBot:
    """Everything the bot holds between messages; `attach` wires it to a client."""

    def __init__(
        self,
        client: discord.Client,
        attempts: Sequence[Attempt],
        *,
        config: TurnConfig | None = None,
        system_prompt: str = "",
        trigger_words: Sequence[str] = (),
        queue_limit: int = 10,
        history_limit: int = 20,
        tools: Sequence[Tool] = (),
        journal_dir: Path | None = None,
        recent_results: int = 100,
    ) -> None:
        self.client = client
        self.attempts = list(attempts)
        self.config = config if config is not None else TurnConfig()
        self.system_prompt = system_prompt
        self.policy = AdmissionPolicy(trigger_words=tuple(trigger_words))
        self.history_limit = history_limit
        self.journal_dir = journal_dir
        self.locks = ChannelLockRegistry(
            stale_age_s=self.config.stale_lock_age_s,
            max_follow_up_interrupts=self.config.max_follow_up_interrupts,
        )
        self.queue: ChannelQueue[discord.Message] = ChannelQueue(
            self.locks, self.run_turn, max_queued=queue_limit,
            owner_of=lambda message: str(message.id), on_queued=self._on_queued,
        )
        self.sweeper = StaleLockSweeper(self.locks)
        self.tools = ToolRegistry(tools)
        self.stash = ContextStash(ttl_s=self.config.stash_ttl_s,
                                  max_items=self.config.stash_max_items,
                                  max_bytes=self.config.stash_max_bytes)
        self.tree: app_commands.CommandTree[discord.Client] = app_commands.CommandTree(client)
        install_kill_command(self.tree, self.locks, self.queue)
        self.current: dict[str, tuple[Turn, int]] = {}
        self.chain_interrupts: dict[str, int] = {}
        self.results: deque[GenerationResult] = deque(maxlen=recent_results)
        """The last turns' results, for an operator's look: bounded, the bot runs for weeks."""

    @property
    def bot_id(self) -> int:
        user = self.client.user
        if user is None:
            raise RuntimeError("the client is not logged in")
        return user.id

    def attach(self) -> None:
        """Listen to the client's messages."""
        self.client.event(self.on_message)

    async def start(self) -> None:
        self.sweeper.start()
        await self.tree.sync()

    async def aclose(self) -> None:
        await self.sweeper.stop()
        await self.queue.aclose()

    async def on_message(self, message: discord.Message) -> None:
        admission = should_reply(message, self.bot_id, self.policy)
        if not admission.reply:
            return
        channel_id = str(message.channel.id)
        submission = self.queue.submit(channel_id, message)
        if submission.refusal is not None:
            try:
                await message.reply(submission.refusal,
                                    allowed_mentions=discord.AllowedMentions.none())
            except discord.HTTPException as exc:
                log.warning("could not post a refusal in %s: %s", channel_id, exc.status)

    def _on_queued(self, channel_id: str, message: discord.Message) -> None:
        """A new message from the same user may interrupt a stream, never a tool chain
        (S17, T3); the engine decides which by the state it is in."""
        running = self.current.get(channel_id)
        if running is not None and running[1] == message.author.id:
            running[0].notify_follow_up()

    async def run_turn(self, message: discord.Message, lock: ChannelLock) -> None:
        """One queued message, answered as one generation turn."""
        channel_id = str(message.channel.id)
        typing = TypingIndicator.for_channel(self.client, message.channel.id)
        channel = DiscordChannel(self.client, message.channel.id, reply_to=message.id,
                                 typing=typing)
        turns: list[tuple[Turn, JournalRecorder]] = []
        items: list[dict[str, Any]] = []

        def on_attempt(turn: Turn) -> None:
            self.current[channel_id] = (turn, message.author.id)
            recorder = JournalRecorder(turn.turn_id, turn.config, self.tools,
                                       history=scenario_history(items), request=turn.request)
            turn.recorder = recorder
            turns.append((turn, recorder))

        lock.follow_up_interrupts = self.chain_interrupts.get(channel_id, 0)
        typing.start()
        try:
            history = await self._read_history(message, lock)
            items[:] = dialogue_items(history, bot_user_id=self.bot_id,
                                      limit=self.history_limit)
            request = TurnRequest(context_items=items, system_prompt=self.system_prompt,
                                  trigger_message_id=str(message.id), queued=True,
                                  owner=self.client.user.name if self.client.user else "bot")
            result = await run_generation_turn(
                self.attempts, channel=channel, locks=self.locks, lock=lock, request=request,
                config=self.config, tools=self.tools, stash=self.stash, on_attempt=on_attempt)
            self.results.append(result)
            log.info("channel %s: turn ended %s", channel_id, result.status)
        finally:
            self._carry_interrupts(channel_id, lock)
            self.current.pop(channel_id, None)
            await typing.stop()
            await channel.aclose()
            self._write_journals(turns, items_of=message)

    async def _read_history(self, message: discord.Message, lock: ChannelLock
                            ) -> list[discord.Message]:
        """The channel's recent messages. The engine turn is not running yet, so the lock's
        kill cancels the read (D3): after /kill the turn starts without history and stops at
        once in Preparing; after a stale release it is abandoned."""
        read = asyncio.create_task(recent_messages(message.channel,
                                                   limit=self.history_limit + 1, before=None),
                                   name=f"history:{message.channel.id}")

        def kill(_reason: str) -> None:
            read.cancel()

        lock.turn_kill = kill
        try:
            return await read
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not lock.stop_requested or lock.released or (current and current.cancelling()):
                raise
            return []
        finally:
            if lock.turn_kill is kill:
                lock.turn_kill = None

    def _carry_interrupts(self, channel_id: str, lock: ChannelLock) -> None:
        """Follow-up interrupts count against the cap for as long as the channel stays busy
        (S17: at most `max_follow_up_interrupts` per lock, and the queue takes a new lock for
        each message); an idle channel starts again from zero."""
        if self.queue.pending(channel_id):
            self.chain_interrupts[channel_id] = lock.follow_up_interrupts
        else:
            self.chain_interrupts.pop(channel_id, None)

    def _write_journals(self, turns: list[tuple[Turn, JournalRecorder]],
                        items_of: discord.Message) -> None:
        if self.journal_dir is None:
            return
        for turn, recorder in turns:
            document = journal_document(recorder.scenario(), turn.transitions,
                                        turn.result().as_dict())
            path = self.journal_dir / f"{items_of.channel.id}-{items_of.id}-{turn.turn_id}.json"
            try:
                write_journal(path, document)
            except OSError as exc:
                log.warning("journal %s not written: %s", path.name, exc.strerror)


def scenario_history(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dialogue items in the scenario format's `history` shape, for the turn's journal."""
    return [
        {"id": item["message_id"], "author": item.get("author", ""),
         "author_id": item.get("author_id"), "content": item.get("content", ""),
         "at": item.get("sent_at", ""), "reply_to": item.get("reply_to"),
         "reactions": [{"emoji": r["emoji"], "count": r.get("count", 0)}
                       for r in item.get("reactions") or []]}
        for item in items if item.get("type") == "dialogue"
    ]


def build_client() -> discord.Client:
    intents = discord.Intents.default()
    intents.message_content = True
    return discord.Client(intents=intents, allowed_mentions=discord.AllowedMentions.none())


def run_bot(settings: AppSettings) -> int:
    """The real bot, until interrupted."""
    assert settings.discord_token is not None
    return asyncio.run(_serve(settings))


async def _serve(settings: AppSettings) -> int:
    client = build_client()
    fetcher = MediaFetcher()
    async with aiohttp.ClientSession() as session:
        attempts = [Attempt(build_provider(config, session), f"{config.kind}:{config.model}")
                    for config in settings.attempts()]
        tools = EnrichmentTools(fetcher, discord_avatar_lookup(client)).tools()
        bot = TurnBot(client, attempts, config=settings.engine,
                      system_prompt=settings.system_prompt,
                      trigger_words=settings.trigger_words, queue_limit=settings.queue_limit,
                      history_limit=settings.history_limit, tools=tools,
                      journal_dir=Path(settings.journal_dir))
        bot.attach()
        tune_gc(settings.gc)

        @client.event
        async def setup_hook() -> None:
            await bot.start()

        token = settings.discord_token
        assert token is not None
        try:
            await client.start(token.get_secret_value())
        finally:
            await bot.aclose()
            await fetcher.aclose()
            await client.close()
    return 0
