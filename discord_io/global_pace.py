"""The bot's own pace under Discord's global limit, kept where its requests leave (D9, D58).

Discord allows a bot 50 requests a second over all routes but the interaction endpoints, and
unlike a route's bucket the global limit has no headers to follow (Topics › Rate Limits ›
Header Format, Global Rate Limit): a client that does not want its 429s must count for
itself. It must count what Discord counts — every request as it reaches Discord — and two
things made an earlier count, taken as discord.py was asked for a request, miss some:

- discord.py sends a request only after its route's bucket lets it (a channel's sixth
  message in five seconds waits for the bucket to reopen) and sends it again after a 429,
  inside the same call; a request counted when asked may leave seconds later, alongside
  the requests counted then, and a retry was never counted at all.
- A request leaves the bot some time before Discord counts it (the network, or two loaded
  processes on one machine). Counted by when it started, a second of the bot's clock and a
  second of Discord's hold different requests, and Discord's holds more.

So `pace_globally` wraps the request of the aiohttp session discord.py sends through: each
attempt — first sends, retries, bucket-delayed sends — takes room when it is about to be
written, and holds it until its answer has arrived and one second more. Discord counted the
request at some moment between the two, so every request Discord holds in any second of its
clock is held here too: the bot never sends a request the global limit will refuse, however
late requests arrive (the cost: room is held for one round trip longer than Discord holds it).
Typing posts are the one request that may be dropped: one that would have to wait is not
sent (the indicator refreshes every few seconds anyway), so a thousand turns' indicators never
crowd out their replies.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from types import TracebackType
from typing import Any

import aiohttp
import discord

GLOBAL_PACE = 45
"""Requests the client allows itself in any second (Discord's global limit is 50)."""
UNPACED_PATHS = ("/interactions/", "/webhooks/")
"""Interaction endpoints, which the global limit exempts (Topics › Rate Limits)."""
SLACK_S = 0.001
"""How long past a second's end a waiting request sleeps: clocks meet on grids (a virtual
clock's ticks, Discord's milliseconds), and a sleep a rounding error short of the end would
find the oldest answer still held, sleep for nothing and never move a virtual clock on."""
_PACED = "_turn_engine_global_pace"
_reserved: ContextVar[bool] = ContextVar("turn_engine_typing_room", default=False)
"""The current request already holds room (a typing post took it when asked)."""


class GlobalPace:
    """At most `per_second` requests in flight or answered within the last second."""

    def __init__(self, per_second: int = GLOBAL_PACE) -> None:
        self.per_second = per_second
        self._in_flight = 0
        self._answered: deque[float] = deque()
        """When each request of the last second was answered, oldest first."""
        self._lock = asyncio.Lock()
        self._answer = asyncio.Event()
        self.waited = 0
        """How many requests had to wait for room."""
        self.skipped = 0
        """How many typing posts were not sent for want of room."""

    def take_now(self) -> bool:
        """Room for one request at once, taken; False if it would have to wait."""
        if self._lock.locked() or not self._room(asyncio.get_running_loop().time()):
            return False
        self._in_flight += 1
        return True

    async def take(self) -> None:
        """Room for one request, waiting first come, first served until there is some."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            now = loop.time()
            if not self._room(now):
                self.waited += 1
            while not self._room(now):
                if self._answered:
                    await asyncio.sleep(self._answered[0] + 1.0 - now + SLACK_S)
                else:  # every request of the second is still in flight
                    self._answer.clear()
                    await self._answer.wait()
                now = loop.time()
            self._in_flight += 1

    def release(self) -> None:
        """The request taken for has been answered (or failed, or was cancelled): it holds
        its room one second from now."""
        self._in_flight -= 1
        self._answered.append(asyncio.get_running_loop().time())
        self._answer.set()

    def _room(self, now: float) -> bool:
        while self._answered and self._answered[0] + 1.0 <= now:
            self._answered.popleft()
        return self._in_flight + len(self._answered) < self.per_second


def pace_globally(client: discord.Client, per_second: int = GLOBAL_PACE) -> GlobalPace:
    """Pace `client` under the global limit, once; returns the pace, for a look at how often
    it held a request back. `client.http.request` is wrapped to drop a typing post without
    room and to pace the session discord.py sends through (made at login, again at a new
    login): the session's own request is wrapped the first time the client asks for one."""
    http = client.http
    existing = getattr(http, _PACED, None)
    if isinstance(existing, GlobalPace):
        return existing
    pace = GlobalPace(per_second)
    original = http.request

    async def request(route: discord.http.Route, *args: Any, **kwargs: Any) -> Any:
        session = getattr(http, "_HTTPClient__session", None)
        if isinstance(session, aiohttp.ClientSession):
            _pace_session(session, pace)
        if not (route.method == "POST" and route.path.endswith("/typing")):
            return await original(route, *args, **kwargs)
        if not pace.take_now():
            pace.skipped += 1
            return None
        held = _reserved.set(True)
        try:
            return await original(route, *args, **kwargs)
        finally:
            if _reserved.get():  # it never reached the session: give the room back
                pace.release()
            _reserved.reset(held)

    http.request = request  # type: ignore[method-assign]
    setattr(http, _PACED, pace)
    return pace


def _pace_session(session: aiohttp.ClientSession, pace: GlobalPace) -> None:
    if isinstance(vars(session).get("request"), _PacedRequests):
        return
    # An instance attribute on purpose: aiohttp's debug mode warns about any attribute it
    # does not know, so it is set past its __setattr__.
    object.__setattr__(session, "request", _PacedRequests(session.request, pace))


class _PacedRequests:
    """`session.request`, each REST attempt taking room from the pace as it is entered.
    The gateway's websocket and the interaction endpoints pass unpaced."""

    def __init__(self, request: Any, pace: GlobalPace) -> None:
        self._request = request
        self._pace = pace

    def __call__(self, method: str, url: Any, **kwargs: Any) -> Any:
        text = str(url)
        base = discord.http.Route.BASE
        if not text.startswith(base) or text[len(base):].startswith(UNPACED_PATHS):
            return self._request(method, url, **kwargs)
        return _PacedRequest(lambda: self._request(method, url, **kwargs), self._pace)


class _PacedRequest:
    """One attempt: room taken before it is written (and only then the request made, so a
    cancelled wait leaves nothing behind), given back once its answer arrived."""

    def __init__(self, make: Callable[[], Any], pace: GlobalPace) -> None:
        self._make = make
        self._context: Any = None
        self._pace = pace

    async def __aenter__(self) -> aiohttp.ClientResponse:
        if _reserved.get():
            _reserved.set(False)
        else:
            await self._pace.take()
        try:
            self._context = self._make()
            response: aiohttp.ClientResponse = await self._context.__aenter__()
        finally:
            self._pace.release()
        return response

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        await self._context.__aexit__(kind, error, trace)
