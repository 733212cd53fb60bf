"""Periodic release of abandoned channel locks (S6, D4).

A turn touches its lock on progress and is exempt while a pass or tool runs under the
watchdog; one that stopped touching it for the stale age outside a watchdog is presumed hung.
Releasing its lock wakes the channel queue, which cancels the hung turn and moves on.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from fsm import ChannelLockRegistry

log = logging.getLogger(__name__)

DEFAULT_SWEEP_INTERVAL_S = 30.0


class StaleLockSweeper:
    """Calls `registry.release_stale()` every `interval_s` of loop time while running."""

    def __init__(
        self, registry: ChannelLockRegistry, *, interval_s: float = DEFAULT_SWEEP_INTERVAL_S
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._registry = registry
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self.released = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if not self.running:
            self._task = asyncio.create_task(self._run(), name="stale-lock-sweeper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})

    async def __aenter__(self) -> StaleLockSweeper:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def sweep(self) -> int:
        """One sweep now; returns how many locks were released."""
        stale = self._registry.release_stale()
        for lock in stale:
            log.warning(
                "released stale lock of channel %s (owner %s, idle %.0f s)",
                lock.channel_id,
                lock.owner,
                asyncio.get_running_loop().time() - lock.last_touch,
            )
        self.released += len(stale)
        return len(stale)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            try:
                self.sweep()
            except Exception:
                log.exception("stale lock sweep failed")
            next_at += self.interval_s
