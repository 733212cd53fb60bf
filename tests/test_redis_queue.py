"""The Redis queue, lease and kill between two workers (two queues, two Redis connections)
against a real redis-server (SPEC D3, D4, S7, S17). Order and exclusion are asserted on
conditions the workers reach, not on time. What the worker decides by its own clock (when a
lease it cannot renew counts as lost) runs in virtual time; Redis going away is real time.
Records and signals read back from Redis are untrusted (V7)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from discord_io.channel_queue import QUEUE_FULL_TEXT, STOPPING_TEXT
from discord_io.redis_backend.connection import connect
from discord_io.redis_backend.fence import LeaseLostError, check_lease, current_lease
from discord_io.redis_backend.lease import Lease, LeaseKeeper, LeaseTimings
from discord_io.redis_backend.queue import UNAVAILABLE_TEXT, QueuedRecord, RedisChannelQueue
from discord_io.testing.redis_server import RedisServer, running_redis
from fsm.engine.locks import ChannelLock, ChannelLockRegistry

pytestmark = pytest.mark.asyncio


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A fresh redis-server per test, in its own directory (a unix socket path stays short)."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@dataclass(frozen=True)
class Msg:
    id: str
    channel: str
    author: str = "1"


@dataclass
class Worker:
    """One worker: its queue and what its turns did. A turn runs until `finish` is set or
    its lock's kill fires."""

    name: str
    queue: RedisChannelQueue[Msg]
    registry: ChannelLockRegistry
    log: list[tuple[str, str]]
    running: dict[str, int]
    finish: dict[str, asyncio.Event] = field(default_factory=dict)
    follow_ups: list[tuple[str, int]] = field(default_factory=list)
    started: asyncio.Condition = field(default_factory=asyncio.Condition)

    def release(self, message_id: str) -> None:
        self.finish.setdefault(message_id, asyncio.Event()).set()

    async def wait_started(self, message_id: str) -> None:
        async with self.started:
            await self.started.wait_for(lambda: ("start", message_id) in
                                        [(e, m) for e, m in self.log])


def _worker(name: str, url: str, log: list[tuple[str, str]], running: dict[str, int],
            **options: object) -> Worker:
    registry = ChannelLockRegistry()
    holder: list[Worker] = []

    async def run_turn(message: Msg, lock: ChannelLock) -> None:
        me = holder[0]
        running[message.channel] = running.get(message.channel, 0) + 1
        assert running[message.channel] == 1, "two turns at once in one channel"
        log.append(("start", message.id))
        async with me.started:
            me.started.notify_all()
        done = me.finish.setdefault(message.id, asyncio.Event())
        killed = asyncio.Event()
        lock.turn_kill = lambda _reason: killed.set()
        try:
            waiters = {asyncio.create_task(done.wait()), asyncio.create_task(killed.wait())}
            _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            log.append(("killed" if killed.is_set() else "end", message.id))
        finally:
            running[message.channel] -= 1

    async def load(record: QueuedRecord) -> Msg:
        return Msg(record.message_id, record.channel_id, record.author)

    def on_follow_up(channel_id: str, author: int) -> None:
        holder[0].follow_ups.append((channel_id, author))

    queue: RedisChannelQueue[Msg] = RedisChannelQueue(
        connect(url), registry, run_turn,
        record_of=lambda m: QueuedRecord(m.id, m.channel, m.author), load=load,
        on_follow_up=on_follow_up, worker_id=name, owns_redis=True, **options)  # type: ignore[arg-type]
    worker = Worker(name, queue, registry, log, running)
    holder.append(worker)
    return worker


@asynccontextmanager
async def two_workers(server: RedisServer, **options: object
                      ) -> AsyncIterator[tuple[Worker, Worker, list[tuple[str, str]]]]:
    log: list[tuple[str, str]] = []
    running: dict[str, int] = {}
    a = _worker("A", server.url, log, running, **options)
    b = _worker("B", server.url, log, running, **options)
    await a.queue.start()
    await b.queue.start()
    try:
        yield a, b, log
    finally:
        await a.queue.aclose()
        await b.queue.aclose()


async def until(predicate: Callable[[], bool]) -> None:
    """Yield to the loop until `predicate` holds (bounded by the test's timeout)."""
    async with asyncio.timeout(30):
        while not predicate():
            await asyncio.sleep(0)


