"""Three fixes to discord.py's rate-limit bookkeeping that a busy bot meets (D2, D9, D58).

**A cancelled request must not wedge the client.**

discord.py (2.7) clears `HTTPClient._global_over` while a request sleeps off a global 429 and
sets it again only after the sleep. A request cancelled during that sleep never sets it, and
from then on every REST call of the client waits for it forever: the bot stays connected but
can send nothing (no reply, no notice, no typing). This layer cancels requests in flight as a
matter of course (stopping the typing indicator, closing a channel after its grace, a killed
or stale turn, a restart's look-ups), so every client it uses gets `guard_global_rate_limit`:
a cancelled request that leaves the flag cleared sets it again. If another request is still
sleeping off the same limit, the cost is an early retry that Discord answers with another 429,
which discord.py honours.

**Forgetting idle buckets must not cost the whole table per new bucket.** discord.py keeps
one rate-limit bucket per route and channel (and one per interaction token) and, from 256
buckets on, walks all of them for idle ones every time it creates a new one: with a thousand
busy channels that walk was a fifth of the bot's CPU (BENCHMARKS.md 7b), quadratic in the
channels. `amortize_bucket_sweep` walks them only when the table has doubled since the last
walk, so each new bucket costs O(1) on average and the table stays below twice the buckets in
use (and at least the 256 discord.py allows).

**A busy bot must stay under the global limit.** Discord allows a bot 50 requests a second
over all routes and discord.py only reacts to the 429 once it is over; with a thousand
channels answering at once, the sends, typing calls and history reads together exceed it, and
every 429 is an invalid request toward Cloudflare's ban. `pace_globally` (`global_pace`)
keeps the client's requests under it where they leave.

`guard_rate_limits` applies all three to a client, once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import discord

from .global_pace import pace_globally

log = logging.getLogger(__name__)

_GUARDED = "_turn_engine_global_guard"
_AMORTIZED = "_turn_engine_amortized_sweep"
SWEEP_FLOOR = 256
"""discord.py's own threshold: below it, no bucket is ever forgotten."""


def guard_rate_limits(client: discord.Client) -> None:
    """All three, idempotent: every client this layer sends through gets them."""
    guard_global_rate_limit(client)
    amortize_bucket_sweep(client)
    pace_globally(client)


def amortize_bucket_sweep(client: discord.Client) -> None:
    """Replace `client.http`'s per-new-bucket sweep with one that runs when the bucket table
    has doubled since the last sweep (discord.py forgets a bucket idle for 300 s with nothing
    queued; which buckets it forgets is unchanged, only how often it looks)."""
    http = client.http
    buckets = getattr(http, "_buckets", None)
    if getattr(http, _AMORTIZED, False) or not isinstance(buckets, dict) or \
            not callable(getattr(http, "_try_clear_expired_ratelimits", None)):
        return
    next_sweep = SWEEP_FLOOR

    def sweep() -> None:
        nonlocal next_sweep
        table: dict[str, Any] = http._buckets
        if len(table) < next_sweep:
            return
        for key in [key for key, bucket in table.items() if bucket.is_inactive()]:
            del table[key]
        next_sweep = max(SWEEP_FLOOR, 2 * len(table))

    http._try_clear_expired_ratelimits = sweep  # type: ignore[method-assign]
    setattr(http, _AMORTIZED, True)


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
