"""Key rotation (G4): which of a provider's API keys to try, in which order.

A provider may hold several keys (several accounts or projects). An auth or rate-limit
failure before any output moves the call to the next key before the engine moves to the
next model; a key that failed auth is benched for a while, so later calls skip it instead of
paying a failed request each time. Keys are known here only by index, so nothing in this
module can leak one. Times are the event loop's clock (virtual time in tests).
"""

from __future__ import annotations

from fsm import ProviderError

AUTH_STATUSES = frozenset({401, 403})
ROTATING_STATUSES = AUTH_STATUSES | {402, 429}


def rotates(error: ProviderError) -> bool:
    """An HTTP answer that is about the key, not the request: another key may succeed."""
    return error.kind == "http" and error.status in ROTATING_STATUSES


class KeyRing:
    """Rotation state shared by every call of one adapter."""

    def __init__(self, count: int, bench_s: float) -> None:
        self._count = count
        self._bench_s = bench_s
        self._benched_until: dict[int, float] = {}
        self._current = 0

    def order(self, now: float) -> list[int]:
        """Key indexes to try for one call: from the last key that worked, benched keys
        last (they are still tried when nothing else is left: a bench is a guess)."""
        if self._count == 0:
            return []
        ring = [(self._current + step) % self._count for step in range(self._count)]
        ready = [i for i in ring if self._benched_until.get(i, 0.0) <= now]
        return ready + [i for i in ring if i not in ready]

    def failed(self, index: int, error: ProviderError, now: float) -> None:
        if error.status in AUTH_STATUSES:
            self._benched_until[index] = now + self._bench_s
        self._current = (index + 1) % self._count

    def worked(self, index: int) -> None:
        self._benched_until.pop(index, None)
        self._current = index

    def benched(self, now: float) -> list[int]:
        return sorted(i for i, until in self._benched_until.items() if until > now)
