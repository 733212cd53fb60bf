"""The driver's mailbox: workers post events, the kill jumps the queue, and the driver waits
on it with a deadline instead of keeping timer handles (DESIGN_NOTES: timers are deadlines)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Mailbox(Generic[T]):
    """Many posters, one reader."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def post(self, item: T) -> None:
        self._items.append(item)
        self._wake()

    def post_urgent(self, item: T) -> None:
        """Put `item` ahead of everything waiting (the kill)."""
        self._items.appendleft(item)
        self._wake()

    def clear(self) -> None:
        self._items.clear()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self, deadline: float | None) -> T | None:
        """The next item, or None once the loop clock reaches `deadline`."""
        if self._items:
            return self._items.popleft()
        loop = asyncio.get_running_loop()
        if deadline is not None and deadline <= loop.time():
            return None
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        handle = None if deadline is None else loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()
        if self._items:
            return self._items.popleft()
        return None


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
