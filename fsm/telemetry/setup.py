"""From a TelemetryConfig to a running telemetry: the observer to hand to turns, the tracer
provider and exporter, the metrics and their endpoint. The optional packages are imported
here, only for what is switched on, so a bot without them runs as long as nothing asks."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .config import TelemetryConfig
from .follow import TurnFollower, TurnListener

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .metrics import MetricsServer, TurnMetrics

EXTRA = "pip install 'turn-engine[telemetry]'"


class TelemetryUnavailable(RuntimeError):
    """Telemetry was switched on but a package it needs is not installed."""


@dataclass(slots=True)
class Telemetry:
    """What `build_telemetry` made: `observer` goes to every turn."""

    observer: TurnFollower
    metrics: TurnMetrics | None = None
    server: MetricsServer | None = None
    tracer_provider: Any = None
    """The SDK TracerProvider this telemetry owns (shut down by `aclose`), else None."""

    async def start(self) -> str | None:
        """Start the metrics endpoint, if metrics are on; returns its URL."""
        if self.server is None:
            return None
        return await self.server.start()

    async def aclose(self) -> None:
        """Stop the endpoint; flush and shut down an owned tracer provider (in a thread: the
        exporter sends synchronously)."""
        if self.server is not None:
            await self.server.stop()
        if self.tracer_provider is not None:
            await asyncio.to_thread(self.tracer_provider.shutdown)


def _tracer(config: TelemetryConfig, tracer_provider: Any, span_exporter: Any) -> tuple[Any, Any]:
    """(tracer, provider we own or None)."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError:
        raise TelemetryUnavailable(f"telemetry.traces is on but opentelemetry-sdk is not "
                                   f"installed: {EXTRA}") from None
    from .tracing import INSTRUMENTATION

    if tracer_provider is not None:
        return tracer_provider.get_tracer(INSTRUMENTATION), None
    owned = TracerProvider(resource=Resource.create({"service.name": config.service_name}),
                           sampler=ParentBased(TraceIdRatioBased(config.trace_sample_ratio)))
    if span_exporter is not None:
        owned.add_span_processor(SimpleSpanProcessor(span_exporter))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TelemetryUnavailable(
                "telemetry.traces is on but opentelemetry-exporter-otlp-proto-http is not "
                f"installed: {EXTRA}") from None
        owned.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
            endpoint=config.otlp_endpoint)))
    return owned.get_tracer(INSTRUMENTATION), owned


def build_telemetry(config: TelemetryConfig, *, tracer_provider: Any = None,
                    span_exporter: Any = None,
                    registry: CollectorRegistry | None = None) -> Telemetry | None:
    """The telemetry `config` asks for, or None when it asks for nothing. Raises
    TelemetryUnavailable (one line, naming the package) when a needed package is missing."""
    if not config.enabled:
        return None
    listeners: list[TurnListener] = []
    owned = None
    metrics = server = None
    if config.traces:
        tracer, owned = _tracer(config, tracer_provider, span_exporter)
        from .tracing import TurnTracer

        listeners.append(TurnTracer(tracer))
    if config.metrics:
        try:
            from .metrics import MetricsServer, TurnMetrics
        except ImportError:
            raise TelemetryUnavailable(f"telemetry.metrics is on but prometheus-client is not "
                                       f"installed: {EXTRA}") from None
        metrics = TurnMetrics(registry)
        server = MetricsServer(metrics, config.metrics_host, config.metrics_port,
                               config.metrics_allowed_hosts)
        listeners.append(metrics)
    return Telemetry(observer=TurnFollower(*listeners), metrics=metrics, server=server,
                     tracer_provider=owned)
