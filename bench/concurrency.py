"""Item 4: many turns in flight in one process, all awaiting their first token.

Each run is a fresh interpreter (RSS growth is only meaningful in a process that has not
grown before). In it, on a plain asyncio loop (real clock):

1. `turns` turns start on their own channels, journal on, with a provider that never sends a
   token and honours the abort; once every one is in AwaitingFirstToken the memory per
   in-flight turn is RSS growth / turns (or, in a separate run, tracemalloc's growth);
2. with those in flight plus `sample` more, `sample` single `/kill`s, one at a time:
   `ChannelLockRegistry.request_stop(channel)` to the turn reaching Stopped (the observer's
   `on_transition`, `time.perf_counter`), p50 and p99;
3. a `/kill` on every remaining channel at once: the time until all are Stopped, and until
   every `run()` has returned (cleanup included).
"""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc as tm
from typing import Any

from fsm import State, Turn

from .common import ROOT, GcTimer, Section, median, percentile, rss_bytes, run_async, run_isolated
from .whatif import whatif
from .workload import Engine, StallProvider, check_typical

GOAL_KB_PER_TURN = 20.0
GOAL_KILL_ALL_S = 1.0
GOAL_P99_MS = 5.0

AWAITING = State.AWAITING_FIRST_TOKEN.value
STOPPED = State.STOPPED.value


