"""A Discord REST emulator on loopback.

Real discord.py logs in to it (``Route.BASE`` points here, no gateway), so tests exercise the
library's own request building, rate-limit handling and payload parsing instead of mocks.
Every request is recorded for assertions, and faults (429 with ``retry_after``, per route or
global, 5xx, 403, delays) can be scripted per route. Time comes from the running loop's
clock, so delays and rate-limit windows fast-forward under ``looptime``.

By default every request and every answer is validated against Discord's own OpenAPI spec
(`spec_validation`); violations are collected in ``spec_violations`` and raised as a
`SpecViolationError` when the emulator stops, so the test that caused one fails. The gateway
(`gateway`) is served from the same port. docs/emulator.md describes the whole surface.

Discord quirks it reproduces: JSON responses carry ``Content-Type: application/json`` with
no charset (discord.py compares it exactly), a 429 carries a ``Via`` header (without one
discord.py assumes a Cloudflare ban), and optional keys are omitted rather than null.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import json
import math
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import discord
import yarl
from aiohttp import web
from aiohttp.typedefs import Handler

from .gateway import GATEWAY_PATH, Gateway
from .objects import role_object
from .spec_validation import SpecViolation, SpecViolationError, shared_validator

JsonDict = dict[str, Any]

API_PREFIX = "/api/v10"
CDN_PREFIX = "/cdn"
DISCORD_EPOCH_MS = 1_420_070_400_000
START_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z: emulated wall clock at loop time 0
DEFAULT_TOKEN = "emulator-token.not-a-real-secret"
MAX_CONTENT = 2000
MAX_EMBED_TITLE = 256
MAX_EMBED_DESCRIPTION = 4096

SEND_MESSAGE = "POST /channels/{channel_id}/messages"

_BODY = web.RequestKey("emu_body", object)
_FILES = web.RequestKey("emu_files", list)


def _embed_payload(embed: JsonDict) -> JsonDict:
    """An embed as Discord returns it: it always says its type."""
    return embed if "type" in embed else {"type": "rich", **embed}


def _json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """JSON with the exact content type discord.py expects (no charset suffix)."""
    all_headers = {"Content-Type": "application/json"}
    all_headers.update(headers or {})
    return web.Response(
        status=status, body=json.dumps(payload).encode("utf-8"), headers=all_headers
    )


def _error(status: int, code: int, message: str, **extra: Any) -> web.Response:
    return _json_response({"code": code, "message": message, **extra}, status=status)


def _field_error(field_name: str, code: str, message: str) -> web.Response:
    """Discord's 50035 with the field's error, as its documentation shows it."""
    errors = {field_name: {"_errors": [{"code": code, "message": message}]}}
    return _error(400, 50035, "Invalid Form Body", errors=errors)


@dataclass(frozen=True, slots=True)
class RecordedFile:
    field_name: str
    filename: str
    size: int


@dataclass(slots=True)
class RecordedRequest:
    """One request the emulator saw; `status` is what it answered."""

    method: str
    route: str
    path: str
    params: dict[str, str]
    query: dict[str, str]
    headers: dict[str, str]
    json: Any
    files: list[RecordedFile]
    at: float
    status: int = 0

    def param(self, name: str) -> str:
        return self.params[name]


@dataclass(frozen=True, slots=True)
class Fault:
    """A scripted answer that replaces (or delays) the normal one for one request."""

    status: int | None = None
    body: JsonDict | None = None
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0

    @classmethod
    def rate_limited(cls, retry_after: float, *, is_global: bool = False) -> Fault:
        headers = [
            ("Via", "1.1 google"),
            ("Retry-After", str(max(1, int(retry_after + 0.999)))),
            ("X-RateLimit-Scope", "global" if is_global else "user"),
        ]
        if is_global:
            headers.append(("X-RateLimit-Global", "true"))
        body = {
            "message": "You are being rate limited.",
            "retry_after": retry_after,
            "global": is_global,
        }
        return cls(status=429, body=body, headers=tuple(headers))

    @classmethod
    def server_error(cls, status: int = 500) -> Fault:
        return cls(status=status, body={"message": f"{status}: Internal Server Error", "code": 0})

    @classmethod
    def forbidden(cls) -> Fault:
        return cls(status=403, body={"message": "Missing Permissions", "code": 50013})

    @classmethod
    def error(cls, status: int, code: int, message: str) -> Fault:
        return cls(status=status, body={"message": message, "code": code})

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        """Answer normally, after `seconds` of loop time."""
        return cls(delay_s=seconds)


@dataclass(frozen=True, slots=True)
class RateLimitWait:
    """A request admitted in the window after an exhausted one: `floor` is when the
    window reopened, so `admitted_at - floor` is how late the client came back."""

    bucket: str
    floor: float
    admitted_at: float

    @property
    def lag_s(self) -> float:
        return self.admitted_at - self.floor


@dataclass(frozen=True, slots=True)
class CdnFile:
    """A file the emulated CDN serves (avatars, attachments, GIFs)."""

    content_type: str = "application/octet-stream"
    data: bytes = b""
    delay_s: float = 0.0
    chunked: bool = False  # no Content-Length: the size shows only while reading
    redirect_to: str | None = None
    status: int = 200


@dataclass(slots=True)
class _Bucket:
    limit: int
    window_s: float
    started_at: float = float("-inf")
    used: int = 0


@dataclass(slots=True)
class _Buckets:
    limit: int
    window_s: float
    routes: frozenset[str]
    state: dict[str, _Bucket] = field(default_factory=dict)


class DiscordEmulator:
    """An aiohttp app that answers the REST routes discord.py uses, on 127.0.0.1."""

    def __init__(self, token: str = DEFAULT_TOKEN, *, validate: bool = True) -> None:
        self.token = token
        self.validate = validate
        """Validate traffic against Discord's spec (the default; off only for benchmarks)."""
        self.spec_violations: list[SpecViolation] = []
        self._expected_violations = 0
        self.requests: list[RecordedRequest] = []
        self.users: dict[int, JsonDict] = {}
        self.guilds: dict[int, JsonDict] = {}
        self.channels: dict[int, JsonDict] = {}
        self.messages: dict[int, dict[int, JsonDict]] = defaultdict(dict)
        self.deleted: list[tuple[int, int]] = []
        self.commands: dict[int | None, list[JsonDict]] = {}
        self.interaction_responses: list[JsonDict] = []
        self.cdn: dict[str, CdnFile] = {}
        self.roles: dict[int, JsonDict] = {}
        self.member_roles: dict[int, list[int]] = defaultdict(list)
        self._reactions: dict[int, dict[str, list[int]]] = defaultdict(dict)
        self._interaction_channels: dict[str, int] = {}
        self._faults: dict[str, deque[Fault]] = defaultdict(deque)
        self._buckets: _Buckets | None = None
        self.rate_limit_waits: list[RateLimitWait] = []
        """Requests that waited out an exhausted bucket (`enable_buckets`), in order."""
        self._last_id = 0
        self._t0: float | None = None
        self._changed: asyncio.Condition | None = None
        self._runner: web.AppRunner | None = None
        self.base_url = ""
        self.cdn_base = ""

        self.gateway = Gateway(self)
        self.bot = self.add_user("turnbot", global_name="Turn Bot", bot=True)
        self.bot_id = int(self.bot["id"])
        self.application_id = self.bot_id
        self.guild_id = self.add_guild("emulated guild")
        self.channel_id = self.add_text_channel("general")
        self.alice = self.add_user("alice", global_name="Alice")
        self.alice_id = int(self.alice["id"])

    # ---- clock and ids -------------------------------------------------------------------

    def now(self) -> float:
        """The loop's clock (0 outside a running loop)."""
        return self._now()

    def _now(self) -> float:
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:
            return 0.0
        if self._t0 is None:
            self._t0 = now
        return now

    def next_id(self) -> int:
        """A snowflake whose timestamp follows the loop clock (from 2025-01-01)."""
        elapsed = self._now() - (self._t0 if self._t0 is not None else self._now())
        ms = START_MS + int(max(0.0, elapsed) * 1000)
        candidate = (ms - DISCORD_EPOCH_MS) << 22
        self._last_id = max(candidate, self._last_id + 1)
        return self._last_id

    @staticmethod
    def timestamp_of(snowflake: int) -> str:
        ms = (snowflake >> 22) + DISCORD_EPOCH_MS
        moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
        return moment.isoformat()

    # ---- seeding -------------------------------------------------------------------------

    def add_user(
        self,
        username: str,
        *,
        global_name: str | None = None,
        bot: bool = False,
        avatar: str | None = None,
    ) -> JsonDict:
        user_id = self.next_id()
        user: JsonDict = {
            "id": str(user_id),
            "username": username,
            "discriminator": "0",
            "avatar": avatar,
            "global_name": global_name,
            "public_flags": 0,
            "flags": 0,
            "primary_guild": None,
        }
        if bot:
            user["bot"] = True
        self.users[user_id] = user
        if self.guilds:  # everyone seeded is a member of the first guild
            self.add_member(self.guild_id, user_id)
        return user

    def add_guild(self, name: str) -> int:
        """A guild the bot is in (its members: the bot; add more with `add_member`).

        Each guild's id is a millisecond later than the last one's, so consecutive guilds
        fall on consecutive shards (`(guild_id >> 22) % shards`)."""
        guild_id = self.next_id() + (len(self.guilds) << 22)
        self._last_id = guild_id
        self.guilds[guild_id] = {"id": str(guild_id), "name": name, "members": [self.bot_id]}
        return guild_id

    def add_member(self, guild_id: int, user_id: int) -> None:
        members: list[int] = self.guilds[guild_id]["members"]
        if user_id not in members:
            members.append(user_id)

    def add_text_channel(self, name: str, *, guild_id: int | None = None) -> int:
        channel_id = self.next_id()
        guild = guild_id if guild_id is not None else self.guild_id
        self.channels[channel_id] = {
            "id": str(channel_id),
            "type": 0,
            "guild_id": str(guild),
            "name": name,
            "position": len(self.channels),
            "permission_overwrites": [],
            "nsfw": False,
            "flags": 0,
            "last_message_id": None,
        }
        return channel_id

    def add_dm_channel(self, user_id: int) -> int:
        channel_id = self.next_id()
        self.channels[channel_id] = {
            "id": str(channel_id),
            "type": 1,
            "recipients": [self.users[user_id]],
            "flags": 0,
            "last_message_id": None,
        }
        return channel_id

    def add_message(
        self,
        channel_id: int,
        author_id: int,
        content: str,
        *,
        mentions: Iterable[int] = (),
        reply_to: int | None = None,
        attachments: Iterable[JsonDict] = (),
    ) -> JsonDict:
        """Store a message as if a user had sent it; returns its payload. `attachments` are
        `add_attachment` results."""
        message = self.message_payload(channel_id, self.users[author_id], content)
        message_id = int(message["id"])
        message["mentions"] = [self.users[user_id] for user_id in mentions]
        message["attachments"] = list(attachments)
        if reply_to is not None:
            message["type"] = 19
            message["message_reference"] = {
                "type": 0,
                "message_id": str(reply_to),
                "channel_id": str(channel_id),
            }
            referenced = self.messages[channel_id].get(reply_to)
            if referenced is not None:
                message["referenced_message"] = referenced
        self.messages[channel_id][message_id] = message
        return message

    def message_payload(
        self,
        channel_id: int,
        author: JsonDict,
        content: str,
        *,
        message_type: int = 0,
        flags: int = 0,
        embeds: Iterable[JsonDict] = (),
    ) -> JsonDict:
        """A new message object with every field Discord's spec requires (not stored)."""
        message_id = self.next_id()
        message: JsonDict = {
            "id": str(message_id),
            "channel_id": str(channel_id),
            "author": author,
            "content": content,
            "timestamp": self.timestamp_of(message_id),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": False,
            "mentions": [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [_embed_payload(e) for e in embeds],
            "components": [],
            "pinned": False,
            "type": message_type,
            "flags": flags,
        }
        guild_id = self.channels.get(channel_id, {}).get("guild_id")
        if guild_id is not None:
            message["guild_id"] = guild_id
        return message

    def add_attachment(self, filename: str, content_type: str, data: bytes, *,
                       channel_id: int | None = None) -> JsonDict:
        """An uploaded file, served by the emulated CDN, for `add_message(attachments=...)`;
        filed under the channel it is posted in, as Discord's CDN paths are (default: the
        emulator's text channel)."""
        attachment_id = self.next_id()
        channel = channel_id if channel_id is not None else self.channel_id
        path = f"/attachments/{channel}/{attachment_id}/{filename}"
        self.cdn[path] = CdnFile(content_type, data)
        return {"id": str(attachment_id), "filename": filename, "size": len(data),
                "url": self.cdn_url(path), "proxy_url": self.cdn_url(path),
                "content_type": content_type}

    def add_role(self, name: str, *, permissions: int = 0) -> int:
        """A role of the guild; give it to members with `member_roles[user_id].append`."""
        role_id = self.next_id()
        self.roles[role_id] = role_object(role_id, name, permissions, position=1)
        return role_id

    def member_payload(self, user_id: int) -> JsonDict:
        """The guild member object Discord adds to a guild message's MESSAGE_CREATE."""
        return {"roles": [str(r) for r in self.member_roles[user_id]],
                "joined_at": self.timestamp_of(user_id), "deaf": False, "mute": False,
                "flags": 0}

    def guild_payload(self) -> JsonDict:
        """The guild as GUILD_CREATE carries it (roles, text channels), for a client's cache:
        ``client._connection._add_guild_from_data(emulator.guild_payload())``."""
        everyone = role_object(self.guild_id, "@everyone", 0, position=0)
        return {
            "id": str(self.guild_id), "name": "emulated guild", "icon": None,
            "owner_id": str(self.alice_id), "roles": [everyone, *self.roles.values()],
            "emojis": [], "stickers": [], "features": [], "member_count": len(self.users),
            "channels": [c for c in self.channels.values()
                         if c.get("guild_id") == str(self.guild_id)],
            "members": [], "threads": [], "voice_states": [], "presences": [],
        }

    def add_reaction(self, message_id: int, emoji: str, user_id: int) -> None:
        """`emoji` in route form: a unicode emoji, or `name:id` for a custom one."""
        users = self._reactions[message_id].setdefault(emoji, [])
        if user_id not in users:
            users.append(user_id)

    # ---- scripting -----------------------------------------------------------------------

    def inject(self, route: str, *faults: Fault) -> None:
        """Answer the next matching requests with `faults`, one each, in order.

        `route` is a template key such as ``"POST /channels/{channel_id}/messages"``, or
        ``"*"`` for any route.
        """
        self._faults[route].extend(faults)

    def enable_buckets(
        self, limit: int, window_s: float, routes: Iterable[str] = (SEND_MESSAGE,)
    ) -> None:
        """Send Discord's rate-limit headers for `routes` (per channel) and 429 past them."""
        self._buckets = _Buckets(limit=limit, window_s=window_s, routes=frozenset(routes))

    # ---- queries -------------------------------------------------------------------------

    def requests_to(self, route: str, *, status: int | None = None) -> list[RecordedRequest]:
        return [
            r for r in self.requests if r.route == route and (status is None or r.status == status)
        ]

    def sent(self, channel_id: int | None = None) -> list[RecordedRequest]:
        """Successful message sends, in order."""
        wanted = str(channel_id if channel_id is not None else self.channel_id)
        return [
            r
            for r in self.requests_to(SEND_MESSAGE, status=200)
            if r.params["channel_id"] == wanted
        ]

    def channel_messages(self, channel_id: int | None = None) -> list[JsonDict]:
        """Messages currently in the channel (deleted ones gone), oldest first."""
        wanted = channel_id if channel_id is not None else self.channel_id
        return [self._with_reactions(m) for m in self.messages[wanted].values()]

    async def wait_for(
        self,
        predicate: Callable[[RecordedRequest], bool],
        *,
        count: int = 1,
        answered: bool = True,
        timeout: float = 30.0,
    ) -> list[RecordedRequest]:
        """Wait (loop clock) until `count` requests match `predicate`.

        With `answered=False` a request counts as soon as it arrives.
        """
        assert self._changed is not None, "emulator not started"

        def matching() -> list[RecordedRequest]:
            return [r for r in self.requests if (r.status or not answered) and predicate(r)]

        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(lambda: len(matching()) >= count)
        return matching()

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> str:
        self._now()
        self._changed = asyncio.Condition()
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        self._add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        # A bot opening hundreds of connections at once must not overflow the accept queue
        # (a dropped SYN costs a second of retransmission).
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}{API_PREFIX}"
        self.cdn_base = f"http://{host}:{port}{CDN_PREFIX}"
        self.gateway.bind(f"http://{host}:{port}")
        return self.base_url

    def cdn_url(self, path: str) -> str:
        """The URL of `path` (e.g. "/files/a.gif") on the emulated CDN."""
        return self.cdn_base + path

    async def stop(self, *, check: bool = True) -> None:
        """Close the server; then, with `check`, raise the spec violations it saw."""
        if self._runner is not None:
            await self.gateway.aclose()
            await self._runner.cleanup()
            self._runner = None
        if check:
            self.check_spec()

    # ---- Discord's spec ------------------------------------------------------------------

    def check_spec(self) -> None:
        """Raise `SpecViolationError` if any traffic so far broke Discord's spec."""
        if self.spec_violations:
            violations, self.spec_violations = self.spec_violations, []
            raise SpecViolationError(violations)

    @contextmanager
    def expect_spec_violations(self) -> Iterator[list[SpecViolation]]:
        """For a test that sends what Discord refuses on purpose: the violations inside are
        handed to the test instead of failing it, and there must be at least one."""
        before = len(self.spec_violations)
        caught: list[SpecViolation] = []
        yield caught
        caught.extend(self.spec_violations[before:])
        del self.spec_violations[before:]
        if not caught:
            raise AssertionError("expected traffic that breaks Discord's spec; all of it kept it")

    # ---- plumbing ------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        p = API_PREFIX
        r = app.router
        r.add_get(p + "/gateway", self._get_gateway)
        r.add_get(p + "/gateway/bot", self._get_bot_gateway)
        r.add_get(GATEWAY_PATH, self.gateway.handle)
        r.add_get(p + "/users/@me", self._get_me)
        r.add_get(p + "/users/{user_id}", self._get_user)
        r.add_get(p + "/oauth2/applications/@me", self._get_application)
        r.add_get(p + "/guilds/{guild_id}/members/{user_id}", self._get_member)
        r.add_get(p + "/channels/{channel_id}", self._get_channel)
        r.add_get(p + "/channels/{channel_id}/messages", self._get_messages)
        r.add_post(p + "/channels/{channel_id}/messages", self._post_message)
        r.add_get(p + "/channels/{channel_id}/messages/{message_id}", self._get_message)
        r.add_patch(p + "/channels/{channel_id}/messages/{message_id}", self._patch_message)
        r.add_delete(p + "/channels/{channel_id}/messages/{message_id}", self._delete_message)
        r.add_post(p + "/channels/{channel_id}/typing", self._no_content)
        r.add_get(
            p + "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}",
            self._get_reactions,
        )
        r.add_put(
            p + "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}/{user}",
            self._put_reaction,
        )
        r.add_get(p + "/applications/{application_id}/commands", self._get_commands)
        r.add_put(p + "/applications/{application_id}/commands", self._put_commands)
        r.add_get(
            p + "/applications/{application_id}/guilds/{guild_id}/commands", self._get_commands
        )
        r.add_put(
            p + "/applications/{application_id}/guilds/{guild_id}/commands", self._put_commands
        )
        r.add_post(p + "/interactions/{interaction_id}/{token}/callback", self._callback)
        r.add_post(p + "/webhooks/{application_id}/{token}", self._followup)
        r.add_get(p + "/webhooks/{application_id}/{token}/messages/{message_id}", self._webhook_get)
        r.add_patch(
            p + "/webhooks/{application_id}/{token}/messages/{message_id}", self._webhook_edit
        )
        r.add_delete(
            p + "/webhooks/{application_id}/{token}/messages/{message_id}", self._no_content
        )
        r.add_get(CDN_PREFIX + "/{path:.*}", self._cdn)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == GATEWAY_PATH:  # the websocket: not a REST call
            return await handler(request)
        resource = request.match_info.route.resource
        template = resource.canonical if resource is not None else request.path
        route = f"{request.method} {template.removeprefix(API_PREFIX)}"
        if route.startswith(f"GET {CDN_PREFIX}/"):
            route = f"GET {request.path}"
        body, files = await self._read_body(request)
        record = RecordedRequest(
            method=request.method,
            route=route,
            path=request.path.removeprefix(API_PREFIX),
            params=dict(request.match_info),
            query=dict(request.query),
            headers=dict(request.headers),
            json=body,
            files=files,
            at=self._now(),
        )
        self.requests.append(record)
        await self._notify()
        request[_BODY] = body
        request[_FILES] = files
        spec_checked = self.validate and request.path.startswith(API_PREFIX + "/")
        if spec_checked:
            self._check_request(record)
        try:
            response = await self._answer(request, handler, record)
        except web.HTTPException as exc:
            response = _error(exc.status, 0, f"{exc.status}: {exc.reason}")
        if spec_checked and isinstance(response, web.Response):
            self._check_response(record, response)
        record.status = response.status
        await self._notify()
        return response

    def _check_request(self, record: RecordedRequest) -> None:
        self.spec_violations.extend(shared_validator().check_request(
            record.method, record.path, query=record.query, headers=record.headers,
            body=record.json))

    def _check_response(self, record: RecordedRequest, response: web.Response) -> None:
        body = response.body
        self.spec_violations.extend(shared_validator().check_response(
            record.method, record.path, query=record.query, headers=record.headers,
            status=response.status, body=body if isinstance(body, bytes) else b"",
            content_type=response.content_type if body else "",
            response_headers=dict(response.headers)))

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _answer(
        self, request: web.Request, handler: Handler, record: RecordedRequest
    ) -> web.StreamResponse:
        fault = self._next_fault(record.route)
        if fault is not None and fault.delay_s > 0:
            await asyncio.sleep(fault.delay_s)
        if fault is not None and fault.status is not None:
            return _json_response(
                fault.body or {}, status=fault.status, headers=dict(fault.headers)
            )
        if not self._authorized(record):
            return _error(401, 0, "401: Unauthorized")
        limited, headers = self._take_bucket(record)
        if limited is not None:
            return limited
        response = await handler(request)
        response.headers.update(headers)
        return response

    def _next_fault(self, route: str) -> Fault | None:
        for key in (route, "*"):
            queue = self._faults.get(key)
            if queue:
                return queue.popleft()
        return None

    def _authorized(self, record: RecordedRequest) -> bool:
        if record.route.startswith(("POST /interactions/", "GET /webhooks/", "POST /webhooks/")):
            return True
        if record.route.startswith(("PATCH /webhooks/", "DELETE /webhooks/", f"GET {CDN_PREFIX}/")):
            return True
        return record.headers.get("Authorization") == f"Bot {self.token}"

    def _take_bucket(self, record: RecordedRequest) -> tuple[web.Response | None, dict[str, str]]:
        buckets = self._buckets
        if buckets is None or record.route not in buckets.routes:
            return None, {}
        key = f"{record.route}:{record.params.get('channel_id', '')}"
        bucket = buckets.state.setdefault(key, _Bucket(buckets.limit, buckets.window_s))
        now = self._now()
        if now >= bucket.started_at + bucket.window_s:
            if bucket.used >= bucket.limit:  # this request waited for the window to reopen
                floor = bucket.started_at + bucket.window_s
                self.rate_limit_waits.append(RateLimitWait(key, floor, now))
            bucket.started_at, bucket.used = now, 0
        # Rounded up to the millisecond, so a client that waits it out finds a fresh window.
        reset_after = math.ceil((bucket.started_at + bucket.window_s - now) * 1000) / 1000
        if bucket.used >= bucket.limit:
            limited = Fault.rate_limited(reset_after)
            return (
                _json_response(limited.body, status=429, headers=dict(limited.headers)),
                {},
            )
        bucket.used += 1
        digest = hashlib.sha1(record.route.encode()).hexdigest()[:16]
        headers = {
            "X-RateLimit-Bucket": digest,
            "X-RateLimit-Limit": str(bucket.limit),
            "X-RateLimit-Remaining": str(bucket.limit - bucket.used),
            "X-RateLimit-Reset-After": f"{reset_after:.3f}",
            "X-RateLimit-Reset": f"{START_MS / 1000 + now + reset_after:.3f}",
        }
        return None, headers

    @staticmethod
    async def _read_body(request: web.Request) -> tuple[Any, list[RecordedFile]]:
        if not request.body_exists:
            return None, []
        if request.content_type.startswith("multipart/"):
            payload: Any = None
            files: list[RecordedFile] = []
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, aiohttp.BodyPartReader):
                    continue
                data = await part.read()
                if part.name == "payload_json":
                    payload = json.loads(data)
                else:
                    files.append(RecordedFile(part.name or "", part.filename or "", len(data)))
            return payload, files
        raw = await request.read()
        if not raw:
            return None, []
        try:
            return json.loads(raw), []
        except ValueError:
            return raw.decode("utf-8", "replace"), []

    # ---- payload builders ----------------------------------------------------------------

    def _with_reactions(self, message: JsonDict) -> JsonDict:
        reactions = self._reactions.get(int(message["id"]))
        if not reactions:
            return message
        out = dict(message)
        out["reactions"] = [
            {
                "emoji": self._emoji_payload(emoji),
                "count": len(users),
                "count_details": {"burst": 0, "normal": len(users)},
                "me": self.bot_id in users,
                "me_burst": False,
                "burst_colors": [],
            }
            for emoji, users in reactions.items()
            if users
        ]
        return out

    @staticmethod
    def _emoji_payload(emoji: str) -> JsonDict:
        name, sep, emoji_id = emoji.partition(":")
        if sep:
            return {"id": emoji_id, "name": name}
        return {"id": None, "name": emoji}

    def _bot_message(
        self, channel_id: int, body: JsonDict, files: list[RecordedFile]
    ) -> JsonDict | web.Response:
        """Validate a send like Discord does and build the stored message."""
        content = body.get("content") or ""
        embeds = body.get("embeds") or []
        if not isinstance(content, str):
            return _field_error("content", "BASE_TYPE_STRING", "Must be a string.")
        if not isinstance(embeds, list) or not all(isinstance(e, dict) for e in embeds):
            return _field_error("embeds", "BASE_TYPE_ARRAY", "Must be an array of objects.")
        if len(content) > MAX_CONTENT:
            return _field_error("content", "BASE_TYPE_MAX_LENGTH",
                                f"Must be {MAX_CONTENT} or fewer in length.")
        if not content.strip() and not embeds and not files:
            return _error(400, 50006, "Cannot send an empty message")
        for embed in embeds:
            if (
                len(embed.get("title") or "") > MAX_EMBED_TITLE
                or len(embed.get("description") or "") > MAX_EMBED_DESCRIPTION
            ):
                return _error(400, 50035, "Invalid Form Body")
        message = self.message_payload(channel_id, self.bot, content, embeds=embeds,
                                       flags=int(body.get("flags") or 0))
        message["attachments"] = [
            {
                "id": str(self.next_id()),
                "filename": f.filename,
                "size": f.size,
                "url": f"https://cdn.example.invalid/{f.filename}",
                "proxy_url": f"https://media.example.invalid/{f.filename}",
            }
            for f in files
        ]
        reference = body.get("message_reference")
        if reference:
            referenced = self.messages[channel_id].get(int(reference["message_id"]))
            if referenced is None:
                if reference.get("fail_if_not_exists", True):
                    return _error(400, 50035, "Invalid Form Body: Unknown message")
            else:
                message["type"] = 19
                message["message_reference"] = {
                    "type": 0,
                    "message_id": referenced["id"],
                    "channel_id": str(channel_id),
                }
                message["referenced_message"] = referenced
        return message

    # ---- handlers ------------------------------------------------------------------------

    @staticmethod
    def _body(request: web.Request) -> Any:
        return request[_BODY]

    async def _no_content(self, request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def _get_gateway(self, request: web.Request) -> web.Response:
        return _json_response({"url": self.gateway.url})

    async def _get_bot_gateway(self, request: web.Request) -> web.Response:
        return _json_response(self.gateway.bot_gateway())

    async def _get_me(self, request: web.Request) -> web.Response:
        return _json_response({**self.bot, "mfa_enabled": False, "locale": "en-US"})

    async def _get_user(self, request: web.Request) -> web.Response:
        user = self.users.get(int(request.match_info["user_id"]))
        if user is None:
            return _error(404, 10013, "Unknown User")
        return _json_response(user)

    async def _get_member(self, request: web.Request) -> web.Response:
        """GET /guilds/{guild.id}/members/{user.id} (Resources > Guild > Get Guild Member):
        the member with their roles (`member_roles`); 10004 for a guild the bot is not in,
        10007 for a user who is not a member."""
        guild = self.guilds.get(int(request.match_info["guild_id"]))
        if guild is None:
            return _error(404, 10004, "Unknown Guild")
        user_id = int(request.match_info["user_id"])
        if user_id not in guild["members"]:
            return _error(404, 10007, "Unknown Member")
        return _json_response({
            **self.member_payload(user_id), "user": self.users[user_id], "nick": None,
            "avatar": None, "banner": None, "communication_disabled_until": None,
            "pending": False, "premium_since": None})

    async def _get_application(self, request: web.Request) -> web.Response:
        return _json_response(
            {
                "id": str(self.application_id),
                "name": "turnbot",
                "description": "",
                "icon": None,
                "type": None,
                "bot_public": True,
                "bot_require_code_grant": False,
                "owner": self.alice,
                "verify_key": "0" * 64,
                "flags": 0,
                "flags_new": "0",
                "redirect_uris": [],
                "interactions_endpoint_url": None,
                "role_connections_verification_url": None,
                "approximate_guild_count": len(self.guilds),
                "approximate_user_install_count": 0,
                "approximate_user_authorization_count": 0,
                "explicit_content_filter": 0,
                "team": None,
                "eligible_oauth2_scopes": [],
            }
        )

    def _channel_or_404(self, request: web.Request) -> int | web.Response:
        channel_id = int(request.match_info["channel_id"])
        if channel_id not in self.channels:
            return _error(404, 10003, "Unknown Channel")
        return channel_id

    async def _get_channel(self, request: web.Request) -> web.Response:
        channel_id = self._channel_or_404(request)
        if isinstance(channel_id, web.Response):
            return channel_id
        return _json_response(self.channels[channel_id])

    async def _get_messages(self, request: web.Request) -> web.Response:
        channel_id = self._channel_or_404(request)
        if isinstance(channel_id, web.Response):
            return channel_id
        limit = int(request.query.get("limit", "50"))
        ids = sorted(self.messages[channel_id], reverse=True)
        if "before" in request.query:
            ids = [i for i in ids if i < int(request.query["before"])]
        if "after" in request.query:
            ids = sorted(i for i in ids if i > int(request.query["after"]))[:limit]
            ids.reverse()
        chosen = ids[:limit]
        return _json_response([self._with_reactions(self.messages[channel_id][i]) for i in chosen])

    async def _get_message(self, request: web.Request) -> web.Response:
        channel_id = self._channel_or_404(request)
        if isinstance(channel_id, web.Response):
            return channel_id
        message = self.messages[channel_id].get(int(request.match_info["message_id"]))
        if message is None:
            return _error(404, 10008, "Unknown Message")
        return _json_response(self._with_reactions(message))

    async def _post_message(self, request: web.Request) -> web.Response:
        channel_id = self._channel_or_404(request)
        if isinstance(channel_id, web.Response):
            return channel_id
        built = self._bot_message(channel_id, self._body(request) or {}, request[_FILES])
        if isinstance(built, web.Response):
            return built
        self.messages[channel_id][int(built["id"])] = built
        return _json_response(built)

    async def _patch_message(self, request: web.Request) -> web.Response:
        channel_id = self._channel_or_404(request)
        if isinstance(channel_id, web.Response):
            return channel_id
        message = self.messages[channel_id].get(int(request.match_info["message_id"]))
        if message is None:
            return _error(404, 10008, "Unknown Message")
        body = self._body(request) or {}
        for key in ("content", "embeds", "flags"):
            if key in body:
                message[key] = body[key]
        message["edited_timestamp"] = self.timestamp_of(self.next_id())
        return _json_response(self._with_reactions(message))

    async def _delete_message(self, request: web.Request) -> web.Response:
        channel_id = self._channel_or_404(request)
        if isinstance(channel_id, web.Response):
            return channel_id
        message_id = int(request.match_info["message_id"])
        if self.messages[channel_id].pop(message_id, None) is None:
            return _error(404, 10008, "Unknown Message")
        self.deleted.append((channel_id, message_id))
        return web.Response(status=204)

    async def _get_reactions(self, request: web.Request) -> web.Response:
        message_id = int(request.match_info["message_id"])
        users = self._reactions[message_id].get(request.match_info["emoji"], [])
        after = int(request.query.get("after", "0"))
        limit = min(100, int(request.query.get("limit", "25")))
        chosen = [u for u in sorted(users) if u > after][:limit]
        return _json_response([self.users[u] for u in chosen])

    async def _put_reaction(self, request: web.Request) -> web.Response:
        user = request.match_info["user"]
        user_id = self.bot_id if user == "@me" else int(user)
        self.add_reaction(
            int(request.match_info["message_id"]), request.match_info["emoji"], user_id
        )
        return web.Response(status=204)

    async def _get_commands(self, request: web.Request) -> web.Response:
        guild = request.match_info.get("guild_id")
        return _json_response(self.commands.get(int(guild) if guild else None, []))

    async def _put_commands(self, request: web.Request) -> web.Response:
        guild = request.match_info.get("guild_id")
        stored: list[JsonDict] = []
        for command in self._body(request) or []:
            # Discord answers with its defaults where the request left a field null.
            entry = {key: value for key, value in command.items() if value is not None}
            entry.setdefault("default_member_permissions", None)
            if isinstance(entry["default_member_permissions"], int):
                entry["default_member_permissions"] = str(entry["default_member_permissions"])
            entry.setdefault("integration_types", [0])
            entry["id"] = str(self.next_id())
            entry["application_id"] = str(self.application_id)
            entry["version"] = str(self.next_id())
            entry.setdefault("type", 1)
            entry.setdefault("description", "")
            if guild:
                entry["guild_id"] = guild
            stored.append(entry)
        self.commands[int(guild) if guild else None] = stored
        return _json_response(stored)

    async def _callback(self, request: web.Request) -> web.Response:
        body: JsonDict = self._body(request) or {}
        self.interaction_responses.append(body)
        data = body.get("data") or {}
        flags = int(data.get("flags") or 0)
        interaction: JsonDict = {
            "id": request.match_info["interaction_id"],
            "type": 2,
            "response_message_loading": body.get("type") == 5,
            "response_message_ephemeral": bool(flags & 64),
        }
        payload: JsonDict = {"interaction": interaction}
        if body.get("type") in (4, 7):
            channel_id = self._interaction_channels.get(interaction["id"], self.channel_id)
            message = self.message_payload(channel_id, self.bot, data.get("content") or "",
                                           message_type=20, flags=flags,
                                           embeds=data.get("embeds") or [])
            interaction["response_message_id"] = message["id"]
            payload["resource"] = {"type": body["type"], "message": message}
        return _json_response(payload)

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        entry = self.cdn.get("/" + request.match_info["path"])
        if entry is None:
            return web.Response(status=404, text="not found")
        if entry.delay_s > 0:
            await asyncio.sleep(entry.delay_s)
        if entry.redirect_to is not None:
            return web.Response(status=302, headers={"Location": entry.redirect_to})
        if not entry.chunked:
            return web.Response(
                status=entry.status, body=entry.data, headers={"Content-Type": entry.content_type}
            )
        response = web.StreamResponse(
            status=entry.status, headers={"Content-Type": entry.content_type}
        )
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(entry.data), 16 * 1024):
            await response.write(entry.data[start : start + 16 * 1024])
        await response.write_eof()
        return response

    def slash_command_payload(
        self,
        name: str,
        *,
        channel_id: int | None = None,
        user_id: int | None = None,
        guild: bool = True,
        permissions: int = 0,
    ) -> JsonDict:
        """An INTERACTION_CREATE payload for a synced slash command, as the gateway sends it.
        `permissions` are the member's in the channel; their roles come from `member_roles`.

        Feed it to ``client._connection.parse_interaction_create``, or dispatch it through
        the gateway with ``gateway.interaction``.
        """
        channel_id = channel_id if channel_id is not None else self.channel_id
        guild_id = int(self.channels[channel_id].get("guild_id") or self.guild_id)
        scope = guild_id if guild and guild_id in self.commands else None
        command = next(c for c in self.commands.get(scope, []) if c["name"] == name)
        user = self.users[user_id if user_id is not None else self.alice_id]
        interaction_id = self.next_id()
        self._interaction_channels[str(interaction_id)] = channel_id
        payload: JsonDict = {
            "id": str(interaction_id),
            "application_id": str(self.application_id),
            "type": 2,
            "token": f"interaction-token-{self.next_id()}",
            "version": 1,
            "channel_id": str(channel_id),
            "channel": self.channels[channel_id],
            "data": {"id": command["id"], "name": name, "type": 1},
            "locale": "en-US",
            "app_permissions": "0",
            "entitlements": [],
            # a guild install: the guild's id in a guild, "0" in the bot's DMs (Discord's docs)
            "authorizing_integration_owners": {"0": str(guild_id) if guild else "0"},
            "attachment_size_limit": 10 * 1024 * 1024,
            "context": 0 if guild else 1,
        }
        if guild:
            payload["guild_id"] = str(guild_id)
            payload["guild_locale"] = "en-US"
            payload["member"] = {
                "user": user,
                "roles": [str(r) for r in self.member_roles[int(user["id"])]],
                "joined_at": self.timestamp_of(int(user["id"])),
                "deaf": False,
                "mute": False,
                "flags": 0,
                "permissions": str(permissions),
            }
        else:
            payload["user"] = user
        return payload

    def _webhook_message(self, body: JsonDict) -> JsonDict:
        message = self.message_payload(self.channel_id, self.bot, body.get("content") or "",
                                       flags=int(body.get("flags") or 0),
                                       embeds=body.get("embeds") or [])
        message["webhook_id"] = str(self.application_id)
        return message

    async def _followup(self, request: web.Request) -> web.Response:
        return _json_response(self._webhook_message(self._body(request) or {}))

    async def _webhook_get(self, request: web.Request) -> web.Response:
        return _json_response(self._webhook_message({}))

    async def _webhook_edit(self, request: web.Request) -> web.Response:
        return _json_response(self._webhook_message(self._body(request) or {}))


