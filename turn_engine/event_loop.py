"""The bot process's event loop: uvloop where it is installed, asyncio's own otherwise.

uvloop runs the same asyncio code on libuv and takes a few per cent off a turn's CPU, more
with orjson beside it (BENCHMARKS.md 7f). It is a dependency on Linux and macOS only (it
does not build on Windows), so a process without it runs on asyncio's loop and says so in
one log line; `TURN_EVENT_LOOP=asyncio` chooses asyncio's loop where uvloop is installed
too. Tests run on looptime's loop (virtual time) and are unaffected by either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from importlib.metadata import version
from typing import Any, Literal, TypeVar

log = logging.getLogger(__name__)

EventLoopChoice = Literal["uvloop", "asyncio"]
"""`uvloop` (the default: uvloop where installed) or `asyncio` (asyncio's own loop)."""

T = TypeVar("T")


def loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the process's loop for `choice`, after one log line naming it."""
    if choice == "asyncio":
        log.info("event loop: asyncio (TURN_EVENT_LOOP=asyncio)")
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        log.info("event loop: asyncio (uvloop is not installed)")
        return asyncio.new_event_loop
    log.info("event loop: uvloop %s", version("uvloop"))
    return uvloop.new_event_loop


def run_on_event_loop(main: Coroutine[Any, Any, T], choice: EventLoopChoice) -> T:
    """`asyncio.run(main)` on the loop `choice` names."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
