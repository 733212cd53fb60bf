"""The Discord gateway on loopback, beside the REST emulator, for `client.start()`.

`GET /gateway/bot` points discord.py here (with its `session_start_limit`: every IDENTIFY
spends one of 1,000 a day). Each connection gets HELLO; IDENTIFY is checked — token (close
4004), API version (4012), intents that do not exist (4013) or privileged ones not granted
(4014), shard (4010), too many guilds for one shard (4011), more than `max_concurrency`
identifies of a rate-limit key in 5 s (op 9) — and answered with READY and one GUILD_CREATE
per guild of the shard: the channels and active threads the bot may view, the members and
roles. A payload before IDENTIFY is 4003, an unknown opcode 4001, bad JSON 4002.

Sessions end as on Discord: the client must beat (the gateway never asks), and a connection
whose beats stop is closed; a session whose client has been silent past `session_timeout_s`
is gone, so its RESUME is refused (INVALID_SESSION) and the client must IDENTIFY anew — the
events dispatched meanwhile are lost. So is a session closed with 4007 or 4009. RESUME goes
to READY's `resume_gateway_url`, which is not the connect URL; a RESUME with a sequence the
session never sent is closed 4007. Otherwise the session replays what the client missed,
then RESUMED.

Dispatches (messages, reactions, interactions, roles, channels, threads, members, typing,
voice states, poll votes) go to the shard owning the guild, `(guild_id >> 22) % shards` (DMs:
shard 0), only when the session's intents ask for them, and only for channels the bot may
view; without MESSAGE_CONTENT a message that does not mention the bot arrives with its
content blanked. Transport compression: zlib-stream and zstd-stream (`transport`).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from .gateway_events import (
    ALREADY_AUTHENTICATED,
    AUTHENTICATION_FAILED,
    CLIENT_OPCODES,
    CLOSE_REASONS,
    DECODE_ERROR,
    DISALLOWED_INTENTS,
    DISPATCH,
    GUILDS,
    HEARTBEAT,
    HEARTBEAT_ACK,
    HELLO,
    IDENTIFY,
    INVALID_API_VERSION,
    INVALID_INTENTS,
    INVALID_SEQ,
    INVALID_SESSION,
    INVALID_SHARD,
    MESSAGE_CONTENT,
    NEEDS,
    NORMAL_CLOSURE,
    NOT_AUTHENTICATED,
    PRIVILEGED_INTENTS,
    RECONNECT,
    REQUEST_GUILD_MEMBERS,
    RESUME,
    SESSION_ENDING_CLOSES,
    SHARDING_REQUIRED,
    UNKNOWN_OPCODE,
    VALID_INTENTS,
    event_violations,
    guild_create,
    shard_in,
    visible_to_bot,
)
from .gateway_events import (
    GUILD_MEMBERS as GUILD_MEMBERS,
)
from .gateway_events import (
    GUILD_MESSAGES as GUILD_MESSAGES,
)
from .interactions import Interactions
from .transport import Compressor, compressor_for
from .world import PRIVATE_THREAD, World

JsonDict = dict[str, Any]

GATEWAY_PATH = "/gateway-ws"
RESUME_PATH = "/gateway-resume"
"""READY's `resume_gateway_url` points here: not the URL the client connected to."""
HEARTBEAT_INTERVAL_MS = 41_250
HEARTBEAT_GRACE = 0.5
"""A beat may come this fraction of an interval late before the connection is closed."""
SESSION_TIMEOUT_S = 90.0
IDENTIFY_WINDOW_S = 5.0
SESSION_STARTS_PER_DAY = 1000
DAY_S = 86_400.0
API_VERSION = "10"


@dataclass(frozen=True, slots=True)
class ReceivedPayload:
    """One payload a client sent; `connection` numbers connections from 1."""

    connection: int
    shard_id: int | None
    op: int
    data: Any
    at: float


@dataclass(slots=True)
class Session:
    """A gateway session: what READY started and RESUME continues."""

    session_id: str
    shard_id: int
    shard_count: int
    intents: int
    events: list[tuple[int, str, JsonDict]] = field(default_factory=list)
    seq: int = 0
    connection: _Connection | None = None
    invalid: bool = False
    resumes: int = 0
    heard_at: float = 0.0
    """When its client last sent anything (its session times out from then)."""
    lost: list[tuple[int, str]] = field(default_factory=list)
    """(seq, event) dispatched to it that its client never got: the session ended first."""

    def missed_since(self, seq: int) -> list[tuple[int, str, JsonDict]]:
        return [event for event in self.events if event[0] > seq]


