"""The typing indicator of one turn, with a single owner.

Discord shows "is typing" for about 10 s after each ``POST /channels/{id}/typing`` and hides
it as soon as the bot sends a message. Every post is a request against the bot's global
limit of 50 a second (D9), and a reply's messages follow each other a few hundred
milliseconds apart while it streams, so the indicator is posted once when the turn starts,
refreshed on a fixed loop-clock schedule (default every 8 s) while nothing is sent, and
after a message only once the turn has sent nothing more for `retype_after_s` (default 2 s:
a rate-limit wait, a tool call, a slow model) — never between the messages of a stream
(D50). Failures are logged and never reach the turn: a missing indicator is cosmetic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType

import aiohttp
import discord

from .rate_limits import guard_rate_limits

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 8.0
DEFAULT_RETYPE_AFTER_S = 2.0
"""How long after a message the turn must stay silent before the indicator is shown again."""

Trigger = Callable[[], Awaitable[None]]


class TypingIndicator:
    """Refreshes the indicator while started; `stop` is idempotent and awaits the refresher."""

    def __init__(self, trigger: Trigger, *, interval_s: float = DEFAULT_INTERVAL_S,
                 retype_after_s: float = DEFAULT_RETYPE_AFTER_S) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        if retype_after_s < 0:
            raise ValueError("retype_after_s must not be negative")
        self._trigger = trigger
        self.interval_s = interval_s
        self.retype_after_s = retype_after_s
        self._task: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()
        self.posts = 0

    @classmethod
    def for_channel(
        cls, client: discord.Client, channel_id: int, *, interval_s: float = DEFAULT_INTERVAL_S,
        retype_after_s: float = DEFAULT_RETYPE_AFTER_S,
    ) -> TypingIndicator:
        guard_rate_limits(client)  # `stop` cancels a post that may be in a global 429
        channel = client.get_partial_messageable(channel_id)

        async def trigger() -> None:
            await channel.typing()

        return cls(trigger, interval_s=interval_s, retype_after_s=retype_after_s)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, delay_s: float = 0.0) -> None:
        """Show the indicator (after `delay_s`) and keep it fresh. No-op while running."""
        if self.running:
            return
        self._poke.clear()
        self._task = asyncio.create_task(self._run(delay_s), name="typing-indicator")

    def poke(self) -> None:
        """A message just went out and Discord hid the indicator: show it again only if the
        turn then stays silent for `retype_after_s`."""
        if self.running:
            self._poke.set()

    async def stop(self) -> None:
        """Stop refreshing; an in-flight post is cancelled. Safe to call any number of times."""
        task, self._task = self._task, None
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.wait({task})

    async def __aenter__(self) -> TypingIndicator:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _run(self, delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + delay_s
        while True:
            if await self._poked_before(due):
                due = loop.time() + self.retype_after_s
                continue
            await self._post()
            due = max(due + self.interval_s, loop.time())

    async def _poked_before(self, due: float) -> bool:
        """Wait until `due` (loop clock); True, and the poke taken, if a message went out
        first."""
        if not self._poke.is_set():
            if due <= asyncio.get_running_loop().time():
                return False
            try:
                async with asyncio.timeout_at(due):
                    await self._poke.wait()
            except TimeoutError:
                return False
        self._poke.clear()
        return True

    async def _post(self) -> None:
        try:
            await self._trigger()
            self.posts += 1
        except (discord.HTTPException, discord.RateLimited, aiohttp.ClientError, OSError) as exc:
            log.warning("typing indicator post failed: %s", type(exc).__name__)
