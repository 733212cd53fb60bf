"""The Discord bot: gateway messages in, the engine's generation turn out.

A message the bot should answer (mention, reply, DM, trigger word) and the operator's access
lists allow goes to the channel's queue; one turn per channel runs at a time (D4). Each turn
sees the history its policy picks, never the messages queued behind it, streams into a
`DiscordChannel` (D1, D2) under a typing indicator with one owner, sees the tools of the bot
with the turn's flags (R8), and is journaled so it can be replayed. `/kill` stops the
channel's turn and clears its queue (D3), for those allowed to; a follow-up from the same user
may interrupt a stream (S17). On SIGTERM or Ctrl-C the bot stops admitting, kills its running
turns (which keeps what they delivered), writes their journals and closes (`shutdown`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import aiohttp
import discord
from discord import app_commands

from discord_io.admission import AccessPolicy, AdmissionPolicy, should_reply
from discord_io.attachments import AttachmentReader
from discord_io.channel_queue import ChannelQueue
from discord_io.channel_rights import RightsCache
from discord_io.delivery import DiscordChannel
from discord_io.enrichment_tools import EnrichmentTools, discord_avatar_lookup
from discord_io.exclusion import Exclusion, TurnAudience
from discord_io.history import (
    HistoryPolicy,
    HistoryRead,
    ParentRead,
    recent_messages,
    referenced,
)
from discord_io.history_cache import GatewayHistory
from discord_io.kill_command import KillPermission, install_kill_command
from discord_io.media_fetch import MediaFetcher
from discord_io.member_roles import MemberRoles
from discord_io.rate_limits import guard_rate_limits
from discord_io.session_gaps import SessionGaps
from discord_io.stale_sweeper import StaleLockSweeper
from discord_io.turn_context import build_context, hidden_from
from discord_io.typing_indicator import TypingIndicator
from fsm import (
    Attempt,
    ChannelLock,
    ChannelLockRegistry,
    ContextStash,
    GenerationResult,
    Tool,
    ToolRegistry,
    Turn,
    TurnConfig,
    TurnObserver,
    TurnRequest,
    framed_prompt,
    run_generation_turn,
)

from .event_loop import run_on_event_loop
from .gc_tuning import tune_gc
from .journals import JournalStore, ReplyJournals, scenario_history
from .live_settings import LiveSettings
from .operator_build import build_catalog, open_store
from .operator_commands import install_operator_commands
from .operator_side import OperatorSide
from .reload import SettingsReloader
from .settings import AppSettings, JournalSettings
from .shutdown import StopRequest
from .startup import StartupError, describe_failure, invite_url, ready_line
from .telemetry import build_telemetry, start_telemetry, with_telemetry
from .turn_log import log_turn_end

if TYPE_CHECKING:
    from discord_io.redis_backend.queue import RedisChannelQueue
    from fsm.telemetry import Telemetry
    from turn_engine.settings_store import SettingsStore

log = logging.getLogger(__name__)

SystemPrompt = str | Callable[[], str]


class TurnBot:
    """Everything the bot holds between messages; `attach` wires it to a client."""

    def __init__(
        self,
        client: discord.Client,
        attempts: Sequence[Attempt],
        *,
        config: TurnConfig | None = None,
        system_prompt: SystemPrompt = "",
        trigger_words: Sequence[str] = (),
        queue_limit: int = 10,
        link_previews: bool = False,
        history_limit: int = 20,
        history: HistoryPolicy | None = None,
        access: AccessPolicy | None = None,
        kill_roles: Collection[int] = (),
        attachments: AttachmentReader | None = None,
        tools: Sequence[Tool] = (),
        journal_dir: Path | None = None,
        journals: JournalStore | None = None,
        recent_results: int = 100,
        observer: TurnObserver | None = None,
        telemetry: Telemetry | None = None,
        operator: OperatorSide | None = None,
    ) -> None:
        self.client = client
        self.attempts = list(attempts)
        self.config = config if config is not None else TurnConfig()
        self.system_prompt = system_prompt
        access = access if access is not None else AccessPolicy()
        self.policy = AdmissionPolicy(trigger_words=tuple(trigger_words), access=access)
        self.history = history if history is not None else HistoryPolicy(
            max_messages=history_limit)
        self.attachments = attachments
        self.link_previews = link_previews
        self.member_roles = MemberRoles(client)
        """Roles of the members whose messages turns read (history carries none)."""
        self.exclusion = Exclusion(lambda: self.policy.access, self.member_roles,
                                   lambda: self.bot_id)
        """Whose messages a turn may show the model: the access lists, on every path."""
        if journals is None and journal_dir is not None:
            journals = JournalStore(JournalSettings(dir=str(journal_dir), max_files=None))
        self.journals = journals
        self.locks = ChannelLockRegistry(
            stale_age_s=self.config.stale_lock_age_s,
            max_follow_up_interrupts=self.config.max_follow_up_interrupts,
        )
        self.queue: ChannelQueue[discord.Message] = ChannelQueue(
            self.locks, self.run_turn, max_queued=queue_limit,
            owner_of=lambda message: str(message.id), on_queued=self._on_queued,
            user_of=lambda message: str(message.author.id),
        )
        self.sweeper = StaleLockSweeper(self.locks)
        self.tools = ToolRegistry(tools)
        self.stash = ContextStash(ttl_s=self.config.stash_ttl_s,
                                  max_items=self.config.stash_max_items,
                                  max_bytes=self.config.stash_max_bytes)
        self.tree: app_commands.CommandTree[discord.Client] = app_commands.CommandTree(client)
        self.kill_roles = set(kill_roles)
        """Who may /kill besides the requester and Manage Messages (a reload updates it)."""
        self.kill_permission = KillPermission(self._requester, roles=self.kill_roles)
        install_kill_command(self.tree, self.locks, self.queue, self.kill_permission)
        self.operator = operator
        """Models and personas per channel, MCP tools, usage, /reset (`operator_side`)."""
        if operator is not None:
            install_operator_commands(self.tree, operator,
                                      trigger_words=lambda: self.policy.trigger_words)
        self.current: dict[str, tuple[Turn, int]] = {}
        self.requesters: dict[str, int] = {}
        """Whose message each channel's running turn answers (from before its history read)."""
        self.results: deque[GenerationResult] = deque(maxlen=recent_results)
        """The last turns' results, for an operator's look: bounded, the bot runs for weeks."""
        self.stopping = False
        self.kill_registered = False
        """Whether Discord took /kill at start-up (`tree.sync`), for the ready line."""
        self.scale_out: RedisChannelQueue[discord.Message] | None = None
        """The Redis queue when the bot runs as many processes (`scale_out.attach_scale_out`)."""
        self._channels: set[str] = set()
        """Channels that have had a turn: where shutdown looks for running ones."""
        self.telemetry = telemetry
        """Traces and metrics (`TURN_TELEMETRY__*`), started and closed with the bot."""
        self.observer = with_telemetry(observer, telemetry)
        """What every turn's transitions are told to: `observer` and telemetry's."""
        self.rights = RightsCache(client)
        """What the bot may do in each channel, asked before a turn spends anything."""
        self.session_gaps = SessionGaps(client)
        """Windows of gateway events lost with a session, each logged."""
        self.history_cache = GatewayHistory(client, self.session_gaps)
        """Channel history from the messages the gateway delivered, where it is exactly
        what a REST read returns (D51)."""

    @property
    def bot_id(self) -> int:
        user = self.client.user
        if user is None:
            raise RuntimeError("the client is not logged in")
        return user.id

    def attach(self) -> None:
        """Listen to the client's messages, to what changes the bot's rights, and say when
        it is connected."""
        self.client.event(self.on_message)
        self.rights.attach()
        self.session_gaps.attach()
        self.history_cache.attach()
        self.client.event(self.on_ready)

    async def on_ready(self) -> None:
        log.info("%s", ready_line(self.client, self.kill_registered))
        self.session_gaps.client_ready()

    async def start(self) -> None:
        await start_telemetry(self.telemetry, self.queue.waiting)
        self.sweeper.start()
        if self.operator is not None:
            await self.operator.start()
        if self.scale_out is not None:
            await self.scale_out.start()
        try:
            await self.tree.sync()
            self.kill_registered = True
        except discord.HTTPException as exc:
            log.warning("slash commands could not be registered with Discord (HTTP %s): %s",
                        exc.status, exc.text or "no detail")
        if self.client.application_id is not None:
            log.info("invite the bot with: %s", invite_url(self.client.application_id))

    async def aclose(self) -> None:
        await self.sweeper.stop()
        await self.queue.aclose()
        if self.scale_out is not None:
            await self.scale_out.aclose()
        if self.operator is not None:
            await self.operator.aclose()
        if self.telemetry is not None:
            await self.telemetry.aclose()  # after the turns: their last spans are flushed

    async def shutdown(self, grace_s: float) -> None:
        """Stop admitting, drop the queues, kill the running turns (they keep what they
        delivered and write their journals), wait up to `grace_s` for them, then close."""
        self.stopping = True
        dropped = 0
        for channel_id in sorted(self._channels):
            dropped += self.queue.clear(channel_id)
            self.locks.request_stop(channel_id)
        if self.scale_out is not None:
            await self.scale_out.drain(grace_s)  # what is queued goes to the other workers
        busy = [c for c in sorted(self._channels) if self.queue.busy(c)]
        log.info("shutting down: %d running turn(s) stopped, %d queued message(s) dropped",
                 len(busy), dropped)
        if busy:
            joined = asyncio.gather(*(self.queue.join(c) for c in busy))
            try:
                await asyncio.wait_for(joined, grace_s)
            except TimeoutError:
                log.warning("turns still running after %.0f s; cancelling them", grace_s)
        await self.aclose()

    @property
    def history_read(self) -> HistoryRead:
        """How turns read history: from the gateway's windows (D51), except with the Redis
        backend, where a channel's events may reach another process than the one running
        its turn, so no window here is known whole (D53)."""
        return self.history_cache.read if self.scale_out is None else recent_messages

    @property
    def history_parent(self) -> ParentRead:
        """How reply chains read a parent: from the gateway's windows (D59), except with the
        Redis backend (D53)."""
        return self.history_cache.referenced if self.scale_out is None else referenced

    def _requester(self, channel_id: str) -> int | None:
        return self.requesters.get(channel_id)

    async def on_message(self, message: discord.Message) -> None:
        self.history_cache.saw(message)
        if self.stopping:
            return
        self.member_roles.saw(message)
        admission = should_reply(message, self.bot_id, self.policy)
        if not admission.reply:
            if admission.reason in ("dms_off", "user_not_allowed", "channel_not_allowed"):
                log.debug("message %s not answered: %s", message.id, admission.reason)
            return
        channel_id = str(message.channel.id)
        rights = self.rights.rights(message.channel)
        if not rights.send:
            log.debug("message %s not answered: the bot may not post in %s (missing %s)",
                      message.id, channel_id, rights.missing)
            return
        self._channels.add(channel_id)
        if self.scale_out is not None:
            submission = await self.scale_out.submit(channel_id, message)
        else:
            submission = self.queue.submit(channel_id, message)
        if submission.refusal is not None:
            try:
                if rights.reply:
                    await message.reply(submission.refusal,
                                        allowed_mentions=discord.AllowedMentions.none())
                else:
                    await message.channel.send(submission.refusal,
                                               allowed_mentions=discord.AllowedMentions.none())
            except discord.HTTPException as exc:
                log.warning("could not post a refusal in %s: %s", channel_id, exc.status)

    async def _over_quota(self, message: discord.Message) -> bool:
        """A user past today's token quota gets one polite notice a day, then silence."""
        assert self.operator is not None
        notice = await self.operator.over_quota(str(message.author.id))
        if notice is None:
            return False
        if notice:
            try:
                await message.reply(notice, allowed_mentions=discord.AllowedMentions.none())
            except discord.HTTPException as exc:
                log.warning("could not post the quota notice in %s: %s", message.channel.id,
                            exc.status)
        return True

    def _on_queued(self, channel_id: str, message: discord.Message) -> None:
        """A new message from the same user may interrupt a stream, never a tool chain
        (S17, T3); the engine decides which by the state it is in."""
        running = self.current.get(channel_id)
        if running is not None and running[1] == message.author.id:
            running[0].notify_follow_up()

    def _prompt(self) -> str:
        persona = self.system_prompt() if callable(self.system_prompt) else self.system_prompt
        return framed_prompt(persona)

    async def run_turn(self, message: discord.Message, lock: ChannelLock) -> None:
        """One queued message, answered as one generation turn (checked against the daily
        quota here, in queue order, rather than on arrival)."""
        if self.operator is not None and await self._over_quota(message):
            return
        channel_id = str(message.channel.id)
        guild_id = str(message.guild.id) if message.guild is not None else None
        setup = (await self.operator.prepare(guild_id, channel_id, self._bot_name())
                 if self.operator is not None else None)
        tools = setup.tools if setup is not None else self.tools
        attempts = setup.attempts if setup is not None else self.attempts
        started = asyncio.get_running_loop().time()
        typing = TypingIndicator.for_channel(self.client, message.channel.id)
        audience = self.exclusion.for_turn()
        rights = self.rights.rights(message.channel)
        channel = DiscordChannel(self.client, message.channel.id,
                                 reply_to=message.id if rights.reply else None,
                                 typing=typing,
                                 max_messages=self.config.max_delivered_messages,
                                 readable=audience.reader_in(message),
                                 link_previews=self.link_previews)
        items: list[dict[str, Any]] = []
        reply = ReplyJournals(self.journals, f"{message.channel.id}-{message.id}",
                              [a.label for a in attempts], tools)
        result: GenerationResult | None = None
        failure = "failed"

        def on_attempt(turn: Turn) -> None:
            self.current[channel_id] = (turn, message.author.id)
            reply.history = scenario_history(items)
            reply.on_attempt(turn)

        self.requesters[channel_id] = message.author.id
        typing.start()
        try:
            items[:] = await self._killable(lock, self._context(message, audience), default=[])
            prompt = (framed_prompt(setup.system_prompt) if setup is not None
                      else self._prompt())
            request = TurnRequest(context_items=items, system_prompt=prompt,
                                  trigger_message_id=str(message.id), queued=True,
                                  owner=self._bot_name())
            result = await run_generation_turn(
                attempts, channel=channel, locks=self.locks, lock=lock, request=request,
                config=self.config, tools=tools, stash=self.stash, on_attempt=on_attempt,
                observer=self.observer)
            self.results.append(result)
            if self.operator is not None:
                await self.operator.record(result, user_id=str(message.author.id),
                                           channel_id=channel_id, guild_id=guild_id)
        except asyncio.CancelledError:
            failure = "cancelled"
            raise
        except Exception as exc:
            failure = f"failed:{type(exc).__name__}"
            raise
        finally:
            self._carry_interrupts(channel_id, lock)
            self.current.pop(channel_id, None)
            try:
                await typing.stop()
                await channel.aclose()
                await reply.save(result, self._origin(message))
                log_turn_end(log, channel_id, str(message.id), result,
                             asyncio.get_running_loop().time() - started, failure=failure)
            finally:
                # The requester may /kill until the lock goes: the last send's grace and
                # the journal are still part of the turn.
                self.requesters.pop(channel_id, None)

    def _bot_name(self) -> str:
        return self.client.user.name if self.client.user else "bot"

    async def _context(self, message: discord.Message,
                       audience: TurnAudience) -> list[dict[str, Any]]:
        """The dialogue the model sees: the policy's messages, minus those waiting for a turn
        of their own (D4) and those the access lists deny, within the budget, with the
        uploads it may see."""
        channel_id = str(message.channel.id)
        queued = hidden_from(message, pending=lambda: self.queue.pending(channel_id),
                             bot_user_id=self.bot_id, policy=self.policy)
        operator = self.operator

        def hidden(candidate: discord.Message) -> bool:
            if operator is not None and operator.forgotten(channel_id, candidate.id):
                return True  # from before the channel's /reset, the bot's own too
            return queued(candidate)

        return await build_context(message, history=self.history, audience=audience,
                                   hidden=hidden, bot_user_id=self.bot_id,
                                   attachments=self.attachments,
                                   waiting=len(self.queue.pending(channel_id)),
                                   read_history=self.rights.rights(message.channel).read_history,
                                   read=self.history_read,
                                   read_parent=self.history_parent)

    async def _killable(self, lock: ChannelLock, work: Any, default: Any) -> Any:
        """Run `work` (the history read) so the lock's kill cancels it (D3): the engine turn
        is not running yet, so after /kill the turn starts without history and stops at once
        in Preparing; after a stale release it is abandoned."""
        read = asyncio.create_task(work, name=f"history:{lock.channel_id}")

        def kill(_reason: str) -> None:
            read.cancel()

        lock.turn_kill = kill
        try:
            return await read
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not lock.stop_requested or lock.released or (current and current.cancelling()):
                raise
            return default
        finally:
            if lock.turn_kill is kill:
                lock.turn_kill = None

    def _carry_interrupts(self, channel_id: str, lock: ChannelLock) -> None:
        """Follow-up interrupts count against the cap for as long as the channel stays busy
        (S17: at most `max_follow_up_interrupts` per lock, and the queue takes a new lock for
        each message); an idle channel starts again from zero, and so does one where /kill
        cleared the queue, even during this turn's tail (the registry drops the count)."""
        self.locks.carry_follow_up_interrupts(
            lock, queued_next=bool(self.queue.pending(channel_id)))

    def _origin(self, message: discord.Message) -> dict[str, str | int]:
        """Where a turn ran, for its journals: the channel and message, and with Redis the
        worker that held the channel's lease and the lease's fencing token (D4)."""
        origin: dict[str, str | int] = {"channel_id": str(message.channel.id),
                                        "message_id": str(message.id)}
        running = (self.scale_out.running.get(str(message.channel.id))
                   if self.scale_out is not None else None)
        if running is not None:
            origin["worker"] = running.worker_id
            origin["fence"] = running.fence
        return origin