@dataclass(slots=True)
class _Connection:
    number: int
    ws: web.WebSocketResponse
    request: web.Request
    compressor: Compressor | None
    clock: Callable[[], float]
    session: Session | None = None
    zombie: bool = False
    closed: bool = False
    last_sent: float = 0.0
    last_beat: float = 0.0
    watchdog: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    delivered: int = 0
    """Sequence of the last dispatch written to this connection."""

    @property
    def path(self) -> str:
        return self.request.path

    async def send(self, payload: JsonDict) -> None:
        if self.closed or self.zombie or self.ws.closed:
            return
        self.last_sent = self.clock()
        text = json.dumps(payload)
        async with self.lock:
            try:
                if self.compressor is None:
                    await self.ws.send_str(text)
                else:
                    await self.ws.send_bytes(self.compressor.compress(text))
            except (ConnectionError, RuntimeError):
                self.closed = True
                return
        if payload.get("op") == DISPATCH and isinstance(payload.get("s"), int):
            self.delivered = payload["s"]


class Gateway:
    """The gateway half of a `DiscordEmulator` (reach it as ``emulator.gateway``)."""

    def __init__(self, emulator: World, interactions: Interactions) -> None:
        self._emu = emulator
        self._interactions = interactions
        self.token: str | None = None
        """The token IDENTIFY must carry; None: the emulator's (set another to get 4004)."""
        self.granted_intents = MESSAGE_CONTENT
        """Privileged intents the application may ask for (others: close 4014)."""
        self.shards = 1
        """The shard count GET /gateway/bot recommends."""
        self.max_concurrency = 1
        self.max_guilds_per_shard = 2500
        """More guilds on one shard: close 4011 (sharding required)."""
        self.heartbeat_interval_ms = HEARTBEAT_INTERVAL_MS
        self.session_timeout_s = SESSION_TIMEOUT_S
        self.sessions: dict[str, Session] = {}
        self.received: list[ReceivedPayload] = []
        self.closes: list[tuple[int, int]] = []
        """(connection, close code) for each close the gateway sent."""
        self.undelivered: list[tuple[str, JsonDict]] = []
        """Dispatches with no session to take them (the shard not connected)."""
        self.delivered: Counter[str] = Counter()
        """How many of each event went to a session (what the client had to parse)."""
        self.identifies: deque[float] = deque()
        """When each IDENTIFY of the last day started a session (`session_start_limit`)."""
        self._identify_keys: dict[int, float] = {}
        self._connections: list[_Connection] = []
        self._changed: asyncio.Condition | None = None
        self.url = ""
        self.resume_url = ""

    # ---- wiring --------------------------------------------------------------------------

    def bind(self, base: str) -> None:
        """Called by the emulator once it listens: `base` is ``http://host:port``."""
        ws_base = "ws" + base.removeprefix("http")
        self.url = ws_base + GATEWAY_PATH
        self.resume_url = ws_base + RESUME_PATH
        self._changed = asyncio.Condition()

    def routes(self, app: web.Application) -> None:
        app.router.add_get(GATEWAY_PATH, self.handle)
        app.router.add_get(RESUME_PATH, self.handle)

    def bot_gateway(self) -> JsonDict:
        """The body of GET /gateway/bot; `remaining` falls with each IDENTIFY of the day."""
        now = self._emu.now()
        self._forget_identifies(now)
        reset_after = (self.identifies[0] + DAY_S - now) if self.identifies else DAY_S
        return {"url": self.url, "shards": self.shards,
                "session_start_limit": {
                    "total": SESSION_STARTS_PER_DAY,
                    "remaining": SESSION_STARTS_PER_DAY - len(self.identifies),
                    "reset_after": int(reset_after * 1000),
                    "max_concurrency": self.max_concurrency}}

    def shard_of(self, guild_id: int | None) -> int:
        """Discord's rule: `(guild_id >> 22) % num_shards`; DMs go to shard 0."""
        return 0 if guild_id is None else (guild_id >> 22) % self.shards

    def guild_create_payload(self, guild_id: int) -> JsonDict:
        return guild_create(self._emu, guild_id)

    # ---- queries -------------------------------------------------------------------------

    def live_session(self, shard_id: int = 0) -> Session | None:
        """The newest valid session of a shard."""
        for session in reversed(self.sessions.values()):
            if session.shard_id == shard_id and not session.invalid:
                return session
        return None

    def payloads(self, op: int, shard_id: int | None = None) -> list[ReceivedPayload]:
        return [p for p in self.received
                if p.op == op and (shard_id is None or p.shard_id == shard_id)]

    def connection_paths(self) -> list[str]:
        """The URL path each connection opened, in order (`GATEWAY_PATH` or `RESUME_PATH`)."""
        return [c.path for c in self._connections]

    async def wait_for(self, predicate: Callable[[], bool], *, timeout: float = 120.0) -> None:
        """Wait (loop clock) until `predicate()` holds; re-checked after every gateway event."""
        assert self._changed is not None, "emulator not started"
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(predicate)

    async def wait_for_payload(self, op: int, *, count: int = 1,
                               shard_id: int | None = None) -> list[ReceivedPayload]:
        await self.wait_for(lambda: len(self.payloads(op, shard_id)) >= count)
        return self.payloads(op, shard_id)

    async def _notify(self) -> None:
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()

    # ---- dispatch ------------------------------------------------------------------------

    async def dispatch(self, name: str, data: JsonDict, *, guild_id: int | None = None) -> bool:
        """Send an event to the shard owning `guild_id`; True if a session took it (it is
        replayed on RESUME if the connection is down). A session whose intents do not ask
        for the event never gets it, nor an event of a channel the bot may not view."""
        session = self.live_session(self.shard_of(guild_id))
        if session is None:
            self.undelivered.append((name, data))
            return False
        guild_need, dm_need = NEEDS.get(name, (0, 0))
        need = guild_need if guild_id is not None else dm_need
        if need and not session.intents & need:
            return False
        if not visible_to_bot(self._emu, name, data):
            return False
        if name == "MESSAGE_CREATE":
            data = self._as_intents_allow(data, session.intents)
        await self._send_event(session, name, data)
        return True

    async def message_create(self, channel_id: int, author_id: int, content: str, *,
                             mentions: Iterable[int] = (), reply_to: int | None = None,
                             attachments: Iterable[JsonDict] = ()) -> JsonDict:
        """A user posts a message: stored in the channel and dispatched; returns it.

        In a guild channel the event carries `guild_id` and the author's `member` (with the
        roles given in `member_roles`); in a DM (`add_dm_channel`) neither, and it goes to
        shard 0. `reply_to` makes it a reply (`message_reference`, `referenced_message`);
        `attachments` are `add_attachment` results. Mentioning someone in a private thread
        adds them to it (THREAD_MEMBERS_UPDATE, and THREAD_CREATE for the bot)."""
        emu = self._emu
        mentions = list(mentions)
        if emu.channels.get(channel_id, {}).get("type") == PRIVATE_THREAD:
            await self._add_mentioned(channel_id, mentions)
        message = emu.add_message(channel_id, author_id, content, mentions=mentions,
                                  reply_to=reply_to, attachments=attachments)
        guild_id = emu.guild_of(channel_id)
        event = dict(message)
        if guild_id is not None:
            event["member"] = emu.member_payload(author_id, guild_id)
        await self.dispatch("MESSAGE_CREATE", event, guild_id=guild_id)
        return message

    async def message_update(self, channel_id: int, message_id: int, content: str) -> JsonDict:
        """A user edits their message: stored and dispatched as MESSAGE_UPDATE (the whole
        message, as Discord sends it now); returns it."""
        emu = self._emu
        message = emu.messages[channel_id][message_id]
        message["content"] = content
        message["edited_timestamp"] = emu.timestamp_of(emu.next_id())
        await self.message_event("MESSAGE_UPDATE", channel_id, emu.served(message))
        return message

    async def message_delete(self, channel_id: int, message_id: int) -> None:
        """A user (or a moderator) deletes a message: gone from the channel, MESSAGE_DELETE."""
        self._emu.messages[channel_id].pop(message_id)
        await self.message_event("MESSAGE_DELETE", channel_id, {"id": str(message_id)})

    async def message_event(self, name: str, channel_id: int, message: JsonDict) -> None:
        """MESSAGE_CREATE, MESSAGE_UPDATE or MESSAGE_DELETE of a message already stored or
        removed (the bot's own sends, edits and deletes too: Discord tells every session),
        with `guild_id`, and the author's `member` where the event carries one."""
        emu = self._emu
        guild_id = emu.guild_of(channel_id)
        event = {**message, "channel_id": str(channel_id)}
        if guild_id is not None:
            event["guild_id"] = str(guild_id)
            if name != "MESSAGE_DELETE":
                event["member"] = emu.member_payload(int(message["author"]["id"]), guild_id)
        await self.dispatch(name, event, guild_id=guild_id)

    async def _add_mentioned(self, thread_id: int, mentions: list[int]) -> None:
        emu = self._emu
        parent = int(emu.channels[thread_id]["parent_id"])
        added = [u for u in mentions if emu.can_view(parent, u) and emu.join_thread(thread_id, u)]
        if added:
            await self.thread_members_update(thread_id, added=added)

    async def reaction_add(self, channel_id: int, message_id: int, emoji: str,
                           user_id: int) -> None:
        """A user reacts (`emoji` in route form: a unicode emoji or `name:id`)."""
        emu = self._emu
        emu.add_reaction(message_id, emoji, user_id)
        name, sep, emoji_id = emoji.partition(":")
        stored = emu.messages[channel_id].get(message_id)
        data: JsonDict = {
            "user_id": str(user_id), "channel_id": str(channel_id),
            "message_id": str(message_id), "emoji": {"id": emoji_id or None, "name": name},
            "burst": False, "type": 0,
        }
        if sep == "":
            data["emoji"] = {"id": None, "name": emoji}
        if stored is not None:
            data["message_author_id"] = stored["author"]["id"]
        guild_id = emu.guild_of(channel_id)
        if guild_id is not None:
            data["guild_id"] = str(guild_id)
            data["member"] = emu.member_payload(user_id, guild_id, with_user=True)
        await self.dispatch("MESSAGE_REACTION_ADD", data, guild_id=guild_id)

    async def interaction(self, name: str, *, channel_id: int | None = None,
                          user_id: int | None = None,
                          permissions: int | None = None) -> JsonDict:
        """A user runs the synced slash command `name`; returns the interaction payload.

        In a guild channel (or thread) it carries `guild_id`, the user's `member` with
        their permissions in the channel (computed from roles and overwrites unless
        `permissions` gives them, e.g. MANAGE_MESSAGES, 1 << 13) and `app_permissions`, the
        bot's. In a DM channel it carries `user` instead and no guild, and goes to shard
        0. The bot has 3 s of loop time to answer it (`interactions`)."""
        emu = self._emu
        in_guild = emu.guild_of(channel_id if channel_id is not None else emu.channel_id)
        payload = self._interactions.slash_command_payload(
            name, channel_id=channel_id, user_id=user_id, guild=in_guild is not None,
            permissions=permissions)
        guild = payload.get("guild_id")
        await self.dispatch("INTERACTION_CREATE", payload,
                            guild_id=int(guild) if guild is not None else None)
        return dict(payload)

    async def role_create(self, role_id: int) -> None:
        """An administrator creates a role (`add_role`) while the bot is connected."""
        await self._role_event("GUILD_ROLE_CREATE", role_id)

    async def role_update(self, role_id: int) -> None:
        """A role's permissions changed (`set_role_permissions`; the guild's id for
        @everyone): GUILD_ROLE_UPDATE."""
        await self._role_event("GUILD_ROLE_UPDATE", role_id)

    async def _role_event(self, name: str, role_id: int) -> None:
        emu = self._emu
        guild_id = role_id if role_id in emu.guilds else emu.role_guild[role_id]
        role = next(r for r in emu.guild_roles(guild_id) if r["id"] == str(role_id))
        await self.dispatch(name, {"guild_id": str(guild_id), "role": role}, guild_id=guild_id)

    async def channel_create(self, channel_id: int) -> None:
        """An administrator creates a guild channel (`add_text_channel`) while the bot is
        connected: CHANNEL_CREATE to the guild's shard."""
        await self._channel_event("CHANNEL_CREATE", channel_id)

    async def channel_update(self, channel_id: int) -> None:
        """A channel changed (its overwrites, `set_overwrite`): CHANNEL_UPDATE. A bot that
        can no longer view it gets it all the same (Topics › Threads › Losing Access)."""
        await self._channel_event("CHANNEL_UPDATE", channel_id)

    async def _channel_event(self, name: str, channel_id: int) -> None:
        guild_id = self._emu.guild_of(channel_id)
        if guild_id is None:
            raise ValueError(f"{name} is for guild channels (a DM needs none)")
        await self.dispatch(name, self._emu.channels[channel_id], guild_id=guild_id)

    async def member_update(self, user_id: int, guild_id: int | None = None) -> None:
        """A member's roles changed (`member_roles`): GUILD_MEMBER_UPDATE, which needs
        GUILD_MEMBERS except for the bot's own member (Topics › Gateway › Caveats)."""
        emu = self._emu
        guild_id = guild_id if guild_id is not None else emu.guild_id
        member = emu.member_payload(user_id, guild_id, with_user=True)
        data = {"guild_id": str(guild_id), **member}
        if user_id == emu.bot_id:
            session = self.live_session(self.shard_of(guild_id))
            if session is not None:
                await self._send_event(session, "GUILD_MEMBER_UPDATE", data)
            return
        await self.dispatch("GUILD_MEMBER_UPDATE", data, guild_id=guild_id)

    async def thread_create(self, thread_id: int) -> None:
        """A thread (or forum post) was made: THREAD_CREATE, if the bot may view it."""
        emu = self._emu
        data = {**emu.thread_payload(thread_id, for_user=emu.bot_id), "newly_created": True}
        await self.dispatch("THREAD_CREATE", data, guild_id=emu.guild_of(thread_id))

    async def thread_update(self, thread_id: int) -> None:
        """A thread changed (archived, unarchived, locked): THREAD_UPDATE."""
        emu = self._emu
        await self.dispatch("THREAD_UPDATE", emu.thread_payload(thread_id, for_user=emu.bot_id),
                            guild_id=emu.guild_of(thread_id))

    async def thread_delete(self, thread_id: int) -> None:
        emu = self._emu
        thread = emu.channels.pop(thread_id)
        data = {"id": str(thread_id), "guild_id": thread["guild_id"],
                "parent_id": thread["parent_id"], "type": thread["type"]}
        await self.dispatch("THREAD_DELETE", data, guild_id=int(thread["guild_id"]))

    async def thread_list_sync(self, guild_id: int, channel_ids: Iterable[int]) -> None:
        """The bot gained access to channels: their active threads (Topics › Threads ›
        Gaining Access to Channels)."""
        emu = self._emu
        wanted = {str(c) for c in channel_ids}
        threads = [emu.thread_payload(i, for_user=emu.bot_id) for i, c in emu.channels.items()
                   if c.get("parent_id") in wanted and not c["thread_metadata"]["archived"]
                   and emu.can_view(i, emu.bot_id)]
        members = [t.pop("member") for t in threads if "member" in t]
        await self.dispatch("THREAD_LIST_SYNC", {
            "guild_id": str(guild_id), "channel_ids": sorted(wanted), "threads": threads,
            "members": members}, guild_id=guild_id)

    async def thread_members_update(self, thread_id: int, *, added: Iterable[int] = (),
                                    removed: Iterable[int] = ()) -> None:
        """Members joined or left a thread (`join_thread`): THREAD_MEMBERS_UPDATE; the bot
        added to a private thread also gets THREAD_CREATE, so it knows the thread."""
        emu = self._emu
        added, removed = list(added), list(removed)
        guild_id = emu.guild_of(thread_id)
        if emu.bot_id in added and emu.channels[thread_id]["type"] == PRIVATE_THREAD:
            await self.dispatch("THREAD_CREATE", emu.thread_payload(thread_id,
                                                                   for_user=emu.bot_id),
                                guild_id=guild_id)
        await self.dispatch("THREAD_MEMBERS_UPDATE", {
            "id": str(thread_id), "guild_id": str(guild_id),
            "member_count": len(emu.thread_members[thread_id]),
            "added_members": [emu.thread_member_payload(thread_id, u) for u in added],
            "removed_member_ids": [str(u) for u in removed]}, guild_id=guild_id)

    async def typing_start(self, channel_id: int, user_id: int) -> None:
        """A user types (GUILD_MESSAGE_TYPING / DIRECT_MESSAGE_TYPING)."""
        emu = self._emu
        guild_id = emu.guild_of(channel_id)
        data: JsonDict = {"channel_id": str(channel_id), "user_id": str(user_id),
                          "timestamp": int(emu.wall_clock())}
        if guild_id is not None:
            data.update(guild_id=str(guild_id),
                        member=emu.member_payload(user_id, guild_id, with_user=True))
        await self.dispatch("TYPING_START", data, guild_id=guild_id)

    async def voice_state_update(self, user_id: int, channel_id: int | None,
                                 guild_id: int | None = None) -> None:
        """A member joins (or, with None, leaves) a voice channel (GUILD_VOICE_STATES)."""
        emu = self._emu
        guild_id = guild_id if guild_id is not None else emu.guild_id
        await self.dispatch("VOICE_STATE_UPDATE", {
            "guild_id": str(guild_id), "channel_id": str(channel_id) if channel_id else None,
            "user_id": str(user_id),
            "member": emu.member_payload(user_id, guild_id, with_user=True),
            "session_id": f"voice-{emu.next_id()}", "deaf": False, "mute": False,
            "self_deaf": False, "self_mute": False, "self_video": False, "suppress": False,
            "request_to_speak_timestamp": None}, guild_id=guild_id)

    async def poll_vote_add(self, channel_id: int, message_id: int, user_id: int,
                            answer_id: int = 1) -> None:
        """A user votes in a poll (GUILD_MESSAGE_POLLS / DIRECT_MESSAGE_POLLS)."""
        guild_id = self._emu.guild_of(channel_id)
        data: JsonDict = {"user_id": str(user_id), "channel_id": str(channel_id),
                          "message_id": str(message_id), "answer_id": answer_id}
        if guild_id is not None:
            data["guild_id"] = str(guild_id)
        await self.dispatch("MESSAGE_POLL_VOTE_ADD", data, guild_id=guild_id)

    # ---- faults --------------------------------------------------------------------------

    async def drop(self, shard_id: int = 0) -> None:
        """Lose the shard's TCP connection (no close frame): the client should RESUME."""
        connection = self._connection_of(shard_id)
        connection.closed = True
        transport = connection.request.transport
        if transport is not None:
            transport.abort()
        await self._detach(connection)

    async def close(self, shard_id: int, code: int) -> None:
        """Close the shard's connection with a close code (4007 and 4009 end its session)."""
        await self._close(self._connection_of(shard_id), code)

    async def invalidate_session(self, shard_id: int = 0, *, resumable: bool = False) -> None:
        """Send INVALID_SESSION; unless `resumable`, the session is gone and the client must
        IDENTIFY anew."""
        connection = self._connection_of(shard_id)
        if not resumable and connection.session is not None:
            self._end(connection.session)
        await connection.send({"op": INVALID_SESSION, "d": resumable})

    async def request_reconnect(self, shard_id: int = 0) -> None:
        """Send RECONNECT (op 7): the client closes and resumes."""
        await self._connection_of(shard_id).send({"op": RECONNECT, "d": None})

    def stop_acking(self, shard_id: int = 0) -> None:
        """Make the shard's connection a zombie: heartbeats go unanswered and nothing more
        arrives on it; dispatches wait in the session for the RESUME."""
        self._connection_of(shard_id).zombie = True

    def _connection_of(self, shard_id: int) -> _Connection:
        session = self.live_session(shard_id)
        if session is None or session.connection is None:
            raise LookupError(f"shard {shard_id} is not connected")
        return session.connection

    def _end(self, session: Session) -> None:
        """The session is over: what it had not delivered is lost."""
        if session.invalid:
            return
        session.invalid = True
        delivered = session.connection.delivered if session.connection is not None else 0
        delivered = max(delivered, self._last_delivered(session))
        session.lost = [(seq, name) for seq, name, _ in session.events if seq > delivered]

    def _last_delivered(self, session: Session) -> int:
        return max((c.delivered for c in self._connections if c.session is session), default=0)

    # ---- the websocket -------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        connection = _Connection(len(self._connections) + 1, ws, request,
                                 compressor_for(request.query.get("compress")), self._emu.now)
        self._connections.append(connection)
        if request.query.get("v", API_VERSION) != API_VERSION:
            await self._close(connection, INVALID_API_VERSION)
            return ws
        connection.last_beat = self._emu.now()
        await connection.send({"op": HELLO, "s": None, "t": None,
                               "d": {"heartbeat_interval": self.heartbeat_interval_ms}})
        connection.watchdog = asyncio.create_task(
            self._watch_heartbeats(connection), name=f"gateway-watchdog:{connection.number}")
        try:
            async for message in ws:
                if connection.closed:
                    break
                if message.type is not WSMsgType.TEXT:
                    continue
                try:
                    payload = json.loads(message.data)
                except ValueError:
                    await self._close(connection, DECODE_ERROR)
                    break
                await self._received(connection, payload)
        finally:
            await self._detach(connection)
        return ws

    async def _watch_heartbeats(self, connection: _Connection) -> None:
        """Close a connection whose client stopped beating (Topics › Gateway › Sending
        Heartbeats: "your connection will be closed"). The gateway never asks for beats."""
        interval = self.heartbeat_interval_ms / 1000
        allowed = interval * (1 + HEARTBEAT_GRACE)
        while not connection.closed:
            deadline = connection.last_beat + allowed
            now = self._emu.now()
            if now >= deadline:
                if connection.zombie:  # a zombie hears nothing; the client finds out itself
                    return
                await self._close(connection, NORMAL_CLOSURE)
                return
            await asyncio.sleep(deadline - now)

    async def _received(self, connection: _Connection, payload: Any) -> None:
        op = payload.get("op") if isinstance(payload, dict) else None
        data = payload.get("d") if isinstance(payload, dict) else None
        session = connection.session
        if session is None and op == RESUME and isinstance(data, dict):
            session = self.sessions.get(str(data.get("session_id")))
        now = self._emu.now()
        self.received.append(ReceivedPayload(
            connection.number, session.shard_id if session else shard_in(data),
            int(op) if isinstance(op, int) else -1, data, now))
        if connection.zombie:
            return
        if op not in CLIENT_OPCODES:
            await self._close(connection, UNKNOWN_OPCODE)
        elif op == HEARTBEAT:
            connection.last_beat = now
            if connection.session is not None:
                connection.session.heard_at = now
            await connection.send({"op": HEARTBEAT_ACK, "d": None})
        elif op == IDENTIFY:
            await self._identify(connection, data if isinstance(data, dict) else {})
        elif op == RESUME:
            await self._resume(connection, data if isinstance(data, dict) else {})
        elif connection.session is None:
            await self._close(connection, NOT_AUTHENTICATED)
        elif op == REQUEST_GUILD_MEMBERS:
            await self._members_chunk(connection.session, data or {})
        if connection.session is not None:
            connection.session.heard_at = now
        await self._notify()

    async def _members_chunk(self, session: Session, data: JsonDict) -> None:
        """Every member in one chunk (the emulated guilds are small)."""
        emu = self._emu
        guild_id = int(data["guild_id"])
        members = [emu.member_payload(u, guild_id, with_user=True)
                   for u in emu.guilds[guild_id]["members"]]
        chunk: JsonDict = {"guild_id": str(guild_id), "members": members,
                           "chunk_index": 0, "chunk_count": 1}
        if data.get("nonce") is not None:
            chunk["nonce"] = data["nonce"]
        await self._send_event(session, "GUILD_MEMBERS_CHUNK", chunk)

    async def _identify(self, connection: _Connection, data: JsonDict) -> None:
        emu = self._emu
        if connection.session is not None:
            await self._close(connection, ALREADY_AUTHENTICATED)
            return
        if data.get("token") != self._accepted_token():
            await self._close(connection, AUTHENTICATION_FAILED)
            return
        intents = int(data.get("intents") or 0)
        if intents & ~VALID_INTENTS:
            await self._close(connection, INVALID_INTENTS)
            return
        if intents & PRIVILEGED_INTENTS & ~self.granted_intents:
            await self._close(connection, DISALLOWED_INTENTS)
            return
        shard_id, shard_count = data.get("shard") or [0, 1]
        if not 0 <= shard_id < shard_count:
            await self._close(connection, INVALID_SHARD)
            return
        guilds = [g for g in emu.guilds if (g >> 22) % shard_count == shard_id]
        if len(guilds) > self.max_guilds_per_shard:
            await self._close(connection, SHARDING_REQUIRED)
            return
        now = emu.now()
        key = shard_id % self.max_concurrency
        if now - self._identify_keys.get(key, float("-inf")) < IDENTIFY_WINDOW_S:
            await connection.send({"op": INVALID_SESSION, "d": False})
            return
        self._forget_identifies(now)
        if len(self.identifies) >= SESSION_STARTS_PER_DAY:
            await self._revoke_token()
            return
        self._identify_keys[key] = now
        self.identifies.append(now)
        if shard_count != self.shards:
            self.shards = shard_count
        session = Session(f"emulated-session-{emu.next_id()}", shard_id, shard_count,
                          intents, connection=connection, heard_at=now)
        self.sessions[session.session_id] = session
        connection.session = session
        await self._send_event(session, "READY", {
            "v": 10, "user": emu.bot, "session_id": session.session_id,
            "resume_gateway_url": self.resume_url, "shard": [shard_id, shard_count],
            "guilds": [{"id": str(g), "unavailable": True} for g in guilds],
            "application": {"id": str(emu.application_id), "flags": 0},
            "private_channels": [], "relationships": [], "presences": [],
            "guild_join_requests": [], "geo_ordered_rtc_regions": ["emulated"],
            "user_settings": {}, "auth": {},
        })
        for guild_id in guilds:
            if session.intents & GUILDS:
                await self._send_event(session, "GUILD_CREATE", guild_create(emu, guild_id))

    async def _revoke_token(self) -> None:
        """The 1,001st IDENTIFY of a day: every session ends and the token is reset
        (Topics › Gateway › Identifying)."""
        self.token = f"reset-{self._emu.next_id()}"
        for connection in list(self._connections):
            if not connection.closed:
                await self._close(connection, AUTHENTICATION_FAILED)

    def _forget_identifies(self, now: float) -> None:
        while self.identifies and self.identifies[0] <= now - DAY_S:
            self.identifies.popleft()

    async def _resume(self, connection: _Connection, data: JsonDict) -> None:
        if data.get("token") != self._accepted_token():
            await self._close(connection, AUTHENTICATION_FAILED)
            return
        session = self.sessions.get(str(data.get("session_id")))
        now = self._emu.now()
        if session is not None and not session.invalid and \
                now - session.heard_at > self.session_timeout_s:
            self._end(session)  # its client was silent too long: the session timed out
        if session is None or session.invalid:
            await connection.send({"op": INVALID_SESSION, "d": False})
            return
        seq = int(data.get("seq") or 0)
        if seq > session.seq:
            connection.session = session
            await self._close(connection, INVALID_SEQ)
            return
        previous = session.connection
        if previous is not None and previous is not connection:
            previous.closed = True
        session.connection = connection
        session.heard_at = now
        connection.session = session
        session.resumes += 1
        for event_seq, name, event in session.missed_since(seq):
            await connection.send({"op": DISPATCH, "s": event_seq, "t": name, "d": event})
        await self._send_event(session, "RESUMED", {})

    async def _send_event(self, session: Session, name: str, data: JsonDict) -> None:
        if self._emu.validate:
            self._emu.spec_violations.extend(event_violations(name, data))
        session.seq += 1
        session.events.append((session.seq, name, data))
        self.delivered[name] += 1
        if session.connection is not None:
            await session.connection.send({"op": DISPATCH, "s": session.seq, "t": name,
                                           "d": data})
        await self._notify()

    async def _close(self, connection: _Connection, code: int) -> None:
        self.closes.append((connection.number, code))
        if code in SESSION_ENDING_CLOSES and connection.session is not None:
            self._end(connection.session)
        connection.closed = True
        await connection.ws.close(code=code, message=CLOSE_REASONS.get(code, "").encode())
        await self._detach(connection)

    async def _detach(self, connection: _Connection) -> None:
        connection.closed = True
        watchdog = connection.watchdog
        if watchdog is not None and watchdog is not asyncio.current_task():
            watchdog.cancel()
        session = connection.session
        if session is not None and session.connection is connection:
            session.connection = None
        await self._notify()

    async def aclose(self) -> None:
        """Close every connection (the emulator stopping)."""
        for connection in self._connections:
            if not connection.closed:
                connection.closed = True
                if connection.watchdog is not None:
                    connection.watchdog.cancel()
                await connection.ws.close(code=1001)

    # ---- payloads ------------------------------------------------------------------------

    def _accepted_token(self) -> str:
        return self.token if self.token is not None else self._emu.token

    def _as_intents_allow(self, message: JsonDict, intents: int) -> JsonDict:
        """Without MESSAGE_CONTENT, Discord blanks content, embeds, attachments and
        components of guild messages that neither mention the bot nor are its own."""
        if intents & MESSAGE_CONTENT or "guild_id" not in message:
            return message
        bot_id = str(self._emu.bot_id)
        mentioned = any(u.get("id") == bot_id for u in message["mentions"])
        if mentioned or message["author"]["id"] == bot_id:
            return message
        return {**message, "content": "", "embeds": [], "attachments": [], "components": []}

