"""A worker's pub/sub inbox: /kill and follow-ups published by the scripts of other
processes reach the lease owner here. Pub/sub may drop a message (a reconnect, a slow
reader); the stop flag also comes back with the next renewal, so a kill is never lost.

A signal is `{"op": "kill", "channel": C, "fence": F}` or `{"op": "follow_up", "channel":
C, "author": A, "fence": F}`; F names the turn it was meant for (the lease's fencing token
then), so a late or replayed one cannot act on a later turn of the channel (V7). Anything
else is logged and dropped."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

RECONNECT_DELAY_S = 0.5


class WorkerInbox:
    """Listens on the worker's channel and dispatches `kill` and `follow_up` signals."""

    def __init__(
        self,
        redis: Redis,
        channel: str,
        *,
        on_kill: Callable[[str, int], None],
        on_follow_up: Callable[[str, int, int], None],
    ) -> None:
        self._redis = redis
        self.channel = channel
        self._on_kill = on_kill
        self._on_follow_up = on_follow_up
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()
        self.received = 0
        self.dropped = 0

    async def start(self) -> None:
        """Start listening; returns once subscribed (or after the first failure, which the
        listener keeps retrying)."""
        if self._task is None:
            self._task = asyncio.create_task(self._listen(), name=f"inbox:{self.channel}")
        waiter = asyncio.create_task(self.subscribed.wait())
        await asyncio.wait({waiter, self._task}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    async def _listen(self) -> None:
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                self.subscribed.set()
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self.dispatch(message["data"])
            except (RedisError, OSError) as exc:
                self.subscribed.clear()
                log.warning("worker inbox %s: %s; resubscribing", self.channel,
                            type(exc).__name__)
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(RECONNECT_DELAY_S)

    def dispatch(self, data: object) -> None:
        """Act on one signal; a malformed one is logged and dropped."""
        try:
            signal = json.loads(data) if isinstance(data, (bytes, str)) else None
            if not isinstance(signal, dict):
                raise ValueError("not a JSON object")
            op, channel_id = signal.get("op"), signal.get("channel")
            if not isinstance(channel_id, str) or not channel_id or len(channel_id) > 64:
                raise ValueError("channel missing or not an id")
            fence = int(_whole(signal, "fence"))
            if op == "kill":
                self.received += 1
                self._on_kill(channel_id, fence)
            elif op == "follow_up":
                author = int(_whole(signal, "author"))
                self.received += 1
                self._on_follow_up(channel_id, author, fence)
            else:
                raise ValueError("unknown op")
        except (ValueError, RecursionError) as exc:
            self.dropped += 1
            log.warning("worker inbox %s: malformed signal dropped (%s)", self.channel,
                        str(exc)[:80])


def _whole(signal: dict[str, Any], name: str) -> str:
    """A field that must be a whole number (an id, a fence), as its digits."""
    value = signal.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not (value.isascii() and value.isdigit()) \
            or len(value) > 20:
        raise ValueError(f"{name} missing or not a whole number")
    return value
