"""Item 7: scale-out on Redis (docs/redis.md). A private redis-server on a unix socket;
worker processes run `discord_io.redis_backend.RedisChannelQueue`.

- */kill across processes*: a target process holds `leases` running (idle) turns and one
  more turn per round; this process sends `/kill` for that turn's channel through the kill
  script. Latency is from the call to the moment the target's turn kill handle fires (both
  read the system-wide monotonic clock), through the script's publish and the target's
  pub/sub handler, while the target keeps renewing its other leases.
- *lease upkeep*: this process holds `leases` leases and renews them all `renewals` times;
  client CPU per renewal (one script call), Redis server CPU per renewal (INFO cpu).
- *throughput*: `turns` typical engine turns (bench.workload: 100 chunks, two tools) over
  `channels` channels, in one process with the in-process queue, then through Redis with one
  and with two worker processes (each receives every other message of each channel, as two
  gateway sessions would). Wall time from "go" to the last turn's end, and the CPU time of
  the processes that ran turns (on a shared machine the CPU figure is the steadier one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import ROOT, Section, median, percentile

GOAL_KILL_P99_MS = 10.0
BENCH_PREFIX = "bench:"


def redis_available() -> bool:
    try:
        import redis  # noqa: F401
    except ImportError:
        return False
    import shutil

    return shutil.which("redis-server") is not None


# ---- worker processes ----------------------------------------------------------------------


def _record(message_id: str, channel_id: str) -> Any:
    from discord_io.redis_backend.queue import QueuedRecord

    return QueuedRecord(message_id, channel_id, "1")


async def _idle_turns(queue: Any, count: int, prefix: str) -> None:
    """Hold `count` leases with turns that wait until killed (submitted 100 at a time)."""
    for start in range(0, count, 100):
        await asyncio.gather(*(queue.submit(f"{prefix}{i}", (f"{prefix}m{i}", f"{prefix}{i}"))
                               for i in range(start, min(start + 100, count))))


async def _kill_target(url: str, rounds: int, background: int) -> None:
    from discord_io.redis_backend.connection import connect
    from discord_io.redis_backend.queue import RedisChannelQueue
    from fsm import ChannelLock, ChannelLockRegistry

    registry = ChannelLockRegistry()

    async def run_turn(message: tuple[str, str], lock: ChannelLock) -> None:
        killed = asyncio.Event()

        def on_kill(_reason: str) -> None:
            if not killed.is_set():
                killed.set()
                print(f"killed {lock.channel_id} {time.monotonic()!r}", flush=True)

        lock.turn_kill = on_kill
        if lock.channel_id.startswith("k"):
            print(f"ready {lock.channel_id}", flush=True)
        await killed.wait()

    queue: RedisChannelQueue[tuple[str, str]] = RedisChannelQueue(
        connect(url), registry, run_turn, record_of=lambda m: _record(*m),
        load=lambda r: _loaded(r), worker_id="kill-target", prefix=BENCH_PREFIX,
        owns_redis=True)
    await queue.start()
    await _idle_turns(queue, background, "b")
    for i in range(rounds):
        await queue.submit(f"k{i}", (f"km{i}", f"k{i}"))
        await queue.join(f"k{i}")
    await queue.aclose()


async def _loaded(record: Any) -> tuple[str, str]:
    return (record.message_id, record.channel_id)


async def _throughput_worker(url: str, worker: str, index: int, workers: int, turns: int,
                             channels: int) -> None:
    from discord_io.redis_backend.connection import connect
    from discord_io.redis_backend.queue import RedisChannelQueue
    from fsm import ChannelLock, Turn
    from fsm.scenarios.scripted import InMemoryChannel

    from .workload import Engine, PlanProvider, check_typical, typical_plan

    engine = Engine(journal=False)
    counter = connect(url)
    plan = typical_plan()

    async def run_turn(_message: tuple[str, str], lock: ChannelLock) -> None:
        turn = Turn(provider=PlanProvider(plan), channel=InMemoryChannel(), locks=engine.locks,
                    lock=lock, tools=engine.tools, config=engine.config)
        check_typical(await turn.run(), plan)
        await counter.incr(f"{BENCH_PREFIX}done")

    queue: RedisChannelQueue[tuple[str, str]] = RedisChannelQueue(
        connect(url), engine.locks, run_turn, record_of=lambda m: _record(*m),
        load=_loaded, worker_id=worker, prefix=BENCH_PREFIX, max_queued=turns,
        owns_redis=True)
    await queue.start()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    cpu0 = time.process_time()
    for n in range(turns):
        if n % workers == index:
            channel = f"t{n % channels}"
            await queue.submit(channel, (f"tm{n}", channel))
    while int(await counter.get(f"{BENCH_PREFIX}done") or 0) < turns:
        await asyncio.sleep(0.05)  # rare enough to cost nothing next to the turns
    print(f"cpu {time.process_time() - cpu0!r}", flush=True)
    await queue.aclose()
    await counter.aclose()


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.redis_scale", *args], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


# ---- measurements ----------------------------------------------------------------------------


async def _kill_latencies(url: str, rounds: int, background: int) -> list[float]:
    from discord_io.redis_backend.connection import connect
    from discord_io.redis_backend.queue import RedisChannelQueue
    from fsm import ChannelLockRegistry

    async def never(_m: tuple[str, str], _lock: Any) -> None:
        raise AssertionError("the killer runs no turns")

    killer: RedisChannelQueue[tuple[str, str]] = RedisChannelQueue(
        connect(url), ChannelLockRegistry(), never, record_of=lambda m: _record(*m),
        load=_loaded, worker_id="killer", prefix=BENCH_PREFIX, owns_redis=True)
    target = _spawn("--kill-target", url, str(rounds), str(background))
    assert target.stdout is not None
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    try:
        for i in range(rounds):
            line = await loop.run_in_executor(None, target.stdout.readline)
            assert line.split() == ["ready", f"k{i}"], line
            sent = time.monotonic()
            outcome = await killer.kill(f"k{i}", f"bench-{i}")
            assert outcome.running, outcome
            line = await loop.run_in_executor(None, target.stdout.readline)
            word, channel, at = line.split()
            assert (word, channel) == ("killed", f"k{i}"), line
            latencies.append((float(at) - sent) * 1000)
    finally:
        target.wait(timeout=60)
        await killer.aclose()
    return latencies


async def _upkeep(url: str, leases: int, renewals: int) -> dict[str, float]:
    from discord_io.redis_backend.connection import connect
    from discord_io.redis_backend.queue import RedisChannelQueue
    from fsm import ChannelLock, ChannelLockRegistry

    async def idle(_m: tuple[str, str], lock: ChannelLock) -> None:
        stopped = asyncio.Event()
        lock.turn_kill = lambda _reason: stopped.set()
        await stopped.wait()

    redis = connect(url)
    await redis.flushdb()
    queue: RedisChannelQueue[tuple[str, str]] = RedisChannelQueue(
        redis, ChannelLockRegistry(), idle, record_of=lambda m: _record(*m), load=_loaded,
        worker_id="upkeep", prefix=BENCH_PREFIX)
    await _idle_turns(queue, leases, "u")
    assert len(queue.keeper) == leases
    await queue.keeper.renew_all()  # scripts loaded, connection warm

    async def server_cpu() -> float:
        info = await redis.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    before = await server_cpu()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(renewals):
        await queue.keeper.renew_all()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    server = await server_cpu() - before
    assert queue.keeper.failures == 0 and not any(
        lease.lost for lease in [queue.keeper.get(f"u{i}") for i in range(leases)] if lease)
    await queue.aclose()
    await redis.aclose()
    return {"client_cpu_ms": cpu / renewals * 1000, "wall_ms": wall / renewals * 1000,
            "server_cpu_ms": server / renewals * 1000}


async def _local_throughput(turns: int, channels: int) -> dict[str, float]:
    from discord_io.channel_queue import ChannelQueue
    from fsm import ChannelLock, Turn
    from fsm.scenarios.scripted import InMemoryChannel

    from .workload import Engine, PlanProvider, check_typical, typical_plan

    engine = Engine(journal=False)
    plan = typical_plan()
    done = 0

    async def run_turn(_message: str, lock: ChannelLock) -> None:
        nonlocal done
        turn = Turn(provider=PlanProvider(plan), channel=InMemoryChannel(), locks=engine.locks,
                    lock=lock, tools=engine.tools, config=engine.config)
        check_typical(await turn.run(), plan)
        done += 1

    queue: ChannelQueue[str] = ChannelQueue(engine.locks, run_turn, max_queued=turns)
    started, cpu0 = time.perf_counter(), time.process_time()
    for n in range(turns):
        queue.submit(f"t{n % channels}", f"tm{n}")
    for c in range(channels):
        await queue.join(f"t{c}")
    assert done == turns
    return {"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu0}


async def _redis_throughput(url: str, workers: int, turns: int, channels: int
                            ) -> dict[str, float]:
    from discord_io.redis_backend.connection import connect

    redis = connect(url)
    await redis.flushdb()  # the bench's own server: no leases, queues or seen ids left over
    procs = [_spawn("--throughput", url, f"w{i}", str(i), str(workers), str(turns),
                    str(channels)) for i in range(workers)]
    loop = asyncio.get_running_loop()
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await loop.run_in_executor(None, proc.stdout.readline)
            assert line.strip() == "ready", line
        started = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        cpus = []
        for proc in procs:
            assert proc.stdout is not None
            line = await loop.run_in_executor(None, proc.stdout.readline)
            cpus.append(float(line.split()[1]))
        wall = time.perf_counter() - started
    finally:
        for proc in procs:
            proc.wait(timeout=60)
        await redis.aclose()
    return {"wall_s": wall, "cpu_s": sum(cpus)}


def _progress(what: str) -> None:
    print(f"[bench] redis_scale: {what} …", file=sys.stderr, flush=True)


def measure(kill_rounds: int = 300, leases: int = 1000, renewals: int = 50,
            turns: int = 1000, channels: int = 100, repeats: int = 3) -> Section:
    from discord_io.testing.redis_server import running_redis

    section = Section("redis_scale",
                      f"10. Scale-out on Redis ({turns:,} turns over {channels} channels)")
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as tmp, \
            running_redis(Path(tmp)) as server:
        url = server.url
        _progress("kill latency")
        latencies = asyncio.run(_kill_latencies(url, kill_rounds, leases))
        _progress("lease upkeep")
        upkeep = asyncio.run(_upkeep(url, leases, renewals))
        _progress("throughput")
        runs: dict[str, list[float]] = {"local": [], "redis_1": [], "redis_2": []}
        cpu: dict[str, list[float]] = {"local": [], "redis_1": [], "redis_2": []}
        for _ in range(repeats):
            local = asyncio.run(_local_throughput(turns, channels))
            runs["local"].append(local["wall_s"])
            cpu["local"].append(local["cpu_s"])
            for workers in (1, 2):
                figures = asyncio.run(_redis_throughput(url, workers, turns, channels))
                runs[f"redis_{workers}"].append(figures["wall_s"])
                cpu[f"redis_{workers}"].append(figures["cpu_s"])
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    section.add("/kill across processes, p50", p50, "ms",
                note=f"{kill_rounds} kills; the target renews {leases} other leases meanwhile")
    section.add("/kill across processes, p99", p99, "ms", goal=f"≤ {GOAL_KILL_P99_MS:g} ms",
                met=p99 <= GOAL_KILL_P99_MS)
    section.add(f"lease upkeep, client CPU per renewal of {leases} leases",
                upkeep["client_cpu_ms"], "ms", note="200 leases per script call")
    section.add(f"lease upkeep, Redis CPU per renewal of {leases} leases",
                upkeep["server_cpu_ms"], "ms")
    period = 3.0
    section.add(f"lease upkeep per 1,000 turns, client CPU share (renewal every {period:g} s)",
                upkeep["client_cpu_ms"] * 1000 / leases / period / 10, "%",
                note="of one core")
    rates = {k: turns / median(v) for k, v in runs.items()}
    section.add("throughput, in-process queue, one process", rates["local"], "turns/s")
    section.add("throughput, Redis queue, one worker process", rates["redis_1"], "turns/s",
                note=f"{rates['redis_1'] / rates['local']:.2f}× in-process")
    section.add("throughput, Redis queue, two worker processes", rates["redis_2"], "turns/s",
                note=f"{rates['redis_2'] / rates['redis_1']:.2f}× one worker")
    per_turn = {k: median(v) / turns * 1000 for k, v in cpu.items()}
    section.add("CPU per turn, in-process queue", per_turn["local"], "ms",
                note="the turn itself: 100 chunks, two tools")
    section.add("CPU per turn, Redis queue (all workers)", per_turn["redis_2"], "ms",
                note=f"{per_turn['redis_2'] / per_turn['local']:.2f}× in-process; "
                     f"one worker {per_turn['redis_1']:.2f} ms")
    section.details.update({
        "load_average": os.getloadavg(),
        "kill_ms": latencies, "upkeep": upkeep, "throughput_wall_s": runs,
        "throughput_cpu_s": cpu, "turns": turns, "channels": channels,
        "cpu_per_turn_ms": per_turn,
    })
    return section


def main(argv: list[str] | None = None) -> int:
    """The worker processes' entry (`python -m bench.redis_scale --kill-target ...`)."""
    parser = argparse.ArgumentParser(prog="python -m bench.redis_scale")
    parser.add_argument("--kill-target", nargs=3, metavar=("URL", "ROUNDS", "BACKGROUND"))
    parser.add_argument("--throughput", nargs=6,
                        metavar=("URL", "WORKER", "INDEX", "WORKERS", "TURNS", "CHANNELS"))
    args = parser.parse_args(argv)
    if args.kill_target:
        url, rounds, background = args.kill_target
        asyncio.run(_kill_target(url, int(rounds), int(background)))
    elif args.throughput:
        url, worker, index, workers, turns, channels = args.throughput
        asyncio.run(_throughput_worker(url, worker, int(index), int(workers), int(turns),
                                       int(channels)))
    else:
        print(json.dumps(measure(kill_rounds=20, leases=100, renewals=5, turns=100,
                                 repeats=1).as_dict(), default=float, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
