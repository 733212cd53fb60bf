"""Item 6: how per-turn cost and memory grow from 1 to 10,000 concurrent turns.

For each N, in a fresh interpreter:

- *time*: N typical turns started at once (`asyncio.gather`), in as many batches as it takes
  to run at least `min_turns` turns; µs per turn = wall / turns, and the share of wall time
  spent in the garbage collector;
- *memory*: N turns parked awaiting their first token (as in item 4): RSS growth / N, then
  the time to kill them all at once; tracemalloc's growth / N in a second interpreter.

A scaling regression shows as a per-turn figure that rises with N.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from .common import Clock, GcTimer, Section, median, run_async, run_isolated
from .concurrency import inflight
from .whatif import whatif
from .workload import Engine, check_typical, typical_plan

SIZES = (1, 10, 100, 1_000, 10_000)
RECOMMENDED = ("bot process GC settings",)
"""The what-ifs whose growth is shown next to today's engine (see BENCHMARKS.md)."""


async def _concurrent_typical(n: int, batches: int) -> tuple[float, float]:
    engine = Engine(journal=True)
    plan = typical_plan()
    check_typical(await engine.typical_turn("warm", plan), plan)
    with GcTimer() as gc_timer, Clock() as clock:
        for _ in range(batches):
            results = await asyncio.gather(*(engine.typical_turn(f"g{i}", plan)
                                             for i in range(n)))
    for result in (results[0], results[-1]):
        check_typical(result, plan)
    return clock.wall, gc_timer.total


def row(n: int, repeats: int = 3, min_turns: int = 2000, parked: bool = True,
        what_if: str = "") -> dict[str, Any]:
    """One row of the table (call it in a fresh process)."""
    out: dict[str, Any] = {"n": n}
    if parked:
        out["parked"] = inflight(turns=n, sample=0, what_if=what_if)
    batches = max(1, math.ceil(min_turns / n))
    walls, gcs = [], []
    with whatif(what_if):
        for _ in range(repeats):
            wall, gc_s = run_async(lambda: _concurrent_typical(n, batches))
            walls.append(wall)
            gcs.append(gc_s)
    turns = batches * n
    out["us_per_turn"] = 1e6 * median(walls) / turns
    out["gc_pct"] = 100 * median(gcs) / median(walls)
    out["turns"] = turns
    return out


