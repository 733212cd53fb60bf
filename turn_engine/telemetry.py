"""The bot's and the terminal chat's telemetry (`TURN_TELEMETRY__*`): built from the settings,
started and closed with them, its failures told in the one line an operator gets for any
other setting. Off, nothing here imports an optional package."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fsm import TurnObserver
from fsm.telemetry import ObserverFanout, Telemetry, TelemetryConfig, TelemetryUnavailable
from fsm.telemetry import build_telemetry as _build

from .settings import ConfigurationError
from .startup import StartupError

log = logging.getLogger(__name__)


def build_telemetry(config: TelemetryConfig) -> Telemetry | None:
    """The configured telemetry, None when off; a missing package is a ConfigurationError
    naming the setting and the extra to install."""
    try:
        return _build(config)
    except TelemetryUnavailable as exc:
        raise ConfigurationError([str(exc)]) from None


async def start_telemetry(telemetry: Telemetry | None,
                          queue_depth: Callable[[], float] | None = None) -> None:
    """Open the metrics endpoint (and have it read `queue_depth` at each scrape); a port
    that cannot be listened on is a StartupError naming the setting."""
    if telemetry is None:
        return
    if telemetry.metrics is not None and queue_depth is not None:
        telemetry.metrics.track_queue_depth(queue_depth)
    try:
        url = await telemetry.start()
    except OSError as exc:
        server = telemetry.server
        where = f"{server.host}:{server.port}" if server is not None else "?"
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise StartupError(f"telemetry.metrics_port (TURN_TELEMETRY__METRICS_PORT): cannot "
                           f"listen on {where} ({reason})") from None
    if url is not None:
        log.info("metrics for Prometheus at %s", url)


@contextlib.asynccontextmanager
async def running_telemetry(telemetry: Telemetry | None) -> AsyncIterator[None]:
    """Telemetry started for the block and closed after it (the terminal chat's lifetime)."""
    await start_telemetry(telemetry)
    try:
        yield
    finally:
        if telemetry is not None:
            await telemetry.aclose()


def with_telemetry(observer: TurnObserver | None,
                   telemetry: Telemetry | None) -> TurnObserver | None:
    """The observer a turn gets: `observer` and telemetry's together (either may be absent)."""
    if telemetry is None:
        return observer
    return ObserverFanout(observer, telemetry.observer)
