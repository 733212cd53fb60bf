"""The operator's telemetry settings: what to export and where; everything off by default."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TelemetryConfig(BaseModel):
    """Traces (OpenTelemetry, OTLP over HTTP) and metrics (Prometheus endpoint), each off
    unless switched on. Nested in the bot's settings it reads, e.g.,
    `TURN_TELEMETRY__TRACES=true` and `TURN_TELEMETRY__METRICS_PORT=9464`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    traces: bool = False
    otlp_endpoint: str | None = None
    """Where spans go (`http://127.0.0.1:4318/v1/traces`); unset, the OTLP exporter reads
    the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`."""
    service_name: str = Field(default="turn-engine", min_length=1)
    trace_sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """The share of turns traced, each turn whole or not at all. Spans cost CPU: tracing every
    turn took 1.8 times a typical turn's own instructions (2.5 times its CPU time on a busy
    machine), one turn in ten 1.2 times (the SDK making some 15 spans per traced turn;
    BENCHMARKS.md item 11)."""
    metrics: bool = False
    metrics_host: str = "127.0.0.1"
    """The scrape endpoint listens on this machine only unless told otherwise."""
    metrics_allowed_hosts: tuple[str, ...] = ()
    """Host names the endpoint answers to besides `localhost` and IP addresses (the name a
    scraper in the same network calls it by); any other name is refused, so a web page
    cannot read it by DNS rebinding (V4)."""
    metrics_port: int = Field(default=9464, ge=0, le=65535)

    @property
    def enabled(self) -> bool:
        return self.traces or self.metrics
