"""Item 2: turns per second for the typical turn (see `workload`), one after another on one
event loop (one core), journal on; a cProfile of the same; and what-if variants that put
numbers on changes not adopted (see `whatif`)."""

from __future__ import annotations

from typing import Any

from .common import Clock, GcTimer, Section, median, run_async
from .profiling import profile_async
from .whatif import whatif
from .workload import Engine, check_typical, typical_plan

GOAL_TURNS_PER_S = 2000.0


async def sequential_turns(turns: int, journal: bool = True) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and GC seconds for `turns` typical turns in a row."""
    engine = Engine(journal=journal)
    plan = typical_plan()
    check_typical(await engine.typical_turn(plan=plan), plan)  # warm, and check it works
    with GcTimer() as gc_timer, Clock() as clock:
        for _ in range(turns):
            result = await engine.typical_turn(plan=plan)
    check_typical(result, plan)
    return clock.wall, clock.cpu, gc_timer.total


VARIANTS: dict[str, tuple[bool, str]] = {
    "engine (journal on)": (True, ""),
    "engine, journal off": (False, ""),
    **{f"what-if: {name}": (True, name) for name in (
        "bot process GC settings",
        "dict-dispatch machine",
        "dict-dispatch machine + bot process GC settings",
    )},
}
"""Name: (journal on, what-if applied; see `whatif.WHATIFS`)."""


def measure(turns: int = 2000, repeats: int = 5, profile_turns: int = 500,
            whatifs: bool = True) -> Section:
    section = Section("per_turn", f"2. Per-turn overhead (typical turn, {turns:,} in a row)")
    names = list(VARIANTS) if whatifs else list(VARIANTS)[:2]
    samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            journal, patch = VARIANTS[name]
            with whatif(patch):
                samples[name].append(run_async(lambda j=journal: sequential_turns(turns, j)))
    figures: dict[str, dict[str, float]] = {}
    for name in names:
        walls = [s[0] for s in samples[name]]
        cpus = [s[1] for s in samples[name]]
        gcs = [s[2] for s in samples[name]]
        figures[name] = {"turns_per_s": turns / median(walls),
                         "turns_per_cpu_s": turns / median(cpus),
                         "us_per_turn": 1e6 * median(walls) / turns,
                         "gc_pct": 100 * median(gcs) / median(walls)}
    main = figures["engine (journal on)"]
    runs = samples["engine (journal on)"]
    section.judged("typical turns per second (journal on)", [turns / s[0] for s in runs],
                   "turns/s", goal=f"≥ {GOAL_TURNS_PER_S:,.0f}/s", at_least=GOAL_TURNS_PER_S,
                   note=f"{main['us_per_turn']:.0f} µs/turn; {main['turns_per_cpu_s']:,.0f} per "
                        f"CPU-s; GC {main['gc_pct']:.1f} % of wall")
    section.judged("typical turns per CPU-second (journal on)", [turns / s[1] for s in runs],
                   "turns/s", goal=f"≥ {GOAL_TURNS_PER_S:,.0f}/s", at_least=GOAL_TURNS_PER_S,
                   note="the event loop thread's CPU time: what one core does, whatever else "
                        "runs")
    for name in names[1:]:
        fig = figures[name]
        section.add(f"turns per second, {name}", fig["turns_per_s"], "turns/s",
                    note=f"{fig['us_per_turn']:.0f} µs/turn")
    section.details["variants"] = figures
    section.details["turns"] = turns
    section.details["repeats"] = repeats
    if profile_turns:
        section.details["profile"] = profile_turns_sequential(profile_turns)
    return section


def profile_turns_sequential(turns: int) -> dict[str, Any]:
    engine = Engine()
    plan = typical_plan()

    async def work() -> None:
        for _ in range(turns):
            await engine.typical_turn(plan=plan)

    run_async(lambda: engine.typical_turn(plan=plan))
    return profile_async(work, per=turns, top=15)
