"""One turn per channel, the rest in a bounded FIFO queue (D4).

Each busy channel has one worker task that takes the channel's lock, runs the turn through
the injected `run_turn(message, lock)`, and releases the lock however the turn ends
(return, exception, cancellation) before starting the next queued message. When the lock is
released under a running turn (the stale sweeper gave up on it), the worker gives the turn
a short grace to unwind, then cancels it and moves on. Nothing is dropped silently: a full
queue, or a channel whose turn is being killed, is refused with text the caller posts (for a
full queue, once per sender per window: spam must not spend the channel's send budget).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from fsm import ChannelLock, ChannelLockRegistry

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUED = 10
DEFAULT_STALE_GRACE_S = 5.0
DEFAULT_REFUSAL_WINDOW_S = 60.0
_REFUSALS_REMEMBERED = 1024

QUEUE_FULL_TEXT = (
    "I'm still working through earlier messages in this channel, so I can't take this one "
    "right now. Please send it again in a little while."
)
STOPPING_TEXT = "I'm stopping the current reply here; please send that again in a moment."

M = TypeVar("M")

SubmitStatus = Literal["started", "queued", "full", "stopping", "duplicate", "unavailable"]
"""`duplicate` (a second delivery of one message) and `unavailable` (the shared queue cannot
be reached) come from the Redis backend only."""


@dataclass(frozen=True, slots=True)
class Submission:
    """What happened to a submitted message; `refusal` is set when it was not accepted."""

    status: SubmitStatus
    position: int = 0
    refusal: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status in ("started", "queued")


def _setter(event: asyncio.Event) -> Callable[[ChannelLock], None]:
    """A lock listener that sets `event` when the lock is released."""

    def on_release(_lock: ChannelLock) -> None:
        event.set()

    return on_release


class ChannelQueue(Generic[M]):
    """Runs turns one channel at a time through `run_turn`, queueing the rest."""

    def __init__(
        self,
        registry: ChannelLockRegistry,
        run_turn: Callable[[M, ChannelLock], Awaitable[None]],
        *,
        max_queued: int = DEFAULT_MAX_QUEUED,
        owner_of: Callable[[M], str] = lambda _message: "queued-turn",
        on_queued: Callable[[str, M], None] | None = None,
        stale_grace_s: float = DEFAULT_STALE_GRACE_S,
        user_of: Callable[[M], str] = lambda _message: "",
        refusal_window_s: float = DEFAULT_REFUSAL_WINDOW_S,
    ) -> None:
        """`user_of` names a message's sender: beyond a full queue each sender is told once
        per `refusal_window_s` per channel (loop clock), so spam cannot spend the channel's
        send budget on refusals; later messages in the window are refused without text."""
        if max_queued < 0:
            raise ValueError("max_queued must not be negative")
        self._registry = registry
        self._run_turn = run_turn
        self.max_queued = max_queued
        self._owner_of = owner_of
        self._on_queued = on_queued
        self.stale_grace_s = stale_grace_s
        self._user_of = user_of
        self.refusal_window_s = refusal_window_s
        self._refused_at: dict[tuple[str, str], float] = {}
        self._queues: dict[str, deque[M]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}

    def submit(self, channel_id: str, message: M) -> Submission:
        """Run `message` now if the channel is free, else queue it (or refuse it)."""
        lock = self._registry.get(channel_id)
        if lock is not None and lock.stop_requested:
            return Submission("stopping", refusal=STOPPING_TEXT)
        queue = self._queues.setdefault(channel_id, deque())
        busy = channel_id in self._workers
        if busy and len(queue) >= self.max_queued:
            text = QUEUE_FULL_TEXT if self._refusal_due(channel_id, message) else None
            return Submission("full", position=len(queue), refusal=text)
        if not busy:
            self._workers[channel_id] = asyncio.create_task(
                self._work(channel_id, message), name=f"channel-queue:{channel_id}"
            )
            return Submission("started")
        queue.append(message)
        if self._on_queued is not None:
            self._on_queued(channel_id, message)
        return Submission("queued", position=len(queue))

    def _refusal_due(self, channel_id: str, message: M) -> bool:
        """True for the sender's first refusal in this channel within the window."""
        now = asyncio.get_running_loop().time()
        key = (channel_id, self._user_of(message))
        last = self._refused_at.get(key)
        if last is not None and now - last < self.refusal_window_s:
            return False
        if len(self._refused_at) >= _REFUSALS_REMEMBERED:
            self._refused_at = {k: t for k, t in self._refused_at.items()
                                if now - t < self.refusal_window_s}
        self._refused_at[key] = now
        return True

    def clear(self, channel_id: str, *, user: str | None = None) -> int:
        """Drop the channel's waiting messages (for /kill), or only those `user` sent (as
        `user_of` names senders); returns how many."""
        queue = self._queues.get(channel_id)
        if not queue:
            return 0
        if user is None:
            dropped = len(queue)
            queue.clear()
            return dropped
        kept = [message for message in queue if self._user_of(message) != user]
        dropped = len(queue) - len(kept)
        queue.clear()
        queue.extend(kept)
        return dropped

    def pending(self, channel_id: str) -> tuple[M, ...]:
        """The channel's waiting messages, next first."""
        return tuple(self._queues.get(channel_id, ()))

    def waiting(self) -> int:
        """Messages waiting in every channel (the queue-depth metric, read at each scrape)."""
        return sum(len(queue) for queue in self._queues.values())

    def busy(self, channel_id: str) -> bool:
        return channel_id in self._workers

    async def join(self, channel_id: str) -> None:
        """Wait until the channel has no running or waiting turn."""
        while (worker := self._workers.get(channel_id)) is not None:
            await asyncio.wait({worker})

    async def aclose(self) -> None:
        """Cancel every worker (and its running turn); locks are released on the way out."""
        workers = list(self._workers.values())
        for worker in workers:
            worker.cancel()
        if workers:
            await asyncio.wait(workers)
        self._queues.clear()

    async def _work(self, channel_id: str, first: M) -> None:
        queue = self._queues[channel_id]
        try:
            await self._run_one(channel_id, first)
            while queue:
                await self._run_one(channel_id, queue.popleft())
        finally:
            if self._workers.get(channel_id) is asyncio.current_task():
                del self._workers[channel_id]
            if not queue and self._queues.get(channel_id) is queue:
                del self._queues[channel_id]

    async def _run_one(self, channel_id: str, message: M) -> None:
        lock = await acquire_lock(self._registry, channel_id, self._owner_of(message))
        await run_supervised(self._registry, lock, lambda: self._guarded(channel_id, message, lock),
                             self.stale_grace_s)

    async def _guarded(self, channel_id: str, message: M, lock: ChannelLock) -> None:
        try:
            await self._run_turn(message, lock)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("channel %s: turn failed", channel_id)


