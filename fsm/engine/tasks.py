"""How the driver starts a worker (stream, tool, look-ups): in a fresh context, so nothing of
the machine's task bookkeeping leaks into it."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any


def spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """A worker task in a fresh `contextvars.Context`."""
    return asyncio.get_running_loop().create_task(coro, name=name, context=contextvars.Context())