async def test_one_turn_per_channel_across_two_workers(redis_server: RedisServer) -> None:
    # covers D4 across processes: a channel's turns run one at a time, in order, wherever
    # the messages arrived; another channel runs at the same time
    async with two_workers(redis_server) as (a, b, log):
        assert (await a.queue.submit("c1", Msg("m1", "c1"))).status == "started"
        queued = await b.queue.submit("c1", Msg("m2", "c1"))
        assert (queued.status, queued.position) == ("queued", 1)
        assert (await b.queue.submit("c2", Msg("m3", "c2"))).status == "started"
        await a.wait_started("m1")
        await b.wait_started("m3")
        assert a.queue.busy("c1") and not b.queue.busy("c1")
        a.release("m1")
        await a.wait_started("m2")  # the lease holder runs the queue, not the receiver
        a.release("m2")
        b.release("m3")
        await a.queue.join("c1")
        await b.queue.join("c2")
        c1 = [entry for entry in log if entry[1] in ("m1", "m2")]
        assert c1 == [("start", "m1"), ("end", "m1"), ("start", "m2"), ("end", "m2")]
        assert await a.queue.redis.exists("turn:lease:c1", "turn:lease:c2") == 0


async def test_duplicate_delivery_runs_once(redis_server: RedisServer) -> None:
    # covers D4: two gateway sessions of one shard deliver the same message to two workers
    async with two_workers(redis_server) as (a, b, log):
        first = await a.queue.submit("c1", Msg("m1", "c1"))
        second = await b.queue.submit("c1", Msg("m1", "c1"))
        assert first.status == "started"
        assert (second.status, second.refusal, second.accepted) == ("duplicate", None, False)
        a.release("m1")
        await a.queue.join("c1")
        assert log == [("start", "m1"), ("end", "m1")]


async def test_kill_from_the_other_worker_stops_the_turn_and_drops_the_queue(
        redis_server: RedisServer) -> None:
    # covers D3, S7 across processes: /kill at B reaches A's turn by pub/sub
    async with two_workers(redis_server) as (a, b, log):
        await a.queue.submit("c1", Msg("m1", "c1"))
        await a.wait_started("m1")
        await b.queue.submit("c1", Msg("m2", "c1", author="2"))
        outcome = await b.queue.kill("c1", interaction_id="i1")
        assert (outcome.status, outcome.running, outcome.dropped) == ("done", True, 1)
        again = await a.queue.kill("c1", interaction_id="i1")
        assert again.status == "duplicate"
        stopping = await b.queue.submit("c1", Msg("m3", "c1"))
        assert (stopping.status, stopping.refusal) == ("stopping", STOPPING_TEXT)
        await a.queue.join("c1")
        assert log == [("start", "m1"), ("killed", "m1")]
        assert a.queue.inbox.received == 1


async def test_kill_reaches_the_turn_by_renewal_when_pubsub_lost_it(
        redis_server: RedisServer) -> None:
    # covers S7: pub/sub may drop the signal; the stop flag comes back with the next renewal
    async with two_workers(redis_server) as (a, b, log):
        await a.queue.submit("c1", Msg("m1", "c1"))
        await a.wait_started("m1")
        await a.queue.inbox.stop()  # A hears nothing now
        outcome = await b.queue.kill("c1", interaction_id="i2")
        assert outcome.running
        assert log == [("start", "m1")]
        await a.queue.keeper.renew_all()
        await a.queue.join("c1")
        assert log == [("start", "m1"), ("killed", "m1")]
        assert a.queue.inbox.received == 0


async def test_kill_by_someone_else_needs_the_wider_right(redis_server: RedisServer) -> None:
    # covers D3: only the requester (or a moderator) stops a reply, whichever process
    # runs it and whichever gets the command
    async with two_workers(redis_server) as (a, b, log):
        await a.queue.submit("c1", Msg("m1", "c1", author="7"))
        await a.wait_started("m1")
        refused = await b.queue.kill("c1", "i3", user_id=8, privileged=False)
        assert refused.status == "not_allowed"
        own = await b.queue.kill("c1", "i4", user_id=7, privileged=False)
        assert (own.status, own.running) == ("done", True)
        await a.queue.join("c1")
        assert log[-1] == ("killed", "m1")


