"""Smoke test of the telemetry-cost benchmark (`python -m bench --only telemetry_cost`): each
variant runs typical turns with its telemetry really attached (the metrics count every turn,
the traces reach the exporter), and the figures are well formed. No timing is asserted."""

from __future__ import annotations

import asyncio
import math

from bench.telemetry_cost import VARIANTS, measure, turns_in_a_row
from fsm.telemetry import TelemetryConfig


def test_every_variant_runs_with_its_telemetry_and_reports_ratios() -> None:
    # covers issue 18 item 3 (telemetry's cost measured beside the untraced engine)
    section = measure(turns=2, repeats=1)
    assert [f.name for f in section.figures] == [
        "untraced engine, CPU per turn",
        *(f"{name} / untraced engine" for name in list(VARIANTS)[1:])]
    assert all(math.isfinite(f.value) and f.value > 0 for f in section.figures)
    _cpu, counted, spans = asyncio.run(turns_in_a_row(3, TelemetryConfig(metrics=True)))
    assert (counted, spans) == (4, 0)
    _cpu, counted, spans = asyncio.run(turns_in_a_row(3, TelemetryConfig(traces=True)))
    assert counted == 0 and spans >= 4 * 10  # four turns (one warming) of a dozen spans each