def bot_intents() -> discord.Intents:
    """Only what the bot uses: guilds (channels, roles, threads: its permissions), guild and
    DM messages, and their content, and their reactions (a reaction changes what a history
    read returns, so the history windows must hear of it: D51). `Intents.default()` would
    also bring every guild's typing, voice states, polls, invites and more, each an event
    to parse."""
    return discord.Intents(guilds=True, guild_messages=True, dm_messages=True,
                           message_content=True, guild_reactions=True, dm_reactions=True)


def build_client(http_trace: aiohttp.TraceConfig | None = None) -> discord.Client:
    """Sharded as Discord recommends (GET /gateway/bot): each guild's events on its shard."""
    intents = bot_intents()
    if http_trace is None:
        client = discord.AutoShardedClient(intents=intents,
                                           allowed_mentions=discord.AllowedMentions.none())
    else:
        client = discord.AutoShardedClient(intents=intents,
                                           allowed_mentions=discord.AllowedMentions.none(),
                                           http_trace=http_trace)
    guard_rate_limits(client)
    return client


def builtin_tools(client: discord.Client, fetcher: MediaFetcher) -> list[Tool]:
    """The four enrichment tools, before the operator's selection."""
    return EnrichmentTools(fetcher, discord_avatar_lookup(client)).tools()