async def test_follow_up_from_the_same_user_reaches_the_running_worker(
        redis_server: RedisServer) -> None:
    # covers S17 across processes: the follow-up arrives at B, the turn runs at A
    async with two_workers(redis_server) as (a, b, _log):
        await a.queue.submit("c1", Msg("m1", "c1", author="7"))
        await a.wait_started("m1")
        await b.queue.submit("c1", Msg("m2", "c1", author="8"))
        await b.queue.submit("c1", Msg("m3", "c1", author="7"))
        await until(lambda: bool(a.follow_ups))
        assert a.follow_ups == [("c1", 7)]
        assert b.follow_ups == []
        for message_id in ("m1", "m2", "m3"):
            a.release(message_id)
        await a.queue.join("c1")


async def test_follow_up_count_carries_to_the_next_turn_across_workers(
        redis_server: RedisServer) -> None:
    # covers S17: the cap counts per busy stretch of the channel, whoever runs the next turn
    async with two_workers(redis_server) as (a, b, _log):
        await a.queue.submit("c1", Msg("m1", "c1"))
        await a.wait_started("m1")
        await b.queue.submit("c1", Msg("m2", "c1"))
        lock = a.registry.get("c1")
        assert lock is not None and lock.follow_up_interrupts == 0
        lock.follow_up_interrupts = 2
        a.release("m1")
        await a.wait_started("m2")
        lock = a.registry.get("c1")
        assert lock is not None and lock.follow_up_interrupts == 2
        a.release("m2")
        await a.queue.join("c1")
        assert await a.queue.redis.exists("turn:chain:c1") == 0


async def test_full_queue_is_refused_politely(redis_server: RedisServer) -> None:
    # covers D4: the bound holds across workers, with one polite refusal per sender per
    # window whichever worker the spam reaches
    async with two_workers(redis_server, max_queued=1) as (a, b, _log):
        await a.queue.submit("c1", Msg("m1", "c1"))
        assert (await b.queue.submit("c1", Msg("m2", "c1"))).status == "queued"
        full = await b.queue.submit("c1", Msg("m3", "c1"))
        assert (full.status, full.refusal, full.position) == ("full", QUEUE_FULL_TEXT, 1)
        again = await a.queue.submit("c1", Msg("m4", "c1"))  # same sender, other worker
        assert (again.status, again.refusal) == ("full", None)
        other = await a.queue.submit("c1", Msg("m5", "c1", author="9"))
        assert (other.status, other.refusal) == ("full", QUEUE_FULL_TEXT)
        await a.queue.kill("c1", "i5")
        await a.queue.join("c1")


async def test_shutdown_hands_the_queue_to_another_worker(redis_server: RedisServer) -> None:
    # covers D4: a worker that stops gives its lease back; another runs what is queued, at once
    async with two_workers(redis_server) as (a, b, log):
        await a.queue.submit("c1", Msg("m1", "c1"))
        await a.wait_started("m1")
        await b.queue.submit("c1", Msg("m2", "c1"))
        await a.queue.aclose()
        assert await b.queue.take_over() == 1
        await b.wait_started("m2")
        b.release("m2")
        await b.queue.join("c1")
        assert log[-2:] == [("start", "m2"), ("end", "m2")]


async def test_redis_down_stops_running_turns_and_refuses_new_ones_clearly(
        redis_server: RedisServer) -> None:
    # covers S7, D4: without Redis a worker cannot know it still owns a channel, so its turn
    # stops once the lease's local validity ends; a new message gets a clear notice; once
    # Redis is back, messages run again. About a process (redis-server) going away: real
    # time, short leases, waits on conditions only.
    timings = LeaseTimings(ttl_s=1.0, renew_every_s=0.25)
    async with two_workers(redis_server, timings=timings) as (a, b, log):
        await a.queue.submit("c1", Msg("m1", "c1"))
        await a.wait_started("m1")
        redis_server.stop()
        refused = await b.queue.submit("c2", Msg("m2", "c2"))
        assert (refused.status, refused.refusal) == ("unavailable", UNAVAILABLE_TEXT)
        await a.queue.join("c1")
        assert log == [("start", "m1"), ("killed", "m1")]
        assert a.queue.keeper.failures >= 1
        redis_server.start()
        assert (await b.queue.submit("c2", Msg("m3", "c2"))).status == "started"
        await b.wait_started("m3")
        b.release("m3")
        await b.queue.join("c2")


