"""What senders in a busy channel are told and when turns run (SPEC D4, S6): the queue's
default bounds, the refusal window per sender, clearing one sender's messages, a lock held
from outside the queue, and a turn that outlives its lock being cancelled before the next
one starts."""

from __future__ import annotations

import asyncio
import logging

import pytest

from discord_io.channel_queue import ChannelQueue, Submission
from fsm.engine.locks import ChannelLock, ChannelLockRegistry

from test_discord_channel_queue import CHANNEL, FakeTurns

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


def _sender(message: str) -> str:
    return message.split(":")[0]


def _queue(turns: FakeTurns, **options: object) -> ChannelQueue[str]:
    return ChannelQueue(turns.registry, turns.run, user_of=_sender, **options)  # type: ignore[arg-type]


async def test_by_default_ten_messages_wait_and_the_eleventh_is_refused() -> None:
    # covers D4
    turns = FakeTurns(ChannelLockRegistry())
    queue = _queue(turns)
    first = queue.submit(CHANNEL, "ann:0")
    waiting = [queue.submit(CHANNEL, f"ann:{n}") for n in range(1, 11)]
    refused = queue.submit(CHANNEL, "ann:11")
    assert first == Submission("started") and first.position == 0 and first.accepted
    assert [s.position for s in waiting] == list(range(1, 11))
    assert all(s.status == "queued" and s.accepted for s in waiting)
    assert refused.status == "full" and not refused.accepted and refused.position == 10
    assert refused.refusal is not None
    assert refused.refusal.startswith("I'm still working through earlier messages")
    assert refused.refusal.endswith("Please send it again in a little while.")
    await queue.aclose()


async def test_no_queue_at_all_refuses_every_message_while_a_turn_runs() -> None:
    # covers D4
    turns = FakeTurns(ChannelLockRegistry())
    queue = _queue(turns, max_queued=0)
    assert queue.submit(CHANNEL, "ann:0").status == "started"
    assert queue.submit(CHANNEL, "bo:1").status == "full"
    await queue.aclose()
    with pytest.raises(ValueError, match="must not be negative"):
        _queue(turns, max_queued=-1)


async def test_a_sender_is_told_once_a_minute_that_the_queue_is_full() -> None:
    # covers D4: spam never spends the channel's send budget on refusals
    turns = FakeTurns(ChannelLockRegistry())
    await asyncio.sleep(1000)  # a bot that has been up a while
    queue = _queue(turns, max_queued=0)
    queue.submit(CHANNEL, "ann:run")
    assert queue.submit(CHANNEL, "ann:a").refusal is not None
    assert queue.submit(CHANNEL, "bo:a").refusal is not None  # each sender is told
    await asyncio.sleep(59.9)
    assert queue.submit(CHANNEL, "ann:b").refusal is None
    await asyncio.sleep(0.1)
    assert queue.submit(CHANNEL, "ann:c").refusal is not None  # a minute on: told again
    assert queue.submit(CHANNEL, "ann:d").refusal is None
    await queue.aclose()


async def test_a_sender_refused_among_a_thousand_others_is_still_remembered() -> None:
    # covers D4: forgetting old refusals to bound memory never forgets a recent one
    turns = FakeTurns(ChannelLockRegistry())
    await asyncio.sleep(1000)
    queue = _queue(turns, max_queued=0)
    queue.submit(CHANNEL, "host:run")
    for n in range(1100):
        assert queue.submit(CHANNEL, f"user{n}:x").refusal is not None
    assert queue.submit(CHANNEL, "user0:again").refusal is None
    assert queue.submit(CHANNEL, "user1099:again").refusal is None
    await queue.aclose()


async def test_a_stopping_channel_takes_no_message() -> None:
    # covers D4
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry)
    queue = _queue(turns)
    queue.submit(CHANNEL, "ann:0")
    await asyncio.sleep(0)
    registry.request_stop(CHANNEL)
    refused = queue.submit(CHANNEL, "ann:1")
    assert refused.status == "stopping" and not refused.accepted
    assert refused.refusal == ("I'm stopping the current reply here; please send that again "
                               "in a moment.")
    await queue.aclose()


async def test_clearing_one_senders_messages_keeps_the_others_in_order() -> None:
    # covers D4: /kill of one user's follow-ups
    turns = FakeTurns(ChannelLockRegistry())
    queue = _queue(turns)
    for message in ("ann:run", "bo:1", "ann:2", "cy:3", "ann:4", "bo:5"):
        queue.submit(CHANNEL, message)
    assert queue.clear(CHANNEL, user="ann") == 2
    assert queue.pending(CHANNEL) == ("bo:1", "cy:3", "bo:5")
    assert queue.clear(CHANNEL, user="nobody") == 0
    assert queue.waiting() == 3
    assert queue.clear(CHANNEL) == 3 and queue.pending(CHANNEL) == ()
    assert queue.clear("elsewhere") == 0
    await queue.aclose()


async def test_a_lock_held_outside_the_queue_is_waited_for() -> None:
    # covers D4: another part of the bot holding the channel's lock delays the turn
    registry = ChannelLockRegistry()
    turns = FakeTurns(registry)
    queue = _queue(turns)
    outside = registry.try_acquire(CHANNEL, "elsewhere")
    assert outside is not None
    queue.submit(CHANNEL, "ann:0")
    await asyncio.sleep(5)
    assert turns.started == []
    registry.release(outside)
    await asyncio.sleep(0.1)
    assert turns.started == ["ann:0"]
    lock = registry.get(CHANNEL)
    assert lock is not None and lock.owner == "queued-turn"
    turns.gate("ann:0").set()
    await queue.join(CHANNEL)


async def test_a_turn_that_outlives_its_lock_is_cancelled_and_unwinds_before_the_next(
        caplog: pytest.LogCaptureFixture) -> None:
    # covers D4, S6: by default five seconds to finish, then cancelled, then five to unwind
    caplog.set_level(logging.WARNING)
    registry = ChannelLockRegistry()
    events: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()

    async def run(message: str, lock: ChannelLock) -> None:
        events.append((f"start {message}", loop.time()))
        if message != "stuck":
            return
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            events.append(("cancelled", loop.time()))
            await asyncio.sleep(1)  # closing its stream takes a moment
            events.append(("unwound", loop.time()))
            raise

    queue: ChannelQueue[str] = ChannelQueue(registry, run)
    queue.submit(CHANNEL, "stuck")
    queue.submit(CHANNEL, "next")
    await asyncio.sleep(1)
    lock = registry.get(CHANNEL)
    assert lock is not None
    registry.release(lock)  # as the stale sweeper does
    await queue.join(CHANNEL)
    names = [name for name, _ in events]
    assert names == ["start stuck", "cancelled", "unwound", "start next"]
    assert events[1][1] == pytest.approx(6.0)
    assert any("outlived its lock" in r.getMessage() for r in caplog.records)
