"""SIGTERM and Ctrl-C as a request to stop, not an exception.

Left alone, Ctrl-C raises `KeyboardInterrupt` wherever the loop happens to be and SIGTERM
kills the process outright: running replies are cut without their journals and the operator
gets a traceback. Here both only set an event; the bot then stops admitting, ends its turns
politely and closes what it opened (`TurnBot.shutdown`). A second signal while stopping is
ignored: the grace period is bounded anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """Set by a signal (or by `request`), awaited by the process."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.signal_name: str | None = None

    def request(self, name: str = "request") -> None:
        if not self.event.is_set():
            log.info("%s received: stopping", name)
            self.signal_name = name
            self.event.set()

    async def wait(self) -> None:
        await self.event.wait()

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """Route SIGTERM and SIGINT to `request` while inside (where the loop supports it)."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in SIGNALS:
            try:
                loop.add_signal_handler(sig, self.request, sig.name)
            except (NotImplementedError, RuntimeError):
                continue
            installed.append(sig)
        try:
            yield self
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