async def acquire_lock(registry: ChannelLockRegistry, channel_id: str, owner: str) -> ChannelLock:
    """The channel's lock, waiting for a holder from outside this queue to release it."""
    while True:
        lock = registry.try_acquire(channel_id, owner)
        if lock is not None:
            return lock
        holder = registry.get(channel_id)
        if holder is None:
            continue
        freed = asyncio.Event()
        holder.listeners.append(_setter(freed))
        await freed.wait()


async def run_supervised(registry: ChannelLockRegistry, lock: ChannelLock,
                         run: Callable[[], Coroutine[Any, Any, None]],
                         stale_grace_s: float) -> None:
    """Run one turn under `lock` and release the lock however the turn ends. When the lock is
    released under the turn, the turn gets `stale_grace_s` to unwind, then is cancelled."""
    released = asyncio.Event()
    lock.listeners.append(_setter(released))
    turn = asyncio.create_task(run())
    watcher = asyncio.create_task(released.wait())
    try:
        await asyncio.wait({turn, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not turn.done():
            # Released under the turn: by the stale sweeper (which fired the turn's kill)
            # or by the turn itself on its way out. Let it finish, else cancel it.
            await asyncio.wait({turn}, timeout=stale_grace_s)
        if not turn.done():
            log.warning("channel %s: turn outlived its lock; cancelling it", lock.channel_id)
            turn.cancel()
            await asyncio.wait({turn}, timeout=stale_grace_s)
    finally:
        watcher.cancel()
        if not turn.done():
            turn.cancel()
        registry.release(lock)
