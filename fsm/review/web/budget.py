"""What one request of the review page may cost, and the worker threads its blocking steps run
in (V3).

Reading journals, telling a turn's story and listing a folder are blocking work in Python;
drawing is a `dot` process. Each runs off the event loop, a few at a time, and within a time
and size budget: a request over budget is answered with one line (503 or 413) and never
holds the loop, and a burst of expensive requests waits for a free worker (or is told the
page is busy) instead of filling the thread pool every other request needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

MB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Budgets:
    """The limits of the review server; the defaults fit journals the bot writes (bounded by
    what one reply may deliver) with a wide margin."""

    journal_bytes: int = 16 * MB
    """A larger file is listed as a problem and never parsed."""
    request_bytes: int = 64 * MB
    """All journals one request reads (a heat map of many) together."""
    heat_journals: int = 200
    """How many journals one heat map draws."""
    work_s: float = 20.0
    """Reading and telling the journals of one request."""
    scan_s: float = 5.0
    """A listing reads new or changed files for this long; the rest are read by the next."""
    dot_s: float = 10.0
    """One `dot` run; it is killed when the time is up."""
    dot_bytes: int = 2 * MB
    """The DOT handed to `dot` (the drawing is bounded by the table, so this is a backstop)."""
    svg_bytes: int = 8 * MB
    """What `dot` may write back."""
    workers: int = 2
    """Blocking steps (reading, telling) at once."""
    drawings: int = 2
    """`dot` processes at once."""


class OverBudget(Exception):
    """A step went past its budget; the message is one line for the reviewer."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


class Workers:
    """A few threads of the page's own: at most `size` blocking steps at once, each answered
    within its time budget. A step over budget keeps its thread until it returns (Python
    cannot stop a thread), so the slot stays taken and the bound holds."""

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self._executor = ThreadPoolExecutor(size, thread_name_prefix=name)
        self._slots = asyncio.Semaphore(size)

    async def run(self, what: str, timeout_s: float, step: Callable[[], T]) -> T:
        """`step()` in a worker thread; OverBudget when no worker was free or it did not
        finish within `timeout_s`."""
        loop = asyncio.get_running_loop()
        acquired = False
        try:
            async with asyncio.timeout(timeout_s):
                await self._slots.acquire()
                acquired = True
                future = loop.run_in_executor(self._executor, step)
                future.add_done_callback(lambda _done: self._slots.release())
                return await asyncio.shield(future)
        except TimeoutError:
            if not acquired:
                raise OverBudget(f"{what}: the review page is busy (every one of its "
                                 f"{self.size} workers stayed taken for {timeout_s:g} s); "
                                 "try again") from None
            raise OverBudget(f"{what}: took longer than {timeout_s:g} s; stopped "
                             "waiting") from None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