@contextmanager
def pointed_at(emulator: DiscordEmulator) -> Iterator[None]:
    """Point discord.py's REST base, CDN base and default gateway at `emulator` (started);
    restored on exit."""
    previous = (discord.http.Route.BASE, discord.Asset.BASE,
                discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
    discord.http.Route.BASE = emulator.base_url
    discord.Asset.BASE = emulator.cdn_base
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(emulator.gateway.url)
    try:
        yield
    finally:
        (discord.http.Route.BASE, discord.Asset.BASE,
         discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) = previous


@asynccontextmanager
async def emulated_discord(
    token: str = DEFAULT_TOKEN,
    *,
    client_factory: Callable[[], discord.Client] | None = None,
) -> AsyncIterator[tuple[DiscordEmulator, discord.Client]]:
    """Start an emulator, point discord.py at it and log a client in (no gateway
    connection: tests feed events to ``client._connection`` themselves, or use
    `connected_discord`).

    Everything is restored and closed on exit; then the spec violations seen, if any, fail
    the test.
    """
    emulator = DiscordEmulator(token)
    await emulator.start()
    failed = False
    with pointed_at(emulator):
        client = (
            client_factory()
            if client_factory is not None
            else discord.Client(intents=discord.Intents.default())
        )
        try:
            await client.login(token)
            yield emulator, client
        except BaseException:
            failed = True
            raise
        finally:
            await client.close()
    await emulator.stop(check=not failed)


@asynccontextmanager
async def running_client(
    emulator: DiscordEmulator, client: discord.Client, *, ready_timeout: float = 120.0
) -> AsyncIterator[asyncio.Task[None]]:
    """``client.start(token)`` against a started emulator, as in production: login, the
    gateway, READY and every GUILD_CREATE. Yields the task running the client once it is
    ready (a client that fails to start raises here instead); closes it on exit."""
    task = asyncio.create_task(client.start(emulator.token), name="discord-client")
    ready = asyncio.create_task(client.wait_until_ready(), name="discord-client-ready")
    try:
        async with asyncio.timeout(ready_timeout):
            await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            ready.cancel()
            task.result()
            raise RuntimeError("the client stopped before it was ready")
        yield task
    finally:
        ready.cancel()
        if not client.is_closed():
            await client.close()
        if not task.done():
            task.cancel()
        with suppress(asyncio.CancelledError):
            await task


@asynccontextmanager
async def connected_discord(
    token: str = DEFAULT_TOKEN,
    *,
    client_factory: Callable[[], discord.Client] | None = None,
    setup: Callable[[DiscordEmulator, discord.Client], None] | None = None,
    shards: int = 1,
    validate: bool = True,
) -> AsyncIterator[tuple[DiscordEmulator, discord.Client]]:
    """An emulator and a client started through the gateway (`running_client`).

    `setup(emulator, client)` runs before the start: seed channels and users, attach event
    handlers or a bot. `shards` is the count GET /gateway/bot recommends (an
    `AutoShardedClient` follows it).
    """
    emulator = DiscordEmulator(token, validate=validate)
    emulator.gateway.shards = shards
    await emulator.start()
    failed = False
    with pointed_at(emulator):
        client = (
            client_factory()
            if client_factory is not None
            else discord.Client(intents=discord.Intents.default())
        )
        if setup is not None:
            setup(emulator, client)
        try:
            async with running_client(emulator, client):
                yield emulator, client
        except BaseException:
            failed = True
            raise
    await emulator.stop(check=not failed)
