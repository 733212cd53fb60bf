"""Profiles for the report: cProfile's top functions and self time grouped by area."""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Awaitable, Callable
from typing import Any

from .common import ROOT, run_async

AREAS = (
    ("transitions", "/transitions/"),
    ("pydantic", "/pydantic/"),
    ("pydantic", "/pydantic_core/"),
    ("asyncio", "/asyncio/"),
    ("journal", "/fsm/journal/"),
    ("stream worker", "/fsm/engine/stream_pass.py"),
    ("turn driver", "/fsm/engine/turn.py"),
    ("engine, other", "/fsm/"),
    ("providers", "/providers/"),
    ("discord_io", "/discord_io/"),
    ("the bot (turn_engine)", "/turn_engine/"),
    ("aiohttp", "/aiohttp/"),
    ("discord.py", "/discord/"),
    ("yarl, multidict", "/yarl/"),
    ("yarl, multidict", "/multidict/"),
    ("threads (journal writes)", "/concurrent/futures/"),
    ("benchmark harness", "/bench/"),
)
"""Self time by where the code lives; a path that moved must move here too, or its time is
counted as "other" (tests/test_bench_profiling.py checks every marker still names a file)."""


def _area(filename: str) -> str:
    for name, marker in AREAS:
        if marker in filename:
            return name
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins"
    return "other"


def _short(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    for marker in ("site-packages/", "/lib/python3.", f"{ROOT}/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            if marker == "/lib/python3.":
                filename = filename.split("/", 1)[1] if "/" in filename else filename
            break
    if filename == "~":
        return name
    return f"{filename}:{line}({name})"


def profile_async(factory: Callable[[], Awaitable[Any]], per: int, top: int = 15,
                  timer: Callable[[], float] | None = None) -> dict[str, Any]:
    """Run `factory()` under cProfile; self time per unit of work (`per`: turns or chunks).

    cProfile inflates code that makes many small calls, so the table shows where time goes
    relative to the rest, not absolute costs; absolute costs come from the timed runs.
    `timer=time.process_time` profiles CPU time (a process that waits or is descheduled).
    """
    profiler = cProfile.Profile(timer) if timer is not None else cProfile.Profile()

    async def profiled() -> Any:
        profiler.enable()
        try:
            return await factory()
        finally:
            profiler.disable()

    run_async(profiled)
    stats = pstats.Stats(profiler)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values()) or 1e-12
    areas: dict[str, float] = {}
    rows = []
    for func, (_cc, ncalls, tottime, cumtime, _callers) in raw.items():
        areas[_area(func[0])] = areas.get(_area(func[0]), 0.0) + tottime
        rows.append((tottime, ncalls, cumtime, func))
    rows.sort(reverse=True, key=lambda r: r[0])
    return {
        "per": per,
        "total_profiled_s": total,
        "areas": sorted(({"area": k, "share_pct": 100 * v / total, "us_per": 1e6 * v / per}
                         for k, v in areas.items()), key=lambda a: -a["share_pct"]),
        "top": [{"function": _short(func), "calls_per": ncalls / per,
                 "self_us_per": 1e6 * tottime / per, "self_pct": 100 * tottime / total,
                 "cum_us_per": 1e6 * cumtime / per}
                for tottime, ncalls, cumtime, func in rows[:top]],
    }


def format_profile(profile: dict[str, Any], unit: str) -> list[str]:
    """Markdown lines for a profile produced by `profile_async`."""
    lines = [f"Self time by area (cProfile, per {unit}):", "",
             "| area | share | µs per " + unit + " (profiled) |", "| --- | ---: | ---: |"]
    for area in profile["areas"]:
        if area["share_pct"] >= 0.5:
            lines.append(f"| {area['area']} | {area['share_pct']:.1f} % | "
                         f"{area['us_per']:.2f} |")
    lines += ["", f"Top functions by self time (per {unit}):", "",
              "| function | calls | self µs | self % | cumulative µs |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for row in profile["top"]:
        lines.append(f"| `{row['function']}` | {row['calls_per']:.2f} | "
                     f"{row['self_us_per']:.2f} | {row['self_pct']:.1f} % | "
                     f"{row['cum_us_per']:.2f} |")
    return lines
