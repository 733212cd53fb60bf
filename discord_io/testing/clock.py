"""The client's side of time under the emulator.

discord.py beats its gateway heartbeat from a thread on the real clock, while tests run on
the loop's virtual clock (looptime), where a minute of a session passes in milliseconds: a
real-time thread would never beat in time. `loop_clock_heartbeats` swaps that thread for
the same handler driven by a task on the loop's clock — the same payload, interval and
zombie check, so the client beats on its own and the emulated gateway, which no longer asks
for beats, closes a connection whose beats stop. As with the real thread, a beat needs the
loop: while the loop is blocked no beat goes out.

`block_event_loop(seconds)` is such a block (a huge turn, a GC pause): the loop does nothing
for `seconds`, and on the virtual clock those seconds pass all the same.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import discord.gateway
import looptime

log = logging.getLogger("discord.gateway")


class LoopClockKeepAlive(discord.gateway.KeepAliveHandler):
    """discord.py's `KeepAliveHandler`, its thread replaced by a task on the loop's clock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        now = self.ws.loop.time()
        self._last_ack = self._last_send = self._last_recv = now
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = self.ws.loop.create_task(self._beat(), name=self.name)

    async def _beat(self) -> None:
        loop = self.ws.loop
        interval = self.interval or 0.0
        while True:
            await asyncio.sleep(interval)
            if self._stop_ev.is_set():
                return
            if self._last_recv + self.heartbeat_timeout < loop.time():
                log.warning("Shard ID %s has stopped responding to the gateway. "
                            "Closing and restarting.", self.shard_id)
                self.stop()
                await self.ws.close(4000)
                return
            payload = self.get_payload()
            try:
                await self.ws.send_heartbeat(payload)
            except Exception:
                self.stop()
                return
            self._last_send = loop.time()

    def stop(self) -> None:
        super().stop()
        task = self._task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()

    def tick(self) -> None:
        self._last_recv = self.ws.loop.time()

    def beat(self) -> dict[str, Any]:
        self._last_send = self.ws.loop.time()
        return self.get_payload()

    def ack(self) -> None:
        ack_time = self.ws.loop.time()
        self._last_ack = ack_time
        self.latency = ack_time - self._last_send
        if self.latency > 10:
            log.warning(self.behind_msg, self.shard_id, self.latency)


@contextmanager
def loop_clock_heartbeats() -> Iterator[None]:
    """Clients created inside beat on the loop's clock (`LoopClockKeepAlive`)."""
    previous = discord.gateway.KeepAliveHandler
    discord.gateway.KeepAliveHandler = LoopClockKeepAlive  # type: ignore[misc]
    try:
        yield
    finally:
        discord.gateway.KeepAliveHandler = previous  # type: ignore[misc]


def block_event_loop(seconds: float) -> None:
    """Hold the running loop for `seconds` without yielding: nothing else runs meanwhile.
    On looptime's virtual clock the seconds pass at once (every timer due meanwhile is late
    when the loop goes on, as after a real stall); on a real clock this sleeps."""
    loop = asyncio.get_running_loop()
    if isinstance(loop, looptime.LoopTimeEventLoop) and loop.looptime_on:
        # looptime keeps its clock in integer units of its resolution; no public way moves it.
        units = loop._LoopTimeEventLoop__time2int(seconds)  # type: ignore[attr-defined]
        loop._LoopTimeEventLoop__now += units  # type: ignore[attr-defined]
        return
    time.sleep(seconds)