def measure(sizes: tuple[int, ...] = SIZES, repeats: int = 3, min_turns: int = 2000,
            isolated: bool = True, known: dict[int, dict[str, Any]] | None = None,
            large: int = 10_000, repeats_large: int = 1,
            what_ifs: tuple[str, ...] = RECOMMENDED) -> Section:
    """`known`: parked-turn results already measured in this run (item 4), by N. Rows of
    `large` turns or more are timed `repeats_large` times (one such run takes a minute)."""
    section = Section("growth", "6. Growth from 1 to 10,000 concurrent turns")
    known = known or {}
    rows = []
    for n in sizes:
        parked_known = known.get(n)
        kwargs = {"n": n, "repeats": repeats if n < large else repeats_large,
                  "min_turns": min_turns,
                  "parked": parked_known is None}
        result = run_isolated("growth", "row", kwargs) if isolated else row(**kwargs)
        if parked_known is not None:
            result["parked"] = parked_known["plain"]
            traced = parked_known["traced"]
        else:
            t_kwargs = {"turns": n, "sample": 0, "traced": True}
            traced = run_isolated("concurrency", "inflight", t_kwargs) if isolated \
                else inflight(**t_kwargs)  # type: ignore[arg-type]
        parked = result["parked"]
        rows.append({
            "n": n,
            "us_per_turn": result["us_per_turn"],
            "turns_per_s": 1e6 / result["us_per_turn"],
            "gc_pct": result["gc_pct"],
            "start_us_per_turn": 1e6 * parked["spawn_s"] / n,
            "rss_kb_per_turn": parked["rss_per_turn_b"] / 1024,
            "traced_kb_per_turn": traced["traced_per_turn_b"] / 1024,
            "kill_all_ms": 1e3 * parked["kill_all_stopped_s"],
            "kill_all_gc_ms": 1e3 * parked["kill_all_gc_s"],
            "repeats": kwargs["repeats"],
        })
        last = rows[-1]
        section.add(f"N={n:,}: µs per typical turn ({n:,} at once)", last["us_per_turn"], "µs",
                    note=f"GC {last['gc_pct']:.0f} % of wall")
        section.add(f"N={n:,}: KB per parked turn (tracemalloc)", last["traced_kb_per_turn"],
                    "KB", note=f"RSS {last['rss_kb_per_turn']:.1f} KB")
        section.add(f"N={n:,}: kill all parked", last["kill_all_ms"], "ms",
                    note=f"GC {last['kill_all_gc_ms']:.0f} ms")
    section.details["whatif_rows"] = {}
    for what_if in what_ifs:
        alt_rows = []
        for n in sizes:
            kwargs = {"n": n, "repeats": repeats if n < large else repeats_large,
                      "min_turns": min_turns, "what_if": what_if}
            result = run_isolated("growth", "row", kwargs) if isolated else row(**kwargs)
            parked = result["parked"]
            alt_rows.append({
                "n": n, "us_per_turn": result["us_per_turn"],
                "turns_per_s": 1e6 / result["us_per_turn"], "gc_pct": result["gc_pct"],
                "start_us_per_turn": 1e6 * parked["spawn_s"] / n,
                "rss_kb_per_turn": parked["rss_per_turn_b"] / 1024,
                "kill_all_ms": 1e3 * parked["kill_all_stopped_s"],
                "kill_all_gc_ms": 1e3 * parked["kill_all_gc_s"],
                "repeats": kwargs["repeats"],
            })
            section.add(f"what-if {what_if}, N={n:,}: µs per typical turn",
                        result["us_per_turn"], "µs", note=f"GC {result['gc_pct']:.0f} % of wall")
        section.details["whatif_rows"][what_if] = alt_rows
    if len(rows) >= 2:
        first, lastrow = rows[0], rows[-1]
        section.add(f"per-turn time, N={lastrow['n']:,} vs N={first['n']:,}",
                    lastrow["us_per_turn"] / first["us_per_turn"], "×")
    section.details["rows"] = rows
    return section


def table(section: Section) -> list[str]:
    lines = ["Today's engine:", "",
             "| concurrent turns | µs per typical turn | turns/s | GC share | start µs/turn "
             "(parked) | KB/turn tracemalloc | KB/turn RSS | kill all parked |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in section.details.get("rows", []):
        lines.append(f"| {r['n']:,} | {r['us_per_turn']:,.0f} | {r['turns_per_s']:,.0f} | "
                     f"{r['gc_pct']:.0f} % | {r['start_us_per_turn']:,.0f} | "
                     f"{r['traced_kb_per_turn']:.1f} | {r['rss_kb_per_turn']:.1f} | "
                     f"{r['kill_all_ms']:,.1f} ms (GC {r['kill_all_gc_ms']:,.0f} ms) |")
    for what_if, alt_rows in section.details.get("whatif_rows", {}).items():
        lines += ["", f"What-if *{what_if}*:", "",
                  "| concurrent turns | µs per typical turn | turns/s | GC share | start µs/turn "
                  "(parked) | KB/turn RSS | kill all parked |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in alt_rows:
            lines.append(f"| {r['n']:,} | {r['us_per_turn']:,.0f} | {r['turns_per_s']:,.0f} | "
                         f"{r['gc_pct']:.0f} % | {r['start_us_per_turn']:,.0f} | "
                         f"{r['rss_kb_per_turn']:.1f} | "
                         f"{r['kill_all_ms']:,.1f} ms (GC {r['kill_all_gc_ms']:,.0f} ms) |")
    return lines
