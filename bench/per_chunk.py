"""Item 1: per-chunk overhead of one pass through the engine, against a bare `async for`.

Side by side in each repeat, on the same source (an async generator yielding `TextDelta`):

- *engine*: a `Turn` with the journal on (`JournalRecorder`) and an in-memory channel, from
  `run()` to Done (one pass: begin, first token, completed);
- *bare*: `async for event in source: parts.append(event.text)`;
- *floor*: the bare loop plus the two things the engine's workload must do per chunk anyway —
  record the chunk in the journal (an `(at, text)` tuple appended to the pass's steps) and
  `await channel.deliver(text)` — with no engine around them;
- *engine, journal off*: the same turn with `recorder=None`.

Two sources: zero-latency (never awaits) and one that yields control each chunk
(`await asyncio.sleep(0)`), which is closer to real I/O.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fsm.journal import JournalRecorder
from fsm.scenarios.scripted import InMemoryChannel

from .common import Clock, Section, median, run_async
from .profiling import profile_async
from .workload import Engine, TextProvider, chunk_texts, text_source

GOAL_RATIO = 1.5


async def engine_pass(texts: list[str], yield_each: bool, journal: bool = True) -> float:
    engine = Engine(journal=journal)
    provider = TextProvider(texts, yield_each)
    turn, lock, channel = engine.turn("bench", provider)
    with Clock() as clock:
        result = await turn.run()
    engine.locks.release(lock)
    assert result.status == "completed", result.status
    assert len(channel.delivered) == len(texts)
    return clock.wall


async def bare_pass(texts: list[str], yield_each: bool) -> float:
    parts: list[str] = []
    with Clock() as clock:
        async for event in text_source(texts, yield_each):
            parts.append(event.text)
    assert len(parts) == len(texts)
    return clock.wall


async def floor_pass(texts: list[str], yield_each: bool) -> float:
    engine = Engine()
    recorder = JournalRecorder("floor", engine.config, engine.tools)
    channel = InMemoryChannel()
    loop = asyncio.get_running_loop()
    parts: list[str] = []
    record_text = recorder.on_pass_start(1)
    deliver = channel.deliver
    clock_now = loop.time
    with Clock() as clock:
        start = clock_now()
        async for event in text_source(texts, yield_each):
            text = event.text
            record_text((clock_now() - start, text))
            await deliver(text)
            parts.append(text)
    assert len(channel.delivered) == len(texts)
    return clock.wall


async def unit_costs(n: int) -> dict[str, float]:
    """ns per call of the pieces a per-chunk path is made of, each in a tight loop."""
    loop = asyncio.get_running_loop()
    engine = Engine()
    recorder = JournalRecorder("unit", engine.config, engine.tools)
    record_text = recorder.on_pass_start(1)
    channel = InMemoryChannel()
    deliver, clock = channel.deliver, loop.time
    parts: list[str] = []
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    for _ in range(n):
        parts.append("x")
    out["list.append"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n):
        await deliver("x")
    out["await InMemoryChannel.deliver"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n):
        record_text((clock() - t0, "x"))
    out["journal: (loop.time() - start, text) appended"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n):
        clock()
    out["loop.time()"] = time.perf_counter() - t0
    return {k: 1e9 * v / n for k, v in out.items()}


def measure(chunks: int = 100_000, repeats: int = 5, profile: bool = True) -> Section:
    section = Section("per_chunk", f"1. Per-chunk overhead ({chunks:,} chunks, one pass)")
    texts = chunk_texts(chunks)
    section.details["chunks"] = chunks
    section.details["repeats"] = repeats
    variants: dict[str, Any] = {}
    for yield_each in (False, True):
        samples: dict[str, list[float]] = {"engine": [], "bare": [], "floor": [],
                                           "engine_nojournal": []}

        async def one_round(ye: bool = yield_each, s: dict[str, list[float]] = samples) -> None:
            s["bare"].append(await bare_pass(texts, ye))
            s["engine"].append(await engine_pass(texts, ye))
            s["floor"].append(await floor_pass(texts, ye))
            s["engine_nojournal"].append(await engine_pass(texts, ye, journal=False))

        run_async(lambda ye=yield_each: engine_pass(texts[:1000], ye))  # warm-up
        for _ in range(repeats):
            run_async(one_round)
        ratios = [e / b for e, b in zip(samples["engine"], samples["bare"], strict=True)]
        floor_ratios = [f / b for f, b in zip(samples["floor"], samples["bare"], strict=True)]
        off_ratios = [e / b for e, b in zip(samples["engine_nojournal"], samples["bare"],
                                            strict=True)]
        over_floor = [e / f for e, f in zip(samples["engine"], samples["floor"], strict=True)]
        label = "yielding each chunk" if yield_each else "zero-latency"
        bare_ns = 1e9 * median(samples["bare"]) / chunks
        engine_ns = 1e9 * median(samples["engine"]) / chunks
        section.judged(f"engine / bare loop, {label}", ratios, "×", goal=f"≤ {GOAL_RATIO}×",
                       at_most=GOAL_RATIO, floor=1.0,  # the engine runs the bare loop's work
                       note=f"bare {bare_ns:.0f} ns/chunk, engine {engine_ns:.0f} ns/chunk")
        section.add(f"engine overhead per chunk, {label}", engine_ns - bare_ns, "ns")
        section.add(f"floor (journal + deliver, no engine) / bare, {label}",
                    median(floor_ratios), "×")
        section.add(f"engine / floor, {label}", median(over_floor), "×")
        section.add(f"engine with journal off / bare, {label}", median(off_ratios), "×")
        variants[label] = {k: [round(v, 6) for v in vals] for k, vals in samples.items()}
    section.details["samples_s"] = variants
    units = [run_async(lambda: unit_costs(max(1000, chunks // 2))) for _ in range(3)]
    for name in units[0]:
        section.add(f"unit cost: {name}", median([u[name] for u in units]), "ns")
    if profile:
        n = min(chunks, 50_000)
        section.details["profile"] = profile_async(
            lambda: engine_pass(texts[:n], False), per=n, top=12)
    return section

