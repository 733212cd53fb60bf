"""A byte-level stall watchdog: fires an abort when a stream goes silent.

Touching it is a float update, not a timer re-arm: one loop timer wakes at the current
deadline and, if bytes moved the deadline since, sleeps again until the new one. All times
come from the loop clock, so tests can run it in virtual time.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from fsm import AbortSignal

STALL_REASON = "stall_timeout"


class StallWatchdog:
    """Fire `abort` once no `touch()` has happened for `timeout_s` seconds.

    Use as a context manager inside a running loop; leaving it disarms the timer.
    """

    def __init__(self, abort: AbortSignal, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self._abort = abort
        self._timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + timeout_s
        self._handle: asyncio.TimerHandle | None = None
        self.stalled = False

    def __enter__(self) -> StallWatchdog:
        self._handle = self._loop.call_at(self._deadline, self._check)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def touch(self) -> None:
        self._deadline = self._loop.time() + self._timeout_s

    def _check(self) -> None:
        if self._abort.fired:
            self._handle = None
            return
        if self._loop.time() >= self._deadline:
            self._handle = None
            self.stalled = True
            self._abort.fire(STALL_REASON)
        else:
            self._handle = self._loop.call_at(self._deadline, self._check)
