"""The per-channel queue with fake turns: FIFO, bounds, release in every outcome (D4, S6)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from discord_io.channel_queue import QUEUE_FULL_TEXT, ChannelQueue
from discord_io.stale_sweeper import StaleLockSweeper
from fsm.engine.locks import ChannelLock, ChannelLockRegistry

CHANNEL = "chan-1"


@dataclass
class FakeTurns:
    """Turns that record what ran, when, and under which lock; each waits for its gate."""

    registry: ChannelLockRegistry
    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    started_at: dict[str, float] = field(default_factory=dict)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    raising: dict[str, BaseException] = field(default_factory=dict)
    concurrent: int = 0
    max_concurrent: int = 0

    def gate(self, name: str) -> asyncio.Event:
        return self.gates.setdefault(name, asyncio.Event())

    async def run(self, message: str, lock: ChannelLock) -> None:
        assert self.registry.get(lock.channel_id) is lock
        self.started.append(message)
        self.started_at[message] = asyncio.get_running_loop().time()
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if message in self.raising:
                raise self.raising[message]
            await self.gate(message).wait()
            self.finished.append(message)
        finally:
            self.concurrent -= 1


async def _until(condition: object, step: float = 0.01, limit: float = 5.0) -> None:
    """Let the loop run until `condition()` holds (virtual or instant, never a real margin)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "condition never held"
        await asyncio.sleep(step)


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_one_turn_per_channel_in_fifo_order() -> None:
    # covers D4
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry)
    queue: ChannelQueue[str] = ChannelQueue(registry, turns.run)

    statuses = [queue.submit(CHANNEL, m).status for m in ("m1", "m2", "m3")]
    assert statuses == ["started", "queued", "queued"]
    await _until(lambda: turns.started == ["m1"])
    assert queue.pending(CHANNEL) == ("m2", "m3")

    for name in ("m1", "m2", "m3"):
        turns.gate(name).set()
    await queue.join(CHANNEL)

    assert turns.started == ["m1", "m2", "m3"] == turns.finished
    assert turns.max_concurrent == 1
    assert CHANNEL not in registry
    assert not queue.busy(CHANNEL)


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_channels_run_independently() -> None:
    # covers D4
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry)
    queue: ChannelQueue[str] = ChannelQueue(registry, turns.run)
    queue.submit("a", "a1")
    queue.submit("b", "b1")
    await _until(lambda: sorted(turns.started) == ["a1", "b1"])
    turns.gate("a1").set()
    turns.gate("b1").set()
    await queue.join("a")
    await queue.join("b")


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_overflow_is_refused_politely_not_dropped() -> None:
    # covers D4
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry)
    queue: ChannelQueue[str] = ChannelQueue(registry, turns.run, max_queued=2)

    submissions = [queue.submit(CHANNEL, f"m{n}") for n in range(4)]

    assert [s.status for s in submissions] == ["started", "queued", "queued", "full"]
    assert [s.position for s in submissions[1:3]] == [1, 2]
    refused = submissions[3]
    assert not refused.accepted and refused.refusal == QUEUE_FULL_TEXT
    assert queue.pending(CHANNEL) == ("m1", "m2")
    for gate in ("m0", "m1", "m2"):
        turns.gate(gate).set()
    await queue.join(CHANNEL)
    assert turns.finished == ["m0", "m1", "m2"]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_lock_released_when_the_turn_raises_and_the_next_runs() -> None:
    # covers D4
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry, raising={"boom": RuntimeError("engine bug")})
    queue: ChannelQueue[str] = ChannelQueue(registry, turns.run)
    queue.submit(CHANNEL, "boom")
    queue.submit(CHANNEL, "after")
    await _until(lambda: turns.started == ["boom", "after"])
    turns.gate("after").set()
    await queue.join(CHANNEL)
    assert turns.finished == ["after"]
    assert CHANNEL not in registry


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_lock_released_when_the_turn_is_cancelled_and_the_next_runs() -> None:
    # covers D4
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry, raising={"cancelled": asyncio.CancelledError()})
    queue: ChannelQueue[str] = ChannelQueue(registry, turns.run)
    queue.submit(CHANNEL, "cancelled")
    queue.submit(CHANNEL, "after")
    await _until(lambda: turns.started == ["cancelled", "after"])
    turns.gate("after").set()
    await queue.join(CHANNEL)
    assert CHANNEL not in registry


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_closing_the_queue_cancels_the_turn_and_releases_the_lock() -> None:
    # covers D4
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry)
    queue: ChannelQueue[str] = ChannelQueue(registry, turns.run)
    queue.submit(CHANNEL, "long")
    queue.submit(CHANNEL, "never")
    await _until(lambda: turns.started == ["long"])
    await queue.aclose()
    assert CHANNEL not in registry
    assert turns.concurrent == 0
    assert turns.started == ["long"]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_message_during_kill_unwinding_is_not_queued() -> None:
    # covers D3, D4
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry)
    queue: ChannelQueue[str] = ChannelQueue(registry, turns.run)
    queue.submit(CHANNEL, "running")
    await _until(lambda: turns.started == ["running"])
    assert registry.request_stop(CHANNEL)

    late = queue.submit(CHANNEL, "late")

    assert late.status == "stopping" and late.refusal
    assert queue.pending(CHANNEL) == ()
    turns.gate("running").set()
    await queue.join(CHANNEL)
    assert turns.started == ["running"]
    assert queue.submit(CHANNEL, "fresh").status == "started"  # a new lock, no stop flag
    turns.gate("fresh").set()
    await queue.join(CHANNEL)


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_clear_empties_the_queue_but_leaves_the_running_turn() -> None:
    # covers D3
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry)
    queue: ChannelQueue[str] = ChannelQueue(registry, turns.run)
    for name in ("run", "q1", "q2"):
        queue.submit(CHANNEL, name)
    await _until(lambda: turns.started == ["run"])
    assert queue.clear(CHANNEL) == 2
    assert queue.clear(CHANNEL) == 0
    turns.gate("run").set()
    await queue.join(CHANNEL)
    assert turns.started == ["run"]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_follow_ups_are_announced_when_queued() -> None:
    # covers S17 (the engine learns of a follow-up while it streams)
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry)
    seen: list[tuple[str, str]] = []
    queue: ChannelQueue[str] = ChannelQueue(
        registry, turns.run, on_queued=lambda channel, message: seen.append((channel, message))
    )
    queue.submit(CHANNEL, "first")
    queue.submit(CHANNEL, "follow-up")
    assert seen == [(CHANNEL, "follow-up")]
    turns.gate("first").set()
    turns.gate("follow-up").set()
    await queue.join(CHANNEL)


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_stale_lock_is_released_by_the_sweeper_and_the_queue_moves_on(
    looptime: float,
) -> None:
    # covers S6, D4
    registry = ChannelLockRegistry(stale_age_s=180.0)
    turns = FakeTurns(registry)
    queue: ChannelQueue[str] = ChannelQueue(registry, turns.run)
    kills: list[str] = []
    start = float(looptime)

    async with StaleLockSweeper(registry, interval_s=30.0) as sweeper:
        queue.submit(CHANNEL, "hung")  # never touches its lock, never finishes
        queue.submit(CHANNEL, "next")
        await _until(lambda: turns.started == ["hung"])
        lock = registry.get(CHANNEL)
        assert lock is not None
        lock.turn_kill = kills.append
        await _until(lambda: "next" in turns.started, step=1.0, limit=400.0)

        assert 180.0 <= turns.started_at["next"] - start <= 210.0
        assert kills == ["stale_lock"]
        assert sweeper.released == 1
        assert "hung" not in turns.finished
        turns.gate("next").set()
        await queue.join(CHANNEL)
    assert CHANNEL not in registry


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_turn_under_watchdog_is_never_stale(looptime: float) -> None:
    # covers S6
    registry = ChannelLockRegistry(stale_age_s=180.0)
    start = float(looptime)
    started_next: list[float] = []

    async def run(message: str, lock: ChannelLock) -> None:
        if message == "long":
            with registry.watchdog(lock):
                await asyncio.sleep(400.0)  # a long healthy pass or tool
        else:
            started_next.append(asyncio.get_running_loop().time())

    queue: ChannelQueue[str] = ChannelQueue(registry, run)
    async with StaleLockSweeper(registry, interval_s=30.0) as sweeper:
        queue.submit(CHANNEL, "long")
        queue.submit(CHANNEL, "next")
        await queue.join(CHANNEL)
        assert sweeper.released == 0
    assert started_next and started_next[0] - start >= 400.0


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_turn_releasing_its_own_lock_is_not_cancelled() -> None:
    # covers D4
    registry = ChannelLockRegistry()
    finished: list[str] = []

    async def run(message: str, lock: ChannelLock) -> None:
        registry.release(lock)  # an engine that releases on its way out
        await asyncio.sleep(1.0)  # ...and still has a last send to make
        finished.append(message)

    queue: ChannelQueue[str] = ChannelQueue(registry, run)
    queue.submit(CHANNEL, "m1")
    queue.submit(CHANNEL, "m2")
    await queue.join(CHANNEL)
    assert finished == ["m1", "m2"]
