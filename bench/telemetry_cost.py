"""Item 11: what telemetry (fsm/telemetry) costs a turn, beside the untraced engine: the
typical turn (see `workload`) run in a row with no observer, with metrics, with traces of
every turn, of one turn in ten, and with both, interleaved in each repeat so a loaded
machine slows them alike. CPU time (the process's), the fastest of the repeats (the run
least disturbed by neighbours sharing the cores and caches), reported as ratios to the
untraced engine: wall time on a shared machine says more about the neighbours than about us.

Spans go through the SDK's synchronous processor to an exporter that drops them, so what is
measured is making and ending the spans (some 15 a turn), not a network: a real bot's OTLP
exporter sends from a thread of its own, in batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsm import TurnObserver
from fsm.telemetry import TelemetryConfig, build_telemetry

from .common import Clock, Section, median, run_async
from .workload import Engine, PlanProvider, check_typical, typical_plan

VARIANTS: dict[str, TelemetryConfig | None] = {
    "untraced engine": None,
    "metrics": TelemetryConfig(metrics=True),
    "traces, every turn": TelemetryConfig(traces=True),
    "traces, 1 turn in 10": TelemetryConfig(traces=True, trace_sample_ratio=0.1),
    "traces (every turn) and metrics": TelemetryConfig(traces=True, metrics=True),
}


class DroppingExporter:
    """A span exporter that keeps nothing (the SDK's SpanExporter interface)."""

    exported = 0

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


async def turns_in_a_row(turns: int, config: TelemetryConfig | None
                         ) -> tuple[float, int, int]:
    """CPU seconds for `turns` typical turns with `config`'s telemetry; how many turns the
    metrics counted and how many spans were exported (checks that the observer really ran)."""
    engine = Engine(journal=False)
    plan = typical_plan()
    exporter = DroppingExporter()
    telemetry = build_telemetry(config, span_exporter=exporter) if config else None
    observer: TurnObserver | None = telemetry.observer if telemetry else None

    async def one() -> None:
        turn, lock, _channel = engine.turn("bench", PlanProvider(plan), observer=observer)
        try:
            check_typical(await turn.run(), plan)
        finally:
            engine.locks.release(lock)

    await one()  # warm
    with Clock() as clock:
        for _ in range(turns):
            await one()
    counted = 0
    if telemetry is not None and telemetry.metrics is not None:
        counted = int(telemetry.metrics.registry.get_sample_value(
            "turn_engine_turns_total", {"terminal_state": "Done", "status": "completed"}) or 0)
        assert counted == turns + 1, counted
    if telemetry is not None:
        await telemetry.aclose()
    return clock.cpu, counted, exporter.exported


def measure(turns: int = 500, repeats: int = 3) -> Section:
    section = Section("telemetry_cost",
                      f"11. Telemetry's cost per turn (typical turn, {turns:,} in a row, CPU)")
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, config in VARIANTS.items():
            seconds, _counted, _spans = run_async(lambda c=config: turns_in_a_row(turns, c))
            cpu[name].append(seconds)
    base = min(cpu["untraced engine"])
    base_median = median(cpu["untraced engine"])
    section.add("untraced engine, CPU per turn", 1e6 * base / turns, "µs",
                note=f"no observer, journal off; median {1e6 * base_median / turns:.0f} µs")
    for name in list(VARIANTS)[1:]:
        value = min(cpu[name])
        section.add(f"{name} / untraced engine", value / base, "× CPU",
                    note=f"{1e6 * value / turns:.0f} µs CPU per turn; ratio of medians "
                         f"{median(cpu[name]) / base_median:.2f}")
    section.details["cpu_s"] = cpu
    section.details["turns"] = turns
    section.details["repeats"] = repeats
    return section


WORKLOAD = """
import asyncio, sys
from bench.telemetry_cost import VARIANTS, turns_in_a_row
asyncio.run(turns_in_a_row(int(sys.argv[2]), VARIANTS[sys.argv[1]]))
"""


def instructions_per_turn(name: str, turns: int = 10) -> float:
    """Instructions (valgrind's callgrind) of one typical turn with variant `name`: a run of
    `turns` and one of 2 × `turns`, the difference divided by `turns` (start-up cancels)."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from .common import ROOT

    counts = []
    for n in (turns, 2 * turns):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "callgrind.out"
            subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                            sys.executable, "-c", WORKLOAD, name, str(n)],
                           check=True, capture_output=True, cwd=ROOT)
            totals = [line for line in out.read_text(encoding="utf-8").splitlines()
                      if line.startswith(("summary:", "totals:"))]
            counts.append(int(totals[0].split()[1]))
    return (counts[1] - counts[0]) / turns


if __name__ == "__main__":
    # `python -m bench.telemetry_cost`: the same variants in instructions, which a loaded
    # machine does not change (a few minutes under valgrind).
    base = instructions_per_turn("untraced engine")
    print(f"| variant | instructions per turn | ratio |\n|---|---:|---:|\n"
          f"| untraced engine | {base:,.0f} | 1.00 |", flush=True)
    for variant in list(VARIANTS)[1:]:
        count = instructions_per_turn(variant)
        print(f"| {variant} | {count:,.0f} | {count / base:.2f} |", flush=True)
