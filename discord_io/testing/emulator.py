"""A Discord REST emulator on loopback, with the gateway on the same port.

Real discord.py logs in to it (``Route.BASE`` points here), so tests exercise the library's
own request building, rate-limit handling and payload parsing instead of mocks. Every request
is recorded for assertions, and faults (429 with ``retry_after``, per route or global, 5xx,
403, delays) can be scripted per route. Time comes from the running loop's clock, so delays
and rate-limit windows fast-forward under ``looptime``.

By default every request and every answer is validated against Discord's own OpenAPI spec
(`spec_validation`); violations are collected in ``spec_violations`` and raised as a
`SpecViolationError` when the emulator stops, so the test that caused one fails. The parts,
one job each: `world` (what Discord holds), `permissions`, `messages` (channel and message
routes), `interactions`, `users`, `rate_limits`, `rest` (answers, records, faults) and the
gateway (`gateway`). docs/emulator.md describes the whole surface.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from typing import Any

import discord
import yarl
from aiohttp import web
from aiohttp.typedefs import Handler

from .clock import loop_clock_heartbeats
from .gateway import GATEWAY_PATH, RESUME_PATH, Gateway
from .interactions import Interactions
from .messages import MessageRoutes
from .rate_limits import RateLimiter, RateLimitWait
from .rest import (
    API_PREFIX,
    BODY,
    CDN_PREFIX,
    FILES,
    SEND_MESSAGE,
    Fault,
    RecordedFile,
    RecordedRequest,
    error,
    json_response,
    read_body,
)
from .spec_validation import SpecViolation, SpecViolationError, shared_validator
from .users import UserRoutes
from .world import CdnFile, World

__all__ = ["SEND_MESSAGE", "CdnFile", "DiscordEmulator", "Fault", "RateLimitWait",
           "RecordedFile", "RecordedRequest", "connected_discord", "emulated_discord",
           "pointed_at", "running_client"]

JsonDict = dict[str, Any]

DEFAULT_TOKEN = "emulator-token.not-a-real-secret"


class DiscordEmulator(World):
    """An aiohttp app that answers the REST routes discord.py uses, on 127.0.0.1."""

    def __init__(self, token: str = DEFAULT_TOKEN, *, validate: bool = True) -> None:
        super().__init__(token, validate=validate)
        self._expected_violations = 0
        self.requests: list[RecordedRequest] = []
        self._faults: dict[str, deque[Fault]] = defaultdict(deque)
        self.limits = RateLimiter(self._now, self.wall_clock)
        """Discord's rate limits: per-route buckets, the global limit, invalid requests."""
        self._changed: asyncio.Condition | None = None
        self._runner: web.AppRunner | None = None
        self.base_url = ""
        self.interactions = Interactions(self)
        self.gateway = Gateway(self, self.interactions)
        self.message_routes = MessageRoutes(self, self.gateway.thread_update,
                                            self.gateway.message_event)
        self.user_routes = UserRoutes(self)

    # ---- compatibility views -------------------------------------------------------------

    @property
    def interaction_responses(self) -> list[JsonDict]:
        """The initial interaction responses Discord accepted."""
        return self.interactions.responses

    @property
    def deleted(self) -> list[tuple[int, int]]:
        return self.message_routes.deleted

    @property
    def rate_limit_waits(self) -> list[RateLimitWait]:
        """Requests that waited out an exhausted bucket, in order."""
        return self.limits.waits

    def slash_command_payload(self, name: str, *, channel_id: int | None = None,
                              user_id: int | None = None, guild: bool = True,
                              permissions: int | None = None) -> JsonDict:
        """An INTERACTION_CREATE payload (`Interactions.slash_command_payload`)."""
        return self.interactions.slash_command_payload(
            name, channel_id=channel_id, user_id=user_id, guild=guild, permissions=permissions)

    def guild_payload(self) -> JsonDict:
        """The first guild as GUILD_CREATE carries it, for a client's cache:
        ``client._connection._add_guild_from_data(emulator.guild_payload())``."""
        return self.gateway.guild_create_payload(self.guild_id)

    # ---- scripting -----------------------------------------------------------------------

    def inject(self, route: str, *faults: Fault) -> None:
        """Answer the next matching requests with `faults`, one each, in order.

        `route` is a template key such as ``"POST /channels/{channel_id}/messages"``, or
        ``"*"`` for any route.
        """
        self._faults[route].extend(faults)

    def enable_buckets(self, limit: int, window_s: float,
                       routes: Iterable[str] = (SEND_MESSAGE,)) -> None:
        """Set the per-channel bucket of `routes` (every route has one, with its headers)."""
        self.limits.set_limits(limit, window_s, routes)

    # ---- queries -------------------------------------------------------------------------

    def requests_to(self, route: str, *, status: int | None = None) -> list[RecordedRequest]:
        return [r for r in self.requests
                if r.route == route and (status is None or r.status == status)]

    def sent(self, channel_id: int | None = None) -> list[RecordedRequest]:
        """Successful message sends, in order."""
        wanted = str(channel_id if channel_id is not None else self.channel_id)
        return [r for r in self.requests_to(SEND_MESSAGE, status=200)
                if r.params["channel_id"] == wanted]

    def channel_messages(self, channel_id: int | None = None) -> list[JsonDict]:
        """Messages currently in the channel (deleted ones gone), oldest first."""
        wanted = channel_id if channel_id is not None else self.channel_id
        return [self.served(m) for m in self.messages[wanted].values()]

    async def wait_for(self, predicate: Callable[[RecordedRequest], bool], *, count: int = 1,
                       answered: bool = True, timeout: float = 30.0) -> list[RecordedRequest]:
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
        m, i, u = self.message_routes, self.interactions, self.user_routes
        r.add_get(p + "/gateway", self._get_gateway)
        r.add_get(p + "/gateway/bot", self._get_bot_gateway)
        self.gateway.routes(app)
        r.add_get(p + "/users/@me", u.get_me)
        r.add_get(p + "/users/{user_id}", u.get_user)
        r.add_get(p + "/guilds/{guild_id}/members/{user_id}", u.get_member)
        r.add_patch(p + "/guilds/{guild_id}/members/@me", u.patch_own_member)
        r.add_get(p + "/oauth2/applications/@me", u.get_application)
        r.add_get(p + "/channels/{channel_id}", m.get_channel)
        r.add_get(p + "/channels/{channel_id}/messages", m.get_messages)
        r.add_post(p + "/channels/{channel_id}/messages", m.post_message)
        r.add_get(p + "/channels/{channel_id}/messages/{message_id}", m.get_message)
        r.add_patch(p + "/channels/{channel_id}/messages/{message_id}", m.patch_message)
        r.add_delete(p + "/channels/{channel_id}/messages/{message_id}", m.delete_message)
        r.add_post(p + "/channels/{channel_id}/typing", m.typing)
        r.add_get(p + "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}",
                  m.get_reactions)
        r.add_put(p + "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}/{user}",
                  m.put_reaction)
        r.add_get(p + "/applications/{application_id}/commands", i.get_commands)
        r.add_put(p + "/applications/{application_id}/commands", i.put_commands)
        r.add_get(p + "/applications/{application_id}/guilds/{guild_id}/commands",
                  i.get_commands)
        r.add_put(p + "/applications/{application_id}/guilds/{guild_id}/commands",
                  i.put_commands)
        r.add_post(p + "/interactions/{interaction_id}/{token}/callback", i.callback)
        r.add_post(p + "/webhooks/{application_id}/{token}", i.followup)
        r.add_get(p + "/webhooks/{application_id}/{token}/messages/{message_id}", i.webhook_get)
        r.add_patch(p + "/webhooks/{application_id}/{token}/messages/{message_id}",
                    i.webhook_edit)
        r.add_delete(p + "/webhooks/{application_id}/{token}/messages/{message_id}",
                     i.webhook_delete)
        r.add_get(CDN_PREFIX + "/{path:.*}", self._cdn)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in (GATEWAY_PATH, RESUME_PATH):  # the websocket: not a REST call
            return await handler(request)
        resource = request.match_info.route.resource
        template = resource.canonical if resource is not None else request.path
        route = f"{request.method} {template.removeprefix(API_PREFIX)}"
        if route.startswith(f"GET {CDN_PREFIX}/"):
            route = f"GET {request.path}"
        body, files = await read_body(request)
        record = RecordedRequest(
            method=request.method, route=route, path=request.path.removeprefix(API_PREFIX),
            params=dict(request.match_info), query=dict(request.query),
            headers=dict(request.headers), json=body, files=files, at=self._now())
        self.requests.append(record)
        await self._notify()
        request[BODY] = body
        request[FILES] = files
        spec_checked = self.validate and request.path.startswith(API_PREFIX + "/")
        if spec_checked:
            self._check_request(record)
        try:
            response = await self._answer(request, handler, record)
        except web.HTTPException as exc:
            response = error(exc.status, 0, f"{exc.status}: {exc.reason}")
        if spec_checked and isinstance(response, web.Response) and \
                response.content_type != "text/plain":  # not Cloudflare's ban page
            self._check_response(record, response)
        record.status = response.status
        record.response_headers = dict(response.headers)
        if request.path.startswith(API_PREFIX + "/"):
            self.limits.answered(response)
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

    async def _answer(self, request: web.Request, handler: Handler,
                      record: RecordedRequest) -> web.StreamResponse:
        if not record.route.startswith(f"GET {CDN_PREFIX}/"):
            banned = self.limits.banned()
            if banned is not None:
                return banned
        fault = self._next_fault(record.route)
        if fault is not None and fault.delay_s > 0:
            await asyncio.sleep(fault.delay_s)
        if fault is not None and fault.status is not None and not fault.commit:
            return fault.response()
        if not self._authorized(record):
            return error(401, 0, "401: Unauthorized")
        limited, headers = self.limits.admit(record)
        if limited is not None:
            return limited
        response = await handler(request)
        if fault is not None and fault.commit:
            return fault.response()
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

    # ---- handlers ------------------------------------------------------------------------

    async def _get_gateway(self, request: web.Request) -> web.Response:
        return json_response({"url": self.gateway.url})

    async def _get_bot_gateway(self, request: web.Request) -> web.Response:
        return json_response(self.gateway.bot_gateway())

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        entry = self.cdn.get("/" + request.match_info["path"])
        if entry is None:
            return web.Response(status=404, text="not found")
        if entry.delay_s > 0:
            await asyncio.sleep(entry.delay_s)
        if entry.redirect_to is not None:
            return web.Response(status=302, headers={"Location": entry.redirect_to})
        if not entry.chunked:
            return web.Response(status=entry.status, body=entry.data,
                                headers={"Content-Type": entry.content_type})
        response = web.StreamResponse(status=entry.status,
                                      headers={"Content-Type": entry.content_type})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(entry.data), 16 * 1024):
            await response.write(entry.data[start : start + 16 * 1024])
        await response.write_eof()
        return response


