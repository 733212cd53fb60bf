"""The Discord gateway on loopback, beside the REST emulator, for `client.start()`.

`GET /gateway/bot` points discord.py here. Each connection gets HELLO; IDENTIFY is checked
(token: close 4004; privileged intents the application was not granted: close 4014; shard:
close 4010) and answered with READY and one GUILD_CREATE per guild of the shard (channels,
members, the @everyone role). Dispatches (MESSAGE_CREATE, MESSAGE_REACTION_ADD,
INTERACTION_CREATE, GUILD_ROLE_CREATE, CHANNEL_CREATE, ...) go to the shard that owns the
guild, `(guild_id >> 22) % shards` (DMs: shard 0), and only when the session's intents ask for
them; without MESSAGE_CONTENT a message that does not mention the bot arrives with its content
blanked, as Discord does it.

Heartbeats run in loop time: discord.py's own heartbeat thread keeps real time, so the gateway
asks for a beat (op 1) every heartbeat interval of the loop's clock and acknowledges each beat
(op 11); under looptime a long test keeps its session alive instead of tripping discord.py's
receive timeout. Faults: `drop` (the TCP connection lost), `invalidate_session`,
`stop_acking` (a zombie connection: no ACK, nothing at all), and the close codes above. Every
dispatch is kept per session so a RESUME with the session id and sequence replays what the
client missed, then RESUMED.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import WSMsgType, web

from .objects import role_object
from .spec_validation import SpecViolation, shared_validator

JsonDict = dict[str, Any]


class EmulatedWorld(Protocol):
    """What the gateway reads and seeds of the emulator's world (`DiscordEmulator` is one)."""

    token: str
    validate: bool
    bot: JsonDict
    bot_id: int
    application_id: int
    guild_id: int
    channel_id: int
    alice_id: int
    users: dict[int, JsonDict]
    guilds: dict[int, JsonDict]
    channels: dict[int, JsonDict]
    messages: dict[int, dict[int, JsonDict]]
    roles: dict[int, JsonDict]
    spec_violations: list[SpecViolation]

    def now(self) -> float: ...

    def next_id(self) -> int: ...

    def timestamp_of(self, snowflake: int) -> str: ...

    def add_message(self, channel_id: int, author_id: int, content: str, *,
                    mentions: Iterable[int] = (), reply_to: int | None = None,
                    attachments: Iterable[JsonDict] = ()) -> JsonDict: ...

    def add_reaction(self, message_id: int, emoji: str, user_id: int) -> None: ...

    def member_payload(self, user_id: int) -> JsonDict: ...

    def slash_command_payload(self, name: str, *, channel_id: int | None = None,
                              user_id: int | None = None, guild: bool = True,
                              permissions: int = 0) -> JsonDict: ...

GATEWAY_PATH = "/gateway-ws"
HEARTBEAT_INTERVAL_MS = 41_250

# Gateway opcodes (Discord: Topics > Opcodes and Status Codes).
DISPATCH, HEARTBEAT, IDENTIFY, PRESENCE_UPDATE, VOICE_STATE_UPDATE = 0, 1, 2, 3, 4
RESUME, RECONNECT, REQUEST_GUILD_MEMBERS, INVALID_SESSION, HELLO, HEARTBEAT_ACK = (
    6, 7, 8, 9, 10, 11)

# Close codes the emulator sends.
AUTHENTICATION_FAILED = 4004
ALREADY_AUTHENTICATED = 4005
INVALID_SHARD = 4010
DISALLOWED_INTENTS = 4014

# Intents (Topics > Gateway > Gateway Intents).
GUILDS = 1 << 0
GUILD_MEMBERS = 1 << 1
GUILD_PRESENCES = 1 << 8
GUILD_MESSAGES = 1 << 9
GUILD_MESSAGE_REACTIONS = 1 << 10
DIRECT_MESSAGES = 1 << 12
DIRECT_MESSAGE_REACTIONS = 1 << 13
MESSAGE_CONTENT = 1 << 15
PRIVILEGED_INTENTS = GUILD_MEMBERS | GUILD_PRESENCES | MESSAGE_CONTENT

_NEEDS = {  # event: (intent in a guild, intent in a DM); 0 = always delivered
    "MESSAGE_CREATE": (GUILD_MESSAGES, DIRECT_MESSAGES),
    "MESSAGE_REACTION_ADD": (GUILD_MESSAGE_REACTIONS, DIRECT_MESSAGE_REACTIONS),
    "GUILD_CREATE": (GUILDS, GUILDS),
    "INTERACTION_CREATE": (0, 0),
    "GUILD_ROLE_CREATE": (GUILDS, GUILDS),
    "CHANNEL_CREATE": (GUILDS, GUILDS),
    "GUILD_MEMBER_UPDATE": (GUILD_MEMBERS, GUILD_MEMBERS),
}


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

    def missed_since(self, seq: int) -> list[tuple[int, str, JsonDict]]:
        return [event for event in self.events if event[0] > seq]


