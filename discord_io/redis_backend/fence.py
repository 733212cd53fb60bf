"""The send gate: a request made on behalf of a leased turn goes out only while the lease
is held.

The turn's tasks (delivery pump, typing indicator) inherit the lease through a context
variable; discord.py's HTTP session calls the trace hook right before each request (and
each retry after a rate-limit wait), which refuses it once the lease is no longer held. What
stays unfenced is the request already past this hook: see docs/redis.md.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from types import SimpleNamespace

import aiohttp

from .lease import Lease

current_lease: ContextVar[Lease | None] = ContextVar("current_lease", default=None)
"""The lease of the turn the running task works for; None outside a leased turn."""

UNFENCED_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class LeaseLostError(aiohttp.ClientError):
    """A write to Discord refused because the turn's lease is no longer held."""


def check_lease(method: str) -> None:
    """Raise `LeaseLostError` when a write is attempted for a turn that lost its lease."""
    lease = current_lease.get()
    if lease is None or method.upper() in UNFENCED_METHODS:
        return
    if not lease.held(asyncio.get_running_loop().time()):
        raise LeaseLostError(
            f"channel {lease.channel_id}: lease (fence {lease.fence}) no longer held; "
            "not sending"
        )


async def _on_request_start(
    _session: aiohttp.ClientSession,
    _context: SimpleNamespace,
    params: aiohttp.TraceRequestStartParams,
) -> None:
    check_lease(params.method)


def fencing_trace() -> aiohttp.TraceConfig:
    """A trace config for `discord.Client(http_trace=...)` that applies the send gate."""
    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(_on_request_start)
    return trace