def build_bot(client: discord.Client, settings: AppSettings, session: aiohttp.ClientSession,
              fetcher: MediaFetcher, store: SettingsStore | None = None) -> TurnBot:
    """The bot as the settings describe it; with a `store`, the operator's side too (models
    and personas per channel, the MCP servers' and hooks' tools, usage, /reset)."""
    all_builtins = builtin_tools(client, fetcher)
    live = LiveSettings.build(settings, session, fetcher, all_builtins,
                              with_operator=store is not None)
    operator = (OperatorSide(live.operator, store, build_catalog(settings, live.builtins))
                if store is not None and live.operator is not None else None)
    return TurnBot(
        client, live.attempts, config=settings.engine, system_prompt=live.persona.system_prompt,
        trigger_words=settings.trigger_words, queue_limit=settings.queue_limit,
        link_previews=live.link_previews,
        history=live.history, access=live.policy.access, kill_roles=live.kill_roles,
        attachments=live.attachments, tools=live.builtins, journals=live.journals,
        telemetry=build_telemetry(settings.telemetry), operator=operator)


def run_bot(settings: AppSettings) -> int:
    """The real bot, until SIGTERM or Ctrl-C, on the event loop the settings choose (uvloop
    where it is installed: D55)."""
    return run_on_event_loop(serve(settings), settings.event_loop)