@contextmanager
def pointed_at(emulator: DiscordEmulator) -> Iterator[None]:
    """Point discord.py's REST base, CDN base and default gateway at `emulator` (started),
    and let its clients beat on the loop's clock (`clock.loop_clock_heartbeats`); restored
    on exit."""
    previous = (discord.http.Route.BASE, discord.Asset.BASE,
                discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
    discord.http.Route.BASE = emulator.base_url
    discord.Asset.BASE = emulator.cdn_base
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(emulator.gateway.url)
    try:
        with loop_clock_heartbeats():
            yield
    finally:
        (discord.http.Route.BASE, discord.Asset.BASE,
         discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) = previous


def _default_client() -> discord.Client:
    return discord.Client(intents=discord.Intents.default())


@asynccontextmanager
async def emulated_discord(
    token: str = DEFAULT_TOKEN, *, client_factory: Callable[[], discord.Client] | None = None,
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
        client = (client_factory or _default_client)()
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
    token: str = DEFAULT_TOKEN, *, client_factory: Callable[[], discord.Client] | None = None,
    setup: Callable[[DiscordEmulator, discord.Client], None] | None = None, shards: int = 1,
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
        client = (client_factory or _default_client)()
        if setup is not None:
            setup(emulator, client)
        try:
            async with running_client(emulator, client):
                yield emulator, client
        except BaseException:
            failed = True
            raise
    await emulator.stop(check=not failed)
