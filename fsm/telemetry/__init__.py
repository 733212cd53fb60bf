"""Traces and metrics of turns, off unless configured (issue 18 item 3).

The engine neither imports this package nor needs its optional packages
(`pip install 'turn-engine[telemetry]'`: opentelemetry-api/-sdk, the OTLP/HTTP exporter,
prometheus-client). It attaches through the turn's one observer slot:

    from fsm.telemetry import ObserverFanout, TelemetryConfig, build_telemetry

    telemetry = build_telemetry(settings.telemetry)       # None when nothing is switched on
    if telemetry is not None:
        await telemetry.start()                           # the /metrics endpoint, if on
        telemetry.metrics and telemetry.metrics.track_queue_depth(queue.depth)
    observer = ObserverFanout(my_observer, telemetry.observer if telemetry else None)
    ...  Turn(..., observer=observer) / run_generation_turn(..., observer=observer)
    await telemetry.aclose()                              # flushes spans, stops the endpoint

`TelemetryConfig` (pydantic, frozen): `traces` (bool), `otlp_endpoint` (str | None; unset →
the OTEL_EXPORTER_OTLP_* variables), `service_name`, `trace_sample_ratio` (0-1, default 1:
the share of turns traced), `metrics` (bool), `metrics_host`
(default 127.0.0.1), `metrics_port` (default 9464; 0 picks a free port),
`metrics_allowed_hosts` (host names the endpoint answers to besides localhost and IP
addresses). `build_telemetry`
also takes a `tracer_provider` (use the process's own), a `span_exporter` (the tests pass
the SDK's InMemorySpanExporter) and a prometheus `registry`. What is exported is described
in `tracing` (the span tree and its GenAI attributes) and `metrics` (the metric names).
"""

from __future__ import annotations

from .config import TelemetryConfig
from .fanout import ObserverFanout
from .setup import Telemetry, TelemetryUnavailable, build_telemetry

__all__ = ["ObserverFanout", "Telemetry", "TelemetryConfig", "TelemetryUnavailable",
           "build_telemetry"]