async def serve(settings: AppSettings, *, stop: StopRequest | None = None,
                client: discord.Client | None = None) -> int:
    """Log in, answer until asked to stop, shut down gracefully; 0 on a clean stop. A
    start-up failure Discord explains raises `StartupError` with its one line."""
    token = settings.discord_token
    if token is None:
        raise StartupError("TURN_DISCORD_TOKEN is not set")
    redis_url = settings.redis_url.get_secret_value() if settings.redis_url else None
    scale_out = _scale_out() if redis_url else None
    client = client if client is not None else build_client(
        scale_out.fencing_trace() if scale_out else None)
    stop = stop if stop is not None else StopRequest()
    store = await open_store(settings)
    log.info("settings store: %s", store.description)
    fetcher = MediaFetcher()
    started = False
    try:
        # Every streaming turn holds one provider connection: aiohttp's default pool of 100
        # would queue the 101st channel's stream behind the others (BENCHMARKS.md, item 7).
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            try:
                bot = build_bot(client, settings, session, fetcher, store)
            except BaseException:
                await store.aclose()
                raise
            if scale_out is not None and redis_url is not None:
                scale_out.attach_scale_out(bot, redis_url)
            bot.attach()
            tune_gc(settings.gc)
            reloader = SettingsReloader(bot, settings, session, fetcher,
                                        builtin_tools(client, fetcher))

            async def setup_hook() -> None:
                await bot.start()

            client.setup_hook = setup_hook  # type: ignore[method-assign]
            with stop.installed(), reloader.installed():
                started = True
                running = asyncio.create_task(client.start(token.get_secret_value()),
                                              name="discord-client")
                stopped = asyncio.create_task(stop.wait(), name="stop-request")
                await asyncio.wait({running, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if running.done():
                    await bot.aclose()
                    _raise_startup_failure(running)
                    return 0
                await bot.shutdown(settings.shutdown_grace_s)
                await client.close()
                await asyncio.wait({running}, timeout=settings.shutdown_grace_s)
                if not running.done():
                    running.cancel()
                    await asyncio.wait({running})
                elif not running.cancelled() and running.exception() is not None:
                    log.info("client ended with %s while stopping",
                             type(running.exception()).__name__)
    finally:
        await fetcher.aclose()
        if started and not client.is_closed():  # a client never started has nothing open
            await client.close()
    log.info("stopped")
    return 0


def _scale_out() -> ModuleType:
    """The Redis wiring, imported only when configured: redis-py is an optional extra."""
    try:
        from . import scale_out
    except ImportError as exc:
        raise StartupError("TURN_REDIS_URL is set but redis-py is missing: "
                           "pip install 'turn-engine[redis]'") from exc
    return scale_out


def _raise_startup_failure(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is None:
        return
    line = describe_failure(exc)
    if line is None:
        raise exc
    raise StartupError(line) from None
