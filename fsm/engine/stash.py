"""The side-channel stash for bulky enrichment media (R3, R4).

Tools put a multi-megabyte item here and return only its key, so the tool registry's history
of recent results never pins the media. Items live at most `ttl_s`, the stash holds at most
`max_items` (oldest dropped first) and at most `max_bytes` in all, and taking an item removes
it, so a later restart can never replay stale media.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 300.0
DEFAULT_MAX_ITEMS = 16
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


def item_size(item: Any) -> int:
    """Approximate size of a context item: raw bytes count as themselves, the rest as JSON."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return len(item)
    if isinstance(item, dict):
        return sum(item_size(key) + item_size(value) for key, value in item.items())
    if isinstance(item, (list, tuple)):
        return sum(item_size(value) for value in item)
    if isinstance(item, str):
        return len(item.encode("utf-8", "surrogatepass"))
    return len(json.dumps(item, default=str))


@dataclass(slots=True)
class _Entry:
    item: Any
    stored_at: float
    size: int


class StashFull(ValueError):
    """An item larger than the whole stash budget: refused, not stored."""


class ContextStash:
    """Bounded, expiring, single-drain storage keyed by unguessable tokens."""

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        max_items: int = DEFAULT_MAX_ITEMS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = _loop_time,
    ) -> None:
        if ttl_s <= 0 or max_items <= 0 or max_bytes <= 0:
            raise ValueError("stash ttl_s, max_items and max_bytes must be positive")
        self.ttl_s = ttl_s
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def live_count(self) -> int:
        """Items still held: expired ones are dropped first (an item lives at most `ttl_s`)."""
        self._expire(self._clock())
        return len(self._entries)

    def put(self, item: Any) -> str:
        """Store `item`, evicting expired then oldest entries to stay within bounds."""
        size = item_size(item)
        if size > self.max_bytes:
            raise StashFull(f"item of {size} bytes exceeds the stash budget of {self.max_bytes}")
        now = self._clock()
        self._expire(now)
        while self._entries and (
            len(self._entries) >= self.max_items or self._bytes + size > self.max_bytes
        ):
            key, entry = self._entries.popitem(last=False)
            self._bytes -= entry.size
            log.info("stash full: dropped oldest item %s…", key[:6])
        key = secrets.token_urlsafe(16)
        self._entries[key] = _Entry(item=item, stored_at=now, size=size)
        self._bytes += size
        return key

    def peek(self, key: str) -> Any | None:
        """The item under `key` without taking it (a journal recording what a tool stashed),
        or None when unknown."""
        entry = self._entries.get(key)
        return entry.item if entry is not None else None

    def take(self, key: str) -> Any | None:
        """Remove and return the item, or None when unknown, expired or already taken."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        self._bytes -= entry.size
        if self._clock() - entry.stored_at >= self.ttl_s:
            return None
        return entry.item

    def _expire(self, now: float) -> None:
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.stored_at < self.ttl_s:
                break
            del self._entries[key]
            self._bytes -= entry.size