class Watch:
    """The observer: when each turn reached AwaitingFirstToken and Stopped."""

    def __init__(self) -> None:
        self.awaiting = 0
        self.stopped_at: dict[str, float] = {}
        self.waiters: dict[str, asyncio.Future[float]] = {}

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        if dest == AWAITING:
            self.awaiting += 1
        elif dest == STOPPED:
            now = time.perf_counter()
            self.stopped_at[turn.turn_id] = now
            waiter = self.waiters.pop(turn.turn_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(now)


async def _all_awaiting(watch: Watch, target: int, turns: list[Turn]) -> None:
    spins = 0
    while watch.awaiting < target:
        spins += 1
        await asyncio.sleep(0 if spins < 100 else 0.001)
    # let every stream worker reach its first await (the provider's abort wait)
    for _ in range(3):
        await asyncio.sleep(0)
    assert all(t.state == AWAITING for t in turns)


async def _single_kills(engine: Engine, watch: Watch, live: list[Any], spawn: Any,
                        turns: int, sample: int) -> dict[str, float]:
    """`sample` more turns, then a `/kill` for each, one at a time, `turns` others in flight."""
    loop = asyncio.get_running_loop()
    for i in range(turns, turns + sample):
        spawn(i)
    await _all_awaiting(watch, turns + sample, [t for t, _, _ in live])
    singles: list[float] = []
    singles_done: list[float] = []
    for turn, task, channel_id in live[turns:]:
        waiter: asyncio.Future[float] = loop.create_future()
        watch.waiters[turn.turn_id] = waiter
        start = time.perf_counter()
        engine.locks.request_stop(channel_id)
        stopped = await waiter
        result = await task
        singles.append(stopped - start)
        singles_done.append(time.perf_counter() - start)
        assert result.status == "stopped_by_user"
        engine.locks.release(turn.lock)
    del live[turns:]
    return {"single_p50_ms": 1e3 * percentile(singles, 50),
            "single_p99_ms": 1e3 * percentile(singles, 99),
            "single_max_ms": 1e3 * max(singles),
            "single_done_p99_ms": 1e3 * percentile(singles_done, 99)}


def _type_counts() -> dict[str, int]:
    counts: dict[str, int] = {}
    for obj in gc.get_objects():
        name = type(obj).__qualname__
        counts[name] = counts.get(name, 0) + 1
    return counts


def _short_file(name: str) -> str:
    for marker in ("site-packages/", f"{ROOT}/", "/lib/python3.11/"):
        name = name.split(marker)[-1]
    return name


async def _inflight(turns: int, sample: int, traced: bool) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    engine = Engine(journal=True)
    provider = StallProvider()
    # warm-up: the shared machine, pydantic models, the code paths of begin and kill
    check_typical(await engine.typical_turn("warm"))
    warm, lock, _ = engine.turn("warm-kill", provider)
    task = loop.create_task(warm.run())
    await asyncio.sleep(0.01)
    engine.locks.request_stop("warm-kill")
    await task
    engine.locks.release(lock)

    watch = Watch()
    live: list[tuple[Turn, asyncio.Task[Any], str]] = []

    def spawn(i: int) -> None:
        channel_id = f"ch{i}"
        turn, _lock, _channel = engine.turn(channel_id, provider, observer=watch)
        live.append((turn, loop.create_task(turn.run()), channel_id))

    gc.collect()
    if traced:
        tm.start()
    base_rss = rss_bytes()
    base_types = _type_counts() if traced else None
    base_objects = len(gc.get_objects())
    base_traced = tm.get_traced_memory()[0] if traced else 0
    t0 = time.perf_counter()
    for i in range(turns):
        spawn(i)
    await _all_awaiting(watch, turns, [t for t, _, _ in live])
    spawn_s = time.perf_counter() - t0
    gc.collect()
    out: dict[str, Any] = {"turns": turns, "spawn_s": spawn_s,
                           "rss_per_turn_b": (rss_bytes() - base_rss) / turns,
                           "gc_objects_per_turn": (len(gc.get_objects()) - base_objects) / turns}
    t_gc = time.perf_counter()
    gc.collect()
    out["full_gc_ms"] = 1e3 * (time.perf_counter() - t_gc)
    if traced:
        out["traced_per_turn_b"] = (tm.get_traced_memory()[0] - base_traced) / turns
        snapshot = tm.take_snapshot()
        tm.stop()
        assert base_types is not None
        types = _type_counts()
        grown = {k: (v - base_types.get(k, 0)) / turns for k, v in types.items()}
        out["gc_types_per_turn"] = dict(sorted(((k, v) for k, v in grown.items() if v >= 0.5),
                                               key=lambda kv: -kv[1])[:12])
        top = snapshot.statistics("filename")[:8]
        out["traced_top"] = [{"file": _short_file(str(s.traceback[0].filename)),
                              "b_per_turn": s.size / turns} for s in top]
        for _turn, _task, channel_id in live:
            engine.locks.request_stop(channel_id)
        await asyncio.gather(*(t for _, t, _ in live))
        return out

    if sample:
        out.update(await _single_kills(engine, watch, live, spawn, turns, sample))

    # 3. kill them all at once
    kill_at: dict[str, float] = {}
    with GcTimer() as gc_timer:
        start = time.perf_counter()
        for turn, _task, channel_id in live:
            kill_at[turn.turn_id] = time.perf_counter()
            engine.locks.request_stop(channel_id)
        requested = time.perf_counter()
        results = await asyncio.gather(*(t for _, t, _ in live))
        done = time.perf_counter()
    assert all(r.status == "stopped_by_user" for r in results)
    latencies = [watch.stopped_at[t.turn_id] - kill_at[t.turn_id] for t, _, _ in live]
    out["kill_all_requests_s"] = requested - start
    out["kill_all_stopped_s"] = max(watch.stopped_at[t.turn_id] for t, _, _ in live) - start
    out["kill_all_done_s"] = done - start
    out["kill_all_gc_s"] = gc_timer.total
    out["kill_all_full_gcs"] = gc_timer.collections[2]
    out["kill_all_young_gcs"] = gc_timer.collections[0]
    out["mass_p50_ms"] = 1e3 * percentile(latencies, 50)
    out["mass_p99_ms"] = 1e3 * percentile(latencies, 99)
    for turn, _task, _channel_id in live:
        engine.locks.release(turn.lock)
    return out


def inflight(turns: int = 10_000, sample: int = 1_000, traced: bool = False,
             what_if: str = "") -> dict[str, Any]:
    """One measurement run (call it in a fresh process: see `measure`)."""
    with whatif(what_if):
        return run_async(lambda: _inflight(turns, sample, traced))


BOT_PROCESS = "bot process GC settings"
"""The collector settings `python -m turn_engine` applies (`turn_engine.gc_tuning`): the
process the bot really runs in, so its kill-all figure is judged against the goal too, with
repeats."""

CONCURRENCY_WHATIFS = (
    BOT_PROCESS,
    "dict-dispatch machine",
    "dict-dispatch machine + bot process GC settings",
)


def measure(turns: int = 10_000, sample: int = 1_000, repeats: int = 3,
            isolated: bool = True, whatifs: tuple[str, ...] = CONCURRENCY_WHATIFS) -> Section:
    section = Section("concurrency", f"4. Concurrency: {turns:,} turns awaiting first token")

    def run(traced: bool, sample: int = sample, what_if: str = "") -> dict[str, Any]:
        kwargs = {"turns": turns, "sample": sample, "traced": traced, "what_if": what_if}
        if isolated:
            return run_isolated("concurrency", "inflight", kwargs)
        return inflight(**kwargs)  # type: ignore[arg-type]

    runs = [run(False) for _ in range(repeats)]
    traced = run(True, 0)

    def med(key: str) -> float:
        return median([r[key] for r in runs])

    rss_kb = med("rss_per_turn_b") / 1024
    traced_kb = traced["traced_per_turn_b"] / 1024
    top = ", ".join(f"{t['file']} {t['b_per_turn'] / 1024:.1f} KB"
                    for t in traced["traced_top"][:3])
    section.add("memory per in-flight turn (RSS growth / turns)", rss_kb, "KB",
                f"≤ {GOAL_KB_PER_TURN:g} KB", rss_kb <= GOAL_KB_PER_TURN)
    section.add("memory per in-flight turn (tracemalloc)", traced_kb, "KB",
                f"≤ {GOAL_KB_PER_TURN:g} KB", traced_kb <= GOAL_KB_PER_TURN,
                f"largest: {top}")
    killed = med("kill_all_stopped_s")
    section.add(f"kill all {turns:,}: last turn Stopped", killed, "s",
                f"≤ {GOAL_KILL_ALL_S:g} s", killed <= GOAL_KILL_ALL_S,
                f"every run() returned after {med('kill_all_done_s'):.2f} s; "
                f"GC {med('kill_all_gc_s'):.2f} s of it ({med('kill_all_full_gcs'):.0f} full, "
                f"{med('kill_all_young_gcs'):.0f} young collections)")
    p50, p99 = med("single_p50_ms"), med("single_p99_ms")
    section.add(f"single /kill latency p50 ({turns:,} in flight)", p50, "ms")
    section.add(f"single /kill latency p99 ({turns:,} in flight)", p99, "ms",
                f"< {GOAL_P99_MS:g} ms", p99 < GOAL_P99_MS,
                f"max {med('single_max_ms'):.2f} ms over {sample:,} kills; to run() "
                f"returned p99 {med('single_done_p99_ms'):.2f} ms")
    section.add(f"mass kill: latency p99 of {turns:,} at once", med("mass_p99_ms"), "ms",
                note=f"p50 {med('mass_p50_ms'):.0f} ms (each turn queued behind the others)")
    section.add(f"start {turns:,} turns until all await their first token", med("spawn_s"), "s",
                note=f"{1e6 * med('spawn_s') / turns:.0f} µs per turn")
    section.add("GC-tracked objects per in-flight turn", med("gc_objects_per_turn"), "objects")
    section.add(f"one full GC pass with {turns:,} in flight", med("full_gc_ms"), "ms")
    section.details["runs"] = runs
    section.details["traced"] = traced
    section.details["median_run"] = {key: med(key) for key, value in runs[0].items()
                                     if isinstance(value, (int, float))}
    alternatives: dict[str, Any] = {}
    for name in whatifs:
        judged = name == BOT_PROCESS
        alt_runs = [run(False, min(sample, 200), name) for _ in range(repeats if judged else 1)]
        alternatives[name] = alt_runs

        def alt(key: str, runs: list[dict[str, Any]] = alt_runs) -> float:
            return median([r[key] for r in runs])

        section.add(f"what-if {name}: KB per turn (RSS)", alt("rss_per_turn_b") / 1024, "KB",
                    note=f"{alt('gc_objects_per_turn'):.0f} GC-tracked objects per turn")
        killed_alt = alt("kill_all_stopped_s")
        section.add(f"what-if {name}: kill all, last Stopped", killed_alt, "s",
                    f"≤ {GOAL_KILL_ALL_S:g} s" if judged else None,
                    killed_alt <= GOAL_KILL_ALL_S if judged else None,
                    note=f"GC {alt('kill_all_gc_s'):.2f} s ({alt('kill_all_full_gcs'):.0f} full "
                         f"collections); start {1e6 * alt('spawn_s') / turns:.0f} µs/turn")
    section.details["whatifs"] = alternatives
    return section
