"""The turn's workers (stream, tool, look-ups), owned by one `asyncio.TaskGroup` for the
length of the turn's run: leaving the group cancels and awaits every worker, so none the
driver started can outlive the turn by being forgotten (S14).

Each worker runs in a fresh `contextvars.Context`, so nothing of the machine's task
bookkeeping leaks into it. The group's member is a small keeper around the work: a cancel
reaches the work at once, and the keeper waits for it a bounded grace. A collaborator that
ignores cancellation (a tool or provider catching `CancelledError`) is the one thing the
engine cannot end; past the grace it is cut loose with a warning, so it cannot hold the turn
and the channel's lock forever (D4).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

Work = Coroutine[Any, Any, None]


class Workers:
    """The task group of one turn's run and the workers started in it."""

    __slots__ = ("_grace_s", "_group", "_live", "_on_crash")

    def __init__(self, grace_s: float, on_crash: Callable[[BaseException], None]) -> None:
        self._grace_s = grace_s
        self._on_crash = on_crash
        """Where a worker's unexpected exception goes (the driver's mailbox, S15): never into
        the group, which would cancel the driver."""
        self._group: asyncio.TaskGroup | None = None
        self._live: set[asyncio.Task[None]] = set()

    async def own(self, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `body` (the driver) with the group open; however it ends, every worker
        still running is cancelled and awaited before this returns."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            try:
                await body()
            finally:
                self._group = None
                self.cancel_all()

    def spawn(self, work: Work, name: str) -> asyncio.Task[None]:
        """Start `work` as a worker of the group (the driver's group must be open)."""
        group = self._group
        if group is None:
            work.close()
            raise RuntimeError(f"{name}: no turn is running to own this worker")
        keeper = group.create_task(self._keep(work, name), name=name,
                                   context=contextvars.Context())
        self._live.add(keeper)
        keeper.add_done_callback(self._live.discard)
        return keeper

    def cancel_all(self) -> None:
        for task in list(self._live):
            task.cancel()

    async def _keep(self, work: Work, name: str) -> None:
        loop = asyncio.get_running_loop()
        inner = loop.create_task(work, name=name, context=contextvars.Context())
        try:
            await asyncio.shield(inner)
        except asyncio.CancelledError:
            if not inner.done():
                inner.cancel()
                await self._grace(inner, loop)
        except Exception as exc:  # the work's own failure, not a stop
            log.exception("worker %s failed", name)
            self._on_crash(exc)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # it ends this worker, never the turn
            log.error("worker %s ended by %s; its deadline decides", name,
                      type(exc).__name__)

    async def _grace(self, inner: asyncio.Task[None], loop: asyncio.AbstractEventLoop) -> None:
        """Wait for cancelled work for the grace, whatever else asks to stop meanwhile."""
        until = loop.time() + self._grace_s
        while not inner.done() and (left := until - loop.time()) > 0:
            try:
                await asyncio.wait((inner,), timeout=left)
            except asyncio.CancelledError:
                continue
        if not inner.done():
            log.warning("worker %s ignores cancellation; abandoned", inner.get_name())
        elif not inner.cancelled() and inner.exception() is not None:
            log.warning("worker %s failed as it was stopped: %s", inner.get_name(),
                        type(inner.exception()).__name__)
