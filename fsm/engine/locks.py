"""Channel locks: one turn per channel, touched by progress, exempt from stale release while
a pass or tool runs (S6), carrying the kill handle of the running pass (S7)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

DEFAULT_STALE_AGE_S = 180.0
DEFAULT_MAX_FOLLOW_UP_INTERRUPTS = 3

KillHandle = Callable[[str], None]


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


@dataclass(eq=False, slots=True)
class ChannelLock:
    """The lock entry of one channel while a turn owns it."""

    channel_id: str
    owner: str
    acquired_at: float
    last_touch: float
    watchdog_depth: int = 0
    stream_kill: KillHandle | None = None
    turn_kill: KillHandle | None = None
    stop_requested: bool = False
    follow_up_interrupts: int = 0
    released: bool = False
    listeners: list[Callable[[ChannelLock], None]] = field(default_factory=list)

    def touch(self, now: float) -> None:
        """Progress seen: the lock is not abandoned (S5)."""
        self.last_touch = now

    @property
    def exempt_from_stale(self) -> bool:
        return self.watchdog_depth > 0


class ChannelLockRegistry:
    """Per-channel locks with touch, watchdog exemption, stale release and kill routing.

    The registry never awaits: it is called from the engine's hot paths and from Discord
    handlers alike, and every operation is a few attribute updates.
    """

    def __init__(
        self,
        stale_age_s: float = DEFAULT_STALE_AGE_S,
        max_follow_up_interrupts: int = DEFAULT_MAX_FOLLOW_UP_INTERRUPTS,
        clock: Callable[[], float] = _loop_time,
    ) -> None:
        if stale_age_s <= 0:
            raise ValueError("stale_age_s must be positive")
        self.stale_age_s = stale_age_s
        self.max_follow_up_interrupts = max_follow_up_interrupts
        self._clock = clock
        self._locks: dict[str, ChannelLock] = {}
        self._carried: dict[str, int] = {}

    def __contains__(self, channel_id: str) -> bool:
        return channel_id in self._locks

    def __len__(self) -> int:
        return len(self._locks)

    def get(self, channel_id: str) -> ChannelLock | None:
        return self._locks.get(channel_id)

    def try_acquire(self, channel_id: str, owner: str) -> ChannelLock | None:
        """Take the channel's lock, or None when another turn holds it (D4)."""
        if channel_id in self._locks:
            return None
        now = self._clock()
        lock = ChannelLock(channel_id=channel_id, owner=owner, acquired_at=now, last_touch=now,
                           follow_up_interrupts=self._carried.pop(channel_id, 0))
        self._locks[channel_id] = lock
        return lock

    def carry_follow_up_interrupts(self, lock: ChannelLock, *, queued_next: bool) -> None:
        """The turn of `lock` is ending. Its follow-up interrupts count against the cap of
        the next turn only when that turn is already queued behind it (S17: the queue takes
        a new lock per message, and a busy channel must not escape the cap that way); an
        idle channel, or one where `/kill` stopped the turn or cleared the queue, starts the
        next turn from zero."""
        if queued_next and not lock.stop_requested:
            self._carried[lock.channel_id] = lock.follow_up_interrupts
        else:
            self._carried.pop(lock.channel_id, None)

    def release(self, lock: ChannelLock) -> bool:
        """Release `lock` if it is still the channel's current lock. Idempotent."""
        if lock.released:
            return False
        lock.released = True
        lock.stream_kill = None
        lock.turn_kill = None
        if self._locks.get(lock.channel_id) is lock:
            del self._locks[lock.channel_id]
        for listener in list(lock.listeners):
            listener(lock)
        return True

    @contextmanager
    def watchdog(self, lock: ChannelLock) -> Iterator[None]:
        """While inside, the lock cannot be released as stale (S6)."""
        lock.watchdog_depth += 1
        lock.touch(self._clock())
        try:
            yield
        finally:
            lock.watchdog_depth -= 1
            lock.touch(self._clock())

    def is_stale(self, lock: ChannelLock, now: float | None = None) -> bool:
        if lock.exempt_from_stale:
            return False
        current = self._clock() if now is None else now
        return current - lock.last_touch >= self.stale_age_s

    def release_stale(self, now: float | None = None) -> list[ChannelLock]:
        """Release every lock idle for the stale age outside a watchdog; returns them."""
        current = self._clock() if now is None else now
        stale = [lock for lock in self._locks.values() if self.is_stale(lock, current)]
        for lock in stale:
            if lock.turn_kill is not None:
                lock.turn_kill("stale_lock")
            self.release(lock)
        return stale

    def set_stream_kill(self, lock: ChannelLock, kill: KillHandle) -> None:
        """Register the running pass's kill handle: exactly one per pass (S7)."""
        lock.stream_kill = kill

    def clear_stream_kill(self, lock: ChannelLock, kill: KillHandle | None = None) -> None:
        if kill is None or lock.stream_kill is kill:
            lock.stream_kill = None

    def request_stop(self, channel_id: str) -> bool:
        """`/kill`: mark the stop and fire the pass's kill handle and the turn's kill.

        Returns whether a turn was running in the channel. What the turn's follow-ups
        counted is dropped: the queue is cleared with it, so no later turn inherits it (S17).
        """
        self._carried.pop(channel_id, None)
        lock = self._locks.get(channel_id)
        if lock is None:
            return False
        lock.stop_requested = True
        stream_kill, turn_kill = lock.stream_kill, lock.turn_kill
        if stream_kill is not None:
            stream_kill("kill")
        if turn_kill is not None and turn_kill != stream_kill:  # bound methods: equal, not same
            turn_kill("kill")
        return True
