"""The turn's workers (stream, tool, look-ups), owned by one `asyncio.TaskGroup` for the
length of the turn's run: when the run ends the group cancels and awaits every worker, so
none the driver started can outlive the turn by being forgotten (S14).

The group lives in a small owner task beside the driver, not in the driver itself, for two
reasons. A worker's failure must reach the driver as an event (S15), never cancel it, as a
group cancels the task it was entered in. And a collaborator that ignores cancellation (a
tool or provider catching `CancelledError`) is the one thing the engine cannot end: the
driver waits for the owner a bounded grace, then cuts it loose with a warning, so it cannot
hold the turn and the channel's lock forever (D4). Each worker runs in a fresh
`contextvars.Context`, so nothing of the machine's task bookkeeping leaks into it.
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

    __slots__ = ("_close", "_grace_s", "_group", "_live", "_name", "_on_crash")

    def __init__(self, name: str, grace_s: float,
                 on_crash: Callable[[BaseException], None]) -> None:
        self._name = name
        self._grace_s = grace_s
        self._on_crash = on_crash
        """Where a worker's unexpected exception goes (the driver's mailbox, S15)."""
        self._group: asyncio.TaskGroup | None = None
        self._close: asyncio.Future[None] | None = None
        self._live: set[asyncio.Task[None]] = set()

    async def own(self, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `body` (the driver) with the group open; however it ends, every worker
        still running is cancelled and awaited (a grace at most) before this returns."""
        loop = asyncio.get_running_loop()
        entered: asyncio.Future[None] = loop.create_future()
        close = self._close = loop.create_future()
        owner = loop.create_task(self._hold(entered, close), name=f"{self._name}-workers",
                                 context=contextvars.Context())
        try:
            await entered
            await body()
        finally:
            self._group = None
            live = bool(self._live)
            self.cancel_all()
            if not close.done():  # cancelled with the owner, by a loop shutting down
                close.set_result(None)
            await self._wait(owner, live)

    async def _hold(self, entered: asyncio.Future[None], close: asyncio.Future[None]) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            if not entered.cancelled():  # the driver was cancelled before the group opened
                entered.set_result(None)
            await close

    async def _wait(self, owner: asyncio.Task[None], live: bool) -> None:
        if not live:
            await owner  # nothing left to wait for: the group closes at once
            return
        _, pending = await asyncio.wait((owner,), timeout=self._grace_s)
        for task in pending:
            log.warning("workers of %s ignore cancellation; abandoned",
                        ", ".join(t.get_name() for t in self._live) or task.get_name())

    @property
    def live(self) -> frozenset[asyncio.Task[None]]:
        """The workers not yet finished: none once the run is over, unless one ignores
        cancellation (then abandoned with a warning)."""
        return frozenset(self._live)

    def spawn(self, work: Work, name: str) -> asyncio.Task[None]:
        """Start `work` as a worker of the group (the turn must be running)."""
        group = self._group
        if group is None:
            work.close()
            raise RuntimeError(f"{name}: no turn is running to own this worker")
        task = group.create_task(self._guard(work, name), name=name,
                                 context=contextvars.Context())
        self._live.add(task)
        task.add_done_callback(self._live.discard)
        return task

    def cancel_all(self) -> None:
        for task in list(self._live):
            task.cancel()

    async def _guard(self, work: Work, name: str) -> None:
        """Run `work` on this task; its failure goes to the driver, never into the group
        (which would cancel the other workers and refuse new ones)."""
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the work's own failure, not a stop
            log.exception("worker %s failed", name)
            self._on_crash(exc)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # it ends this worker, never the turn
            log.error("worker %s ended by %s; its deadline decides", name,
                      type(exc).__name__)