@dataclass(slots=True)
class _Connection:
    number: int
    ws: web.WebSocketResponse
    request: web.Request
    compressor: Any | None
    clock: Callable[[], float]
    session: Session | None = None
    zombie: bool = False
    closed: bool = False
    last_sent: float = 0.0
    heartbeats: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

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
                    data = self.compressor.compress(text.encode()) + self.compressor.flush(
                        zlib.Z_SYNC_FLUSH)
                    await self.ws.send_bytes(data)
            except (ConnectionError, RuntimeError):
                self.closed = True


class Gateway:
    """The gateway half of a `DiscordEmulator` (reach it as ``emulator.gateway``)."""

    def __init__(self, emulator: EmulatedWorld) -> None:
        self._emu = emulator
        self.token: str | None = None
        """The token IDENTIFY must carry; None: the emulator's (set another to get 4004)."""
        self.granted_intents = MESSAGE_CONTENT
        """Privileged intents the application may ask for (others: close 4014)."""
        self.shards = 1
        """The shard count GET /gateway/bot recommends."""
        self.heartbeat_interval_ms = HEARTBEAT_INTERVAL_MS
        self.sessions: dict[str, Session] = {}
        self.received: list[ReceivedPayload] = []
        self.closes: list[tuple[int, int]] = []
        """(connection, close code) for each close the gateway sent."""
        self.undelivered: list[tuple[str, JsonDict]] = []
        """Dispatches with no session to take them (the shard not connected)."""
        self._connections: list[_Connection] = []
        self._changed: asyncio.Condition | None = None
        self.url = ""

    # ---- wiring --------------------------------------------------------------------------

    def bind(self, base: str) -> None:
        """Called by the emulator once it listens: `base` is ``http://host:port``."""
        self.url = "ws" + base.removeprefix("http") + GATEWAY_PATH
        self._changed = asyncio.Condition()

    def bot_gateway(self) -> JsonDict:
        """The body of GET /gateway/bot."""
        return {"url": self.url, "shards": self.shards,
                "session_start_limit": {"total": 1000, "remaining": 1000,
                                        "reset_after": 86_400_000, "max_concurrency": 1}}

    def shard_of(self, guild_id: int | None) -> int:
        """Discord's rule: `(guild_id >> 22) % num_shards`; DMs go to shard 0."""
        return 0 if guild_id is None else (guild_id >> 22) % self.shards

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
        for the event never gets it, as on Discord."""
        session = self.live_session(self.shard_of(guild_id))
        if session is None:
            self.undelivered.append((name, data))
            return False
        guild_need, dm_need = _NEEDS.get(name, (0, 0))
        need = guild_need if guild_id is not None else dm_need
        if need and not session.intents & need:
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
        `attachments` are `add_attachment` results."""
        message = self._emu.add_message(channel_id, author_id, content, mentions=mentions,
                                        reply_to=reply_to, attachments=attachments)
        guild_id = self._guild_of(channel_id)
        event = dict(message)
        if guild_id is not None:
            event["member"] = self._member(author_id, with_user=False)
        await self.dispatch("MESSAGE_CREATE", event, guild_id=guild_id)
        return message

    async def reaction_add(self, channel_id: int, message_id: int, emoji: str,
                           user_id: int) -> None:
        """A user reacts (`emoji` in route form: a unicode emoji or `name:id`)."""
        self._emu.add_reaction(message_id, emoji, user_id)
        name, sep, emoji_id = emoji.partition(":")
        stored = self._emu.messages[channel_id].get(message_id)
        data: JsonDict = {
            "user_id": str(user_id), "channel_id": str(channel_id),
            "message_id": str(message_id), "emoji": {"id": emoji_id or None, "name": name},
            "burst": False, "type": 0,
        }
        if sep == "":
            data["emoji"] = {"id": None, "name": emoji}
        if stored is not None:
            data["message_author_id"] = stored["author"]["id"]
        guild_id = self._guild_of(channel_id)
        if guild_id is not None:
            data["guild_id"] = str(guild_id)
            data["member"] = self._member(user_id, with_user=True)
        await self.dispatch("MESSAGE_REACTION_ADD", data, guild_id=guild_id)

    async def interaction(self, name: str, *, channel_id: int | None = None,
                          user_id: int | None = None, permissions: int = 0) -> JsonDict:
        """A user runs the synced slash command `name`; returns the interaction payload.

        In a guild channel it carries `guild_id` and the user's `member`: their roles from
        `member_roles`, `permissions` their permissions in the channel (e.g. MANAGE_MESSAGES,
        1 << 13). In a DM channel it carries `user` instead and no guild, as Discord sends
        it (`permissions` does not apply), and goes to shard 0."""
        in_guild = self._guild_of(
            channel_id if channel_id is not None else self._emu.channel_id) is not None
        payload = self._emu.slash_command_payload(name, channel_id=channel_id, user_id=user_id,
                                                  guild=in_guild, permissions=permissions)
        guild = payload.get("guild_id")
        await self.dispatch("INTERACTION_CREATE", payload,
                            guild_id=int(guild) if guild is not None else None)
        return payload

    async def role_create(self, role_id: int) -> None:
        """An administrator creates a role (`add_role`) while the bot is connected:
        GUILD_ROLE_CREATE to the emulated guild's shard, so the client knows the role its
        members' `roles` name."""
        data: JsonDict = {"guild_id": str(self._emu.guild_id), "role": self._emu.roles[role_id]}
        await self.dispatch("GUILD_ROLE_CREATE", data, guild_id=self._emu.guild_id)

    async def member_update(self, user_id: int, guild_id: int | None = None) -> None:
        """A member's roles changed (`member_roles`): GUILD_MEMBER_UPDATE to the guild's
        shard, which only sessions with the privileged GUILD_MEMBERS intent receive
        (Gateway Events > Guild Member Update; Gateway Intents)."""
        guild = guild_id if guild_id is not None else self._emu.guild_id
        member = self._member(user_id, with_user=True)
        data: JsonDict = {"guild_id": str(guild), "roles": member["roles"],
                          "user": member["user"], "nick": None, "avatar": None,
                          "joined_at": member["joined_at"], "premium_since": None,
                          "deaf": False, "mute": False, "pending": False,
                          "communication_disabled_until": None, "flags": 0}
        await self.dispatch("GUILD_MEMBER_UPDATE", data, guild_id=guild)

    async def channel_create(self, channel_id: int) -> None:
        """An administrator creates a guild channel (`add_text_channel`) while the bot is
        connected: CHANNEL_CREATE to the guild's shard."""
        channel = self._emu.channels[channel_id]
        guild_id = self._guild_of(channel_id)
        if guild_id is None:
            raise ValueError("CHANNEL_CREATE is for guild channels (a DM needs none)")
        await self.dispatch("CHANNEL_CREATE", channel, guild_id=guild_id)

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
        """Close the shard's connection with a close code."""
        connection = self._connection_of(shard_id)
        await self._close(connection, code)

    async def invalidate_session(self, shard_id: int = 0, *, resumable: bool = False) -> None:
        """Send INVALID_SESSION; unless `resumable`, the session is gone and the client must
        IDENTIFY anew."""
        connection = self._connection_of(shard_id)
        if not resumable and connection.session is not None:
            connection.session.invalid = True
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

    # ---- the websocket -------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        compressed = request.query.get("compress") == "zlib-stream"
        connection = _Connection(len(self._connections) + 1, ws, request,
                                 zlib.compressobj() if compressed else None, self._emu.now)
        self._connections.append(connection)
        await connection.send({"op": HELLO, "s": None, "t": None,
                               "d": {"heartbeat_interval": self.heartbeat_interval_ms}})
        connection.heartbeats = asyncio.create_task(self._ask_for_heartbeats(connection),
                                                    name=f"gateway-heartbeats:{connection.number}")
        try:
            async for message in ws:
                if message.type is not WSMsgType.TEXT or connection.closed:
                    continue
                await self._received(connection, json.loads(message.data))
        finally:
            await self._detach(connection)
        return ws

    async def _ask_for_heartbeats(self, connection: _Connection) -> None:
        """Discord may ask for a beat at any time (op 1); asking once per interval keeps the
        exchange on the loop's clock."""
        while not connection.closed:
            await asyncio.sleep(self.heartbeat_interval_ms / 1000)
            await connection.send({"op": HEARTBEAT, "d": None})

    async def _received(self, connection: _Connection, payload: JsonDict) -> None:
        op, data = payload.get("op"), payload.get("d")
        session = connection.session
        if session is None and op == RESUME and isinstance(data, dict):
            session = self.sessions.get(str(data.get("session_id")))
        self.received.append(ReceivedPayload(
            connection.number, session.shard_id if session else _shard_in(data), int(op or 0),
            data, self._emu.now()))
        if op == HEARTBEAT:
            await connection.send({"op": HEARTBEAT_ACK, "d": None})
        elif op == IDENTIFY:
            await self._identify(connection, data or {})
        elif op == RESUME:
            await self._resume(connection, data or {})
        elif op == REQUEST_GUILD_MEMBERS and connection.session is not None:
            await self._members_chunk(connection.session, data or {})
        await self._notify()

    async def _members_chunk(self, session: Session, data: JsonDict) -> None:
        """Every member in one chunk (the emulated guilds are small)."""
        guild_id = int(data["guild_id"])
        members = [self._member(u, with_user=True) for u in self._emu.guilds[guild_id]["members"]]
        chunk: JsonDict = {"guild_id": str(guild_id), "members": members,
                           "chunk_index": 0, "chunk_count": 1}
        if data.get("nonce") is not None:
            chunk["nonce"] = data["nonce"]
        await self._send_event(session, "GUILD_MEMBERS_CHUNK", chunk)

    async def _identify(self, connection: _Connection, data: JsonDict) -> None:
        if connection.session is not None:
            await self._close(connection, ALREADY_AUTHENTICATED)
            return
        if data.get("token") != self._accepted_token():
            await self._close(connection, AUTHENTICATION_FAILED)
            return
        intents = int(data.get("intents") or 0)
        if intents & PRIVILEGED_INTENTS & ~self.granted_intents:
            await self._close(connection, DISALLOWED_INTENTS)
            return
        shard_id, shard_count = data.get("shard") or [0, 1]
        if not 0 <= shard_id < shard_count:
            await self._close(connection, INVALID_SHARD)
            return
        if shard_count != self.shards:
            self.shards = shard_count
        session = Session(f"emulated-session-{self._emu.next_id()}", shard_id, shard_count,
                          intents, connection=connection)
        self.sessions[session.session_id] = session
        connection.session = session
        guilds = [g for g in self._emu.guilds if self.shard_of(g) == shard_id]
        await self._send_event(session, "READY", {
            "v": 10, "user": self._emu.bot, "session_id": session.session_id,
            "resume_gateway_url": self.url, "shard": [shard_id, shard_count],
            "guilds": [{"id": str(g), "unavailable": True} for g in guilds],
            "application": {"id": str(self._emu.application_id), "flags": 0},
            "private_channels": [], "relationships": [], "presences": [],
            "guild_join_requests": [], "geo_ordered_rtc_regions": ["emulated"],
            "user_settings": {}, "auth": {},
        })
        for guild_id in guilds:
            if session.intents & GUILDS:
                await self._send_event(session, "GUILD_CREATE", self._guild_create(guild_id))

    async def _resume(self, connection: _Connection, data: JsonDict) -> None:
        if data.get("token") != self._accepted_token():
            await self._close(connection, AUTHENTICATION_FAILED)
            return
        session = self.sessions.get(str(data.get("session_id")))
        if session is None or session.invalid:
            await connection.send({"op": INVALID_SESSION, "d": False})
            return
        previous = session.connection
        if previous is not None and previous is not connection:
            previous.closed = True
        session.connection = connection
        connection.session = session
        session.resumes += 1
        for seq, name, event in session.missed_since(int(data.get("seq") or 0)):
            await connection.send({"op": DISPATCH, "s": seq, "t": name, "d": event})
        await self._send_event(session, "RESUMED", {})

    async def _send_event(self, session: Session, name: str, data: JsonDict) -> None:
        if self._emu.validate:
            self._emu.spec_violations.extend(_event_violations(name, data))
        session.seq += 1
        session.events.append((session.seq, name, data))
        if session.connection is not None:
            await session.connection.send({"op": DISPATCH, "s": session.seq, "t": name,
                                           "d": data})
        await self._notify()

    async def _close(self, connection: _Connection, code: int) -> None:
        self.closes.append((connection.number, code))
        connection.closed = True
        await connection.ws.close(code=code, message=_CLOSE_REASONS.get(code, "").encode())
        await self._detach(connection)

    async def _detach(self, connection: _Connection) -> None:
        connection.closed = True
        if connection.heartbeats is not None:
            connection.heartbeats.cancel()
        session = connection.session
        if session is not None and session.connection is connection:
            session.connection = None
        await self._notify()

    async def aclose(self) -> None:
        """Close every connection (the emulator stopping)."""
        for connection in self._connections:
            if not connection.closed:
                connection.closed = True
                if connection.heartbeats is not None:
                    connection.heartbeats.cancel()
                await connection.ws.close(code=1001)

    # ---- payloads ------------------------------------------------------------------------

    def _accepted_token(self) -> str:
        return self.token if self.token is not None else self._emu.token

    def _guild_of(self, channel_id: int) -> int | None:
        guild = self._emu.channels.get(channel_id, {}).get("guild_id")
        return int(guild) if guild is not None else None

    def _member(self, user_id: int, *, with_user: bool) -> JsonDict:
        member = self._emu.member_payload(user_id)  # with the roles given in `member_roles`
        if with_user:
            member["user"] = self._emu.users[user_id]
        return member

    def _guild_create(self, guild_id: int) -> JsonDict:
        guild = self._emu.guilds[guild_id]
        members = [self._member(u, with_user=True) for u in guild["members"]]
        channels = [c for c in self._emu.channels.values()
                    if c.get("guild_id") == str(guild_id)]
        everyone = role_object(guild_id, "@everyone", _EVERYONE, position=0)
        roles = [everyone, *self._emu.roles.values()] if guild_id == self._emu.guild_id else [
            everyone]
        return {
            "id": str(guild_id), "name": guild["name"], "icon": None, "owner_id":
            str(self._emu.alice_id), "unavailable": False, "member_count": len(members),
            "large": False, "joined_at": self._emu.timestamp_of(guild_id),
            "roles": roles, "emojis": [], "stickers": [], "features": [],
            "channels": channels, "threads": [], "members": members, "voice_states": [],
            "presences": [], "stage_instances": [], "guild_scheduled_events": [],
            "soundboard_sounds": [], "verification_level": 0,
            "default_message_notifications": 0, "explicit_content_filter": 0,
            "mfa_level": 0, "nsfw_level": 0, "premium_tier": 0, "preferred_locale": "en-US",
            "system_channel_flags": 0, "afk_timeout": 300, "application_id": None,
            "system_channel_id": None, "rules_channel_id": None, "vanity_url_code": None,
            "description": None, "banner": None, "splash": None, "discovery_splash": None,
        }

    def _as_intents_allow(self, message: JsonDict, intents: int) -> JsonDict:
        """Without MESSAGE_CONTENT, Discord blanks content, embeds, attachments and
        components of guild messages that neither mention the bot nor are its own."""
        if intents & MESSAGE_CONTENT or "guild_id" not in message:
            return message
        mentioned = any(u.get("id") == str(self._emu.bot_id) for u in message["mentions"])
        if mentioned or message["author"]["id"] == str(self._emu.bot_id):
            return message
        return {**message, "content": "", "embeds": [], "attachments": [], "components": []}


