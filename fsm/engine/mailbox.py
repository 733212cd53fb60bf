"""The driver's mailbox: workers post events, the kill jumps the queue, and the driver waits
on it with a deadline instead of keeping timer handles (docs/architecture.md: timers are deadlines).

Every item is stamped with when it arrived, as the engine's clock saw it (on the
microsecond grid, `clock.on_grid`): the driver times the transition an event causes by its
arrival, not by when the driver got round to it, and handles what arrived before a kill
before the kill, so a journal replays exactly."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from .clock import on_grid

T = TypeVar("T")


class Mailbox(Generic[T]):
    """Many posters, one reader."""

    __slots__ = ("_items", "_waiter", "received_at")

    def __init__(self) -> None:
        self._items: deque[tuple[float, T]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.received_at = 0.0
        """When the item `get` returned last arrived (loop clock, microsecond grid)."""

    def __len__(self) -> int:
        return len(self._items)

    def post(self, item: T, at: float | None = None) -> None:
        """Post `item`; `at` is the clock reading of the input it reports (default: now)."""
        self._items.append((self._stamp(at), item))
        self._wake()

    def post_urgent(self, item: T, at: float | None = None) -> None:
        """The kill: it wakes the driver at once, and the driver honours it before reading
        anything that arrived after it (`Turn._step` checks for a stop first). What
        arrived before it still comes first, so items stay in arrival order."""
        self.post(item, at)

    def arrived_before(self, at: float) -> bool:
        """An item that arrived before `at` waits to be read."""
        return bool(self._items) and self._items[0][0] < at

    def take_earliest(self) -> T:
        """The waiting item that arrived first (there must be one)."""
        return self._take()

    def put_back(self, item: T, at: float) -> None:
        """Return the item `get` just gave, to be read first next time (it arrived after a
        deadline the driver must handle before it)."""
        self._items.appendleft((at, item))

    @staticmethod
    def _stamp(at: float | None) -> float:
        if at is None:
            try:
                at = asyncio.get_running_loop().time()
            except RuntimeError:  # posted before the turn runs: it arrives as it starts
                return 0.0
        return on_grid(at)

    def clear(self) -> None:
        self._items.clear()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self, deadline: float | None) -> T | None:
        """The next item, or None once the loop clock reaches `deadline`. An item landing
        at the deadline's very instant is on time (a budget includes its last instant),
        whichever of the two the loop ran first: its task runs before this decides."""
        if self._items:
            return self._take()
        loop = asyncio.get_running_loop()
        if deadline is None or deadline > loop.time():
            await self._wait(loop, deadline)
        if not self._items:
            await asyncio.sleep(0)
        return self._take() if self._items else None

    async def _wait(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> None:
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        handle = None if deadline is None else loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    def _take(self) -> T:
        self.received_at, item = self._items.popleft()
        return item


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
