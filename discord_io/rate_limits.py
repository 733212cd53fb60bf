"""Keep discord.py's global rate limit from wedging a client when a request is cancelled (D2).

discord.py (2.7) clears `HTTPClient._global_over` while a request sleeps off a global 429 and
sets it again only after the sleep. A request cancelled during that sleep never sets it, and
from then on every REST call of the client waits for it forever: the bot stays connected but
can send nothing (no reply, no notice, no typing). This layer cancels requests in flight as a
matter of course (stopping the typing indicator, closing a channel after its grace, a killed
or stale turn, a restart's look-ups), so every client it uses gets `guard_global_rate_limit`:
a cancelled request that leaves the flag cleared sets it again. If another request is still
sleeping off the same limit, the cost is an early retry that Discord answers with another 429,
which discord.py honours.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import discord

log = logging.getLogger(__name__)

_GUARDED = "_turn_engine_global_guard"


def guard_global_rate_limit(client: discord.Client) -> None:
    """Wrap `client.http.request` once so a cancellation never leaves the global flag cleared."""
    http = client.http
    if getattr(http, _GUARDED, False):
        return
    original = http.request

    async def request(*args: Any, **kwargs: Any) -> Any:
        try:
            return await original(*args, **kwargs)
        except asyncio.CancelledError:
            over = getattr(http, "_global_over", None)
            if isinstance(over, asyncio.Event) and not over.is_set():
                log.warning("a request cancelled during a global rate limit; lifting the wait")
                over.set()
            raise

    http.request = request  # type: ignore[method-assign]
    setattr(http, _GUARDED, True)
