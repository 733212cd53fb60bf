"""The engine's clock readings on a microsecond grid, so a journal replays exactly.

Journals record times in microseconds and replay runs them on a virtual clock that counts
whole microseconds (looptime). A live reading taken as it is would differ from its replay by
a fraction of a microsecond, and sums of such readings by more; a reading put on the grid
when it is taken makes every interval the engine measures — and every transition time it
journals — a whole number of microseconds, the same live and in replay.
"""

from __future__ import annotations

import asyncio

TICKS_PER_SECOND = 1_000_000


def on_grid(t: float) -> float:
    """`t` (seconds) at the nearest microsecond."""
    return round(t * TICKS_PER_SECOND) / TICKS_PER_SECOND


def reading() -> float:
    """The running loop's clock now, on the grid."""
    return on_grid(asyncio.get_running_loop().time())


class TurnClock:
    """One turn's clock: when it began, and the driver's logical time — when the input it
    is acting on arrived (or the deadline that fired), never the moment the driver got to
    it — so a transition's time, a pass's start and a tool's budget are the same when the
    journal replays. `stop_at` is when a stop was asked for."""

    __slots__ = ("_loop", "logical", "stop_at", "t0")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.t0 = self.logical = self.stop_at = 0.0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.t0 = self.logical = on_grid(self._loop.time())

    @property
    def started(self) -> bool:
        return self._loop is not None

    def now(self) -> float:
        assert self._loop is not None
        return self.logical

    def arrival(self) -> float:
        """An outside input's arrival on the engine's clock (on the grid)."""
        return on_grid(self._loop.time()) if self._loop is not None else self.t0

    @property
    def elapsed(self) -> float:
        return (self._loop.time() if self._loop is not None else 0.0) - self.t0