async def test_drain_lets_the_turn_end_and_leaves_the_queue_to_others(
        redis_server: RedisServer) -> None:
    # covers D4: a worker shutting down gently finishes (here: lets end) its turn but starts
    # no next one; the channel's queue goes to another worker, in order
    async with two_workers(redis_server) as (a, b, log):
        await a.queue.submit("c1", Msg("m1", "c1"))
        await a.wait_started("m1")
        await b.queue.submit("c1", Msg("m2", "c1", author="2"))
        await b.queue.submit("c1", Msg("m3", "c1", author="3"))
        draining = asyncio.create_task(a.queue.drain(30.0))
        a.release("m1")
        await draining
        assert log == [("start", "m1"), ("end", "m1")]
        assert await b.queue.take_over() == 1
        for message_id in ("m2", "m3"):
            await b.wait_started(message_id)
            b.release(message_id)
        await b.queue.join("c1")
        assert [m for e, m in log if e == "start"] == ["m1", "m2", "m3"]


@pytest.mark.looptime
async def test_unrenewed_lease_is_lost_at_its_local_deadline(tmp_path: Path) -> None:
    # covers S7: a worker that cannot reach Redis gives its lease up at 80 % of the lifetime
    # after the last renewal it sent (virtual time), before Redis would let another worker in
    unreachable = connect(f"unix://{tmp_path / 'no-redis.sock'}")
    timings = LeaseTimings(ttl_s=10.0, renew_every_s=3.0)
    lost: list[float] = []
    loop = asyncio.get_running_loop()
    keeper = LeaseKeeper(unreachable, "turn:", timings,
                         on_lost=lambda lease: lost.append(loop.time()),
                         on_stop=lambda lease: None)
    sent_at = loop.time()
    lease = Lease("c1", "token", 1, valid_until=timings.valid_until(sent_at))
    keeper.add(lease)
    while not lost:
        await keeper.renew_all()
        await asyncio.sleep(timings.renew_every_s)
    assert keeper.failures >= 2
    assert lease.lost and not lease.held(loop.time())
    assert lost[0] - sent_at == pytest.approx(9.0)  # the first upkeep tick past 8 s
    await unreachable.aclose()


async def test_send_gate_refuses_writes_once_the_lease_is_lost() -> None:
    # covers S7 (a worker that lost its lease sends nothing more): reads stay allowed
    lease = Lease("c1", "token", 3, valid_until=asyncio.get_running_loop().time() + 60)
    current_lease.set(lease)
    check_lease("POST")
    lease.lost = True
    check_lease("GET")
    with pytest.raises(LeaseLostError, match="fence 3"):
        check_lease("POST")
    current_lease.set(None)
    check_lease("POST")


async def test_a_kill_without_the_wider_right_drops_only_the_users_own_queued_messages(
        redis_server: RedisServer) -> None:
    # covers A7 across processes: the requester stops their own reply and drops their own
    # queued messages; another user's question stays queued and is answered; a user whose
    # only stake is a queued message drops it and leaves the running reply alone
    async with two_workers(redis_server) as (a, b, log):
        await a.queue.submit("c1", Msg("m1", "c1", author="7"))
        await a.wait_started("m1")
        for message_id, author in (("m2", "8"), ("m3", "7"), ("m4", "9")):
            await b.queue.submit("c1", Msg(message_id, "c1", author=author))
        theirs = await b.queue.kill("c1", "i5", user_id=9, privileged=False)
        assert (theirs.status, theirs.running, theirs.dropped) == ("done", False, 1)
        assert theirs.others_running
        own = await b.queue.kill("c1", "i6", user_id=7, privileged=False)
        assert (own.status, own.running, own.dropped) == ("done", True, 1)
        await a.wait_started("m2")
        a.release("m2")
        await a.queue.join("c1")
        assert log == [("start", "m1"), ("killed", "m1"), ("start", "m2"), ("end", "m2")]


MALFORMED_RECORDS = [
    '{"message_id": "m9", "channel_id": "c1"}',  # no author: a KeyError killed the worker
    "not json at all",
    "5",
    '["m9", "c1", "1"]',
    '{"message_id": {"x": 1}, "channel_id": "c1", "author": "1"}',
    '{"message_id": "' + "9" * 500 + '", "channel_id": "c1", "author": "1"}',
]