# VIEW_CHANNEL | SEND_MESSAGES | EMBED_LINKS | ATTACH_FILES | READ_MESSAGE_HISTORY |
# ADD_REACTIONS | USE_APPLICATION_COMMANDS: what the bot needs in the emulated guild.
_EVERYONE = (1 << 10) | (1 << 11) | (1 << 14) | (1 << 15) | (1 << 16) | (1 << 6) | (1 << 31)

_CLOSE_REASONS = {
    AUTHENTICATION_FAILED: "Authentication failed.",
    ALREADY_AUTHENTICATED: "Already authenticated.",
    INVALID_SHARD: "Invalid shard.",
    DISALLOWED_INTENTS: "Disallowed intent(s).",
}


def _event_violations(name: str, data: JsonDict) -> list[SpecViolation]:
    """The objects inside an event, held to the schemas REST returns them with."""
    validator = shared_validator()
    where = f"gateway {name}"
    if name == "MESSAGE_CREATE":
        return validator.check_object("MessageResponse", data, where=where)
    if name == "CHANNEL_CREATE":
        return validator.check_object("GuildChannelResponse", data, where=where)
    if name == "READY":
        return validator.check_object("UserResponse", data["user"], where=where)
    if name == "GUILD_ROLE_CREATE":
        return validator.check_object("GuildRoleResponse", data["role"], where=where)
    if name == "GUILD_CREATE":
        found = [v for channel in data["channels"]
                 for v in validator.check_object("GuildChannelResponse", channel, where=where)]
        found += [v for role in data["roles"]
                  for v in validator.check_object("GuildRoleResponse", role, where=where)]
        return found + [v for member in data["members"]
                        for v in validator.check_object("UserResponse", member["user"],
                                                        where=where)]
    return []


def _shard_in(data: Any) -> int | None:
    if isinstance(data, dict) and isinstance(data.get("shard"), list):
        return int(data["shard"][0])
    return None
