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
