"""Replay a recorded stream through the real client: the engine of `stream-file`.

The recording is served over loopback HTTP by `ReplayServer`, read by the same adapter a
live bot would use, and watched by a byte-level `StallWatchdog`, so a test of a recording
exercises the whole path: sockets, SSE parsing, decoding, abort and error mapping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp

from fsm import AbortSignal, PassRequest, ProviderError

from .config import ProviderConfig, ProviderKind
from .factory import build_provider
from .replay_server import ReplayServer, Step
from .result import summarize
from .watchdog import StallWatchdog

DEFAULT_IDLE_TIMEOUT_S = 30.0
STALL_MESSAGE = "no bytes received within the idle timeout"


def replay_request() -> PassRequest:
    """A minimal request: the recording decides the answer, whatever is asked."""
    return PassRequest(context_items=[{"role": "user", "content": "replay"}], function_history=[])


async def stream_file(
    kind: ProviderKind,
    script: bytes | Sequence[Step],
    *,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
) -> dict[str, Any]:
    """The normalized result (see `result.StreamSummary.as_json`) of replaying `script`."""
    async with ReplayServer(script) as server, aiohttp.ClientSession() as session:
        config = ProviderConfig(kind=kind, model="replay", base_url=server.url)
        abort = AbortSignal()
        with StallWatchdog(abort, idle_timeout_s) as watchdog:
            provider = build_provider(config, session, on_bytes=watchdog.touch)
            summary = await summarize(provider.stream(replay_request(), abort))
        if watchdog.stalled:
            summary.error = ProviderError(kind="stall_timeout", message=STALL_MESSAGE)
    return summary.as_json()