async def test_a_malformed_queue_record_is_skipped_under_the_same_lease(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    # covers V7, D4: records read back from Redis are decoded defensively; each bad one is
    # logged and skipped, and the worker goes on with the next record under the same lease
    # (before, the first one killed the channel's worker, and the channel waited one lease
    # lifetime for a takeover)
    async with two_workers(redis_server) as (a, b, log):
        await a.queue.submit("c1", Msg("m1", "c1"))
        await a.wait_started("m1")
        token = await a.queue.redis.hget("turn:lease:c1", "token")
        await a.queue.redis.rpush("turn:queue:c1", *MALFORMED_RECORDS)
        assert (await b.queue.submit("c1", Msg("m2", "c1"))).status == "queued"
        a.release("m1")
        await until(lambda: ("start", "m2") in log)
        assert a.queue.busy("c1") and not b.queue.busy("c1")
        assert await a.queue.redis.hget("turn:lease:c1", "token") == token
        a.release("m2")
        await a.queue.join("c1")
        assert [entry for entry in log if entry[0] == "start"] == [("start", "m1"),
                                                                  ("start", "m2")]
    skipped = [r for r in caplog.records if "queued record is malformed" in r.getMessage()]
    assert len(skipped) == len(MALFORMED_RECORDS)
    assert all("9" * 100 not in r.getMessage() for r in skipped)


async def test_a_malformed_record_at_the_head_of_a_free_or_lost_channel_is_skipped(
        redis_server: RedisServer) -> None:
    # covers V7, D4: the record a free channel starts with (left by a crashed owner) and the
    # one a takeover starts with are read as defensively as the next one
    async with two_workers(redis_server) as (a, b, log):
        await a.queue.redis.rpush("turn:queue:c2", "{broken")
        submitted = await a.queue.submit("c2", Msg("m3", "c2"))
        assert submitted.accepted
        await a.wait_started("m3")
        a.release("m3")
        await a.queue.join("c2")
        await a.queue.redis.rpush("turn:queue:c3", '{"author": 1}',
                                  QueuedRecord("m4", "c3", "1").to_json())
        await a.queue.redis.zadd("turn:leases", {"c3": 0})  # an owner that vanished
        assert await b.queue.take_over() == 1
        await b.wait_started("m4")
        b.release("m4")
        await b.queue.join("c3")
        assert [m for e, m in log if e == "start"] == ["m3", "m4"]


async def test_a_signal_for_another_turns_fence_is_ignored(redis_server: RedisServer) -> None:
    # covers V7, D3, S17: a kill or follow-up names the fence of the turn it targets; one
    # replayed from an earlier turn of the channel, or naming none, stops nothing
    async with two_workers(redis_server) as (a, b, log):
        await a.queue.submit("c1", Msg("m1", "c1"))
        await a.wait_started("m1")
        a.release("m1")
        await a.queue.join("c1")
        await a.queue.submit("c1", Msg("m2", "c1", author="7"))
        await a.wait_started("m2")
        fence = int(await a.queue.redis.hget("turn:lease:c1", "fence") or 0)
        inbox = "turn:worker:A"
        for stale in ({"op": "kill", "channel": "c1"},
                      {"op": "kill", "channel": "c1", "fence": fence - 1},
                      {"op": "follow_up", "channel": "c1", "author": "7", "fence": fence - 1},
                      {"op": "kill", "channel": "c1", "fence": True},
                      {"op": "kill", "channel": ["c1"], "fence": fence}):
            await a.queue.redis.publish(inbox, json.dumps(stale))
        await a.queue.redis.publish(inbox, json.dumps(
            {"op": "follow_up", "channel": "c1", "author": "7", "fence": fence}))
        await until(lambda: bool(a.follow_ups))  # pub/sub keeps order: all were read
        lock = a.registry.get("c1")
        assert lock is not None and not lock.stop_requested
        assert a.follow_ups == [("c1", 7)]
        assert ("killed", "m2") not in log
        outcome = await b.queue.kill("c1", interaction_id="i9")  # names the running fence
        assert outcome.running
        await a.queue.join("c1")
        assert log[-1] == ("killed", "m2")
        assert a.queue.stale_signals == 2

