"""The channel queue in Redis: one turn per channel across every worker process (D4).

`submit` is one script: a duplicate delivery is dropped, a busy channel queues the record
(bound `max_queued`, one polite refusal), a free channel is leased to this worker, which
then runs the channel's turns in order, popping the next record or releasing the lease in one
script after each. The turn itself runs here exactly as in-process: a local `ChannelLock`
(touch, watchdog, stale release, kill handles) backed by the lease. A lease that lapses (the
worker crashed) is taken over by another worker, which runs the rest of the queue in order;
the turn that was in flight is lost, not retried — part of it is already in Discord.

Nothing read back from Redis is trusted (V7): a queued record that is not the JSON object
this module writes (not JSON, a field missing or of another type) is logged and skipped, and
the worker goes on with the next record under the same lease. A `/kill` or follow-up signal
names the fence of the turn it targets, and is ignored by any other turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from fsm import ChannelLock, ChannelLockRegistry

from ..channel_queue import (
    DEFAULT_MAX_QUEUED,
    DEFAULT_REFUSAL_WINDOW_S,
    DEFAULT_STALE_GRACE_S,
    QUEUE_FULL_TEXT,
    STOPPING_TEXT,
    Submission,
    acquire_lock,
    run_supervised,
)
from . import scripts
from .connection import check_server
from .fence import current_lease
from .lease import Lease, LeaseKeeper, LeaseTimings
from .signals import WorkerInbox

log = logging.getLogger(__name__)

M = TypeVar("M")

DEFAULT_PREFIX = "turn:"
DEDUP_TTL_S = 900
"""How long a delivered message or interaction id is remembered: far longer than two gateway
sessions of one shard overlap during a deploy."""
TAKEOVER_BATCH = 100
MIN_UPKEEP_DELAY_S = 0.05
LOCAL_MESSAGES = 1000
UNAVAILABLE_TEXT = (
    "I can't take messages right now: my coordination service is unreachable. "
    "Please send that again in a minute."
)


MAX_ID_CHARS = 64
"""Discord ids are 20 digits at most; an id field longer than this is not one of ours."""


class BadRecord(ValueError):
    """A queue record that is not what `QueuedRecord.to_json` writes; the message says why
    in a few words, never quoting the record."""


def _id_field(data: dict[str, object], name: str) -> str:
    value = data.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
        raise BadRecord(f"{name} missing or not an id")
    return value


@dataclass(frozen=True, slots=True)
class QueuedRecord:
    """A queued message as Redis holds it: plain ids, not a `discord.Message`."""

    message_id: str
    channel_id: str
    author: str

    def to_json(self) -> str:
        return json.dumps({"message_id": self.message_id, "channel_id": self.channel_id,
                           "author": self.author}, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: object) -> QueuedRecord:
        """The record `raw` holds; BadRecord for anything else."""
        if not isinstance(raw, (bytes, str)):
            raise BadRecord("not a string")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            raise BadRecord("not JSON") from None
        if not isinstance(data, dict):
            raise BadRecord("not a JSON object")
        return cls(_id_field(data, "message_id"), _id_field(data, "channel_id"),
                   _id_field(data, "author"))


@dataclass(frozen=True, slots=True)
class KillOutcome:
    """What /kill did: `duplicate` is a second delivery of the interaction (answered by the
    session that got it first)."""

    status: Literal["done", "duplicate", "not_allowed"]
    running: bool = False
    dropped: int = 0
    others_running: bool = False
    """A user without the wider right dropped their own messages; another's reply runs on."""


@dataclass(frozen=True, slots=True)
class RunningTurn:
    """What a turn knows of its lease, for journals: who ran it under which fence."""

    worker_id: str
    fence: int


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _count(value: object) -> int:
    """A count a script read from Redis (a chain or a queue length); 0 when it is none."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, int):
        return max(0, value)
    return int(value) if isinstance(value, str) and value.isascii() and value.isdigit() else 0


def _decoded(channel_id: str, raw: object) -> QueuedRecord | None:
    """The record, or None (logged) for one that is not a record: the caller skips it."""
    try:
        return QueuedRecord.from_json(raw)
    except BadRecord as exc:
        log.warning("channel %s: a queued record is malformed (%s); skipped", channel_id, exc)
        return None


class RedisChannelQueue(Generic[M]):
    """Runs turns one channel at a time across processes; the same role as `ChannelQueue`."""

    def __init__(
        self,
        redis: Redis,
        registry: ChannelLockRegistry,
        run_turn: Callable[[M, ChannelLock], Awaitable[None]],
        *,
        record_of: Callable[[M], QueuedRecord],
        load: Callable[[QueuedRecord], Awaitable[M | None]],
        on_follow_up: Callable[[str, int], None] | None = None,
        max_queued: int = DEFAULT_MAX_QUEUED,
        timings: LeaseTimings | None = None,
        worker_id: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        stale_grace_s: float = DEFAULT_STALE_GRACE_S,
        refusal_window_s: float = DEFAULT_REFUSAL_WINDOW_S,
        owns_redis: bool = False,
    ) -> None:
        if max_queued < 0:
            raise ValueError("max_queued must not be negative")
        self.redis = redis
        self._registry = registry
        self._run_turn = run_turn
        self._record_of = record_of
        self._load = load
        self._on_follow_up = on_follow_up
        self.max_queued = max_queued
        self.timings = timings if timings is not None else LeaseTimings()
        self.worker_id = worker_id if worker_id is not None else default_worker_id()
        self.prefix = prefix
        self.stale_grace_s = stale_grace_s
        self.refusal_window_s = max(1.0, refusal_window_s)
        self._owns_redis = owns_redis
        self._closing = False
        self._draining = False
        self._closed = False
        self.keeper = LeaseKeeper(redis, prefix, self.timings, on_lost=self._stop_turn,
                                  on_stop=self._stop_turn)
        self.inbox = WorkerInbox(redis, f"{prefix}worker:{self.worker_id}",
                                 on_kill=self._on_kill, on_follow_up=self._follow_up)
        self._submit = redis.register_script(scripts.SUBMIT)
        self._pop_next = redis.register_script(scripts.POP_NEXT)
        self._hand_over = redis.register_script(scripts.HAND_OVER)
        self._kill = redis.register_script(scripts.KILL)
        self._takeover = redis.register_script(scripts.TAKEOVER)
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._local: OrderedDict[str, M] = OrderedDict()
        self._upkeep: asyncio.Task[None] | None = None
        self.running: dict[str, RunningTurn] = {}
        """The channels this worker runs a turn in now, with the turn's fence."""
        self.taken_over = 0
        self.stale_signals = 0
        """Signals ignored because they named another turn's fence."""

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Subscribe to this worker's inbox, then renew and take over on a schedule."""
        warning = await check_server(self.redis)
        if warning is not None:
            log.warning("%s", warning)
        await self.inbox.start()
        if self._upkeep is None:
            self._upkeep = asyncio.create_task(self._run_upkeep(), name="lease-upkeep")

    async def drain(self, grace_s: float) -> None:
        """Shut down gently: the running turns end (the caller stopped them), no next turn
        starts here, and each lease goes back as its turn ends, so the other workers run what
        is queued. Then `aclose`."""
        self._draining = True
        workers = list(self._workers.values())
        if workers:
            await asyncio.wait(workers, timeout=grace_s)
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every local turn and hand the leases back (what is queued stays queued for
        another worker). Idempotent."""
        if self._closed:
            return
        self._closed = True
        upkeep, self._upkeep = self._upkeep, None
        if upkeep is not None:
            upkeep.cancel()
            await asyncio.wait({upkeep})
        self._closing = True
        leases = [lease for lease in (self.keeper.get(c) for c in self._workers) if lease]
        workers = list(self._workers.values())
        for worker in workers:
            worker.cancel()
        if workers:
            await asyncio.wait(workers)
        await self._give_back(leases)
        await self.inbox.stop()
        if self._owns_redis:
            await self.redis.aclose()

    # ---- the queue's interface -----------------------------------------------------------

    async def submit(self, channel_id: str, message: M) -> Submission:
        """Lease the channel and run `message` now, or queue it, or refuse it."""
        record = self._record_of(message)
        token = f"{self.worker_id}:{uuid.uuid4().hex[:12]}"
        sent_at = asyncio.get_running_loop().time()
        try:
            reply = await self._submit(args=[
                self.prefix, channel_id, record.to_json(), f"message:{record.message_id}",
                self.worker_id, token, self.timings.ttl_ms, self.max_queued, record.author,
                DEDUP_TTL_S, int(self.refusal_window_s)])
        except (RedisError, OSError) as exc:
            log.error("channel %s: queue unreachable (%s)", channel_id, type(exc).__name__)
            return Submission("unavailable", refusal=UNAVAILABLE_TEXT)
        status = _text(reply[0])
        if status == "duplicate":
            log.info("channel %s: message %s delivered twice; dropped", channel_id,
                     record.message_id)
            return Submission("duplicate")
        if status == "stopping":
            return Submission("stopping", refusal=STOPPING_TEXT)
        if status == "full":
            text = QUEUE_FULL_TEXT if int(reply[2]) else None  # spam spends no send budget
            return Submission("full", position=int(reply[1]), refusal=text)
        if status == "queued":
            self._remember(message, record)
            return Submission("queued", position=int(reply[1]))
        waiting, fence, head = int(reply[1]), int(reply[2]), _decoded(channel_id, reply[3])
        self._remember(message, record)
        lease = Lease(channel_id, token, fence, self.timings.valid_until(sent_at))
        self._spawn(lease, head, _count(reply[4]))
        if head is not None and head.message_id == record.message_id:
            return Submission("started")
        return Submission("queued", position=waiting)

    async def kill(self, channel_id: str, interaction_id: str, *, user_id: int = 0,
                   privileged: bool = True) -> KillOutcome:
        """`/kill` from any process: stop the channel's turn wherever it runs and drop its
        queue. A user who is not `privileged` may stop only the reply to their own message
        and drop only their own queued messages (A7)."""
        reply = await self._kill(args=[self.prefix, channel_id,
                                       f"interaction:{interaction_id}", DEDUP_TTL_S,
                                       str(user_id), "1" if privileged else "0"])
        status = _text(reply[0])
        if status == "done":
            return KillOutcome("done", bool(int(reply[1])), int(reply[2]),
                               len(reply) > 3 and bool(int(reply[3])))
        return KillOutcome("duplicate" if status == "duplicate" else "not_allowed")

    def busy(self, channel_id: str) -> bool:
        """Whether this worker runs the channel's turns now."""
        return channel_id in self._workers

    def pending(self, channel_id: str) -> tuple[M, ...]:
        """The local view of waiting messages: the queue is in Redis, so none are kept here."""
        return ()

    async def join(self, channel_id: str) -> None:
        """Wait until this worker no longer runs the channel's turns."""
        while (worker := self._workers.get(channel_id)) is not None:
            await asyncio.wait({worker})

    # ---- running a channel ---------------------------------------------------------------

    def _remember(self, message: M, record: QueuedRecord) -> None:
        """Keep a message delivered here, so the worker that pops it here needs no fetch."""
        self._local[record.message_id] = message
        while len(self._local) > LOCAL_MESSAGES:
            self._local.popitem(last=False)

    def _spawn(self, lease: Lease, head: QueuedRecord | None, chain: int) -> None:
        self.keeper.add(lease)
        self._workers[lease.channel_id] = asyncio.create_task(
            self._work(lease, head, chain), name=f"redis-queue:{lease.channel_id}")

    async def _work(self, lease: Lease, record: QueuedRecord | None, chain: int) -> None:
        """Run the channel's records in order while the lease holds; a malformed record
        (None) is skipped, and the next one popped under the same lease."""
        current_lease.set(lease)  # the turn's tasks inherit it: the send gate reads it
        channel_id = lease.channel_id
        try:
            while True:
                interrupts = chain if record is None else \
                    await self._run_record(lease, record, chain)
                if self._draining:
                    await self._give_back([lease])
                    return
                step = await self._next(lease, interrupts)
                if step is None:
                    return
                record, chain = step
        except asyncio.CancelledError:
            if not self._closing:  # on close, all leases go back in one round trip
                await self._give_back([lease])
            raise
        finally:
            self.keeper.remove(lease)
            self.running.pop(channel_id, None)
            if self._workers.get(channel_id) is asyncio.current_task():
                del self._workers[channel_id]

    async def _run_record(self, lease: Lease, record: QueuedRecord, chain: int) -> int:
        """Run one queued record's turn; returns the follow-up interrupts counted so far."""
        message = self._local.pop(record.message_id, None)
        if message is None:
            try:
                message = await self._load(record)
            except Exception:
                log.exception("channel %s: queued message %s could not be loaded",
                              lease.channel_id, record.message_id)
        if message is None or not lease.held(asyncio.get_running_loop().time()):
            return chain
        owner = f"{record.message_id}@{self.worker_id}.f{lease.fence}"  # names the journals
        lock = await acquire_lock(self._registry, lease.channel_id, owner)
        lock.follow_up_interrupts = chain
        if lease.stop:
            lock.stop_requested = True
        self.running[lease.channel_id] = RunningTurn(self.worker_id, lease.fence)
        await run_supervised(self._registry, lock, lambda: self._guarded(message, lock),
                             self.stale_grace_s)
        return 0 if lock.stop_requested else lock.follow_up_interrupts

    async def _guarded(self, message: M, lock: ChannelLock) -> None:
        try:
            await self._run_turn(message, lock)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("channel %s: turn failed", lock.channel_id)

    async def _next(self, lease: Lease, interrupts: int
                    ) -> tuple[QueuedRecord | None, int] | None:
        """Pop the channel's next record under the lease (None for a malformed one), or
        release it when none is left. Retries while Redis is unreachable and the lease still
        holds locally."""
        loop = asyncio.get_running_loop()
        while True:
            if lease.lost:
                return None
            sent_at = loop.time()
            lease.popping = True
            try:
                reply = await self._pop_next(args=[self.prefix, lease.channel_id, lease.token,
                                                   self.timings.ttl_ms, interrupts])
                break
            except (RedisError, OSError) as exc:
                log.warning("channel %s: next turn not popped (%s)", lease.channel_id,
                            type(exc).__name__)
                if not lease.held(loop.time()):
                    self.keeper.lose(lease, "Redis unreachable")
                    return None
                await asyncio.sleep(min(self.timings.renew_every_s / 4, 0.25))
            finally:
                lease.popping = False
        status = _text(reply[0])
        if status == "lost":
            self.keeper.lose(lease, "another worker took the channel over")
            return None
        if status == "released":
            return None
        lease.fence = int(reply[1])
        lease.stop = False
        lease.valid_until = self.timings.valid_until(sent_at)
        return _decoded(lease.channel_id, reply[2]), _count(reply[3])

    async def _give_back(self, leases: list[Lease]) -> None:
        """On shutdown: hand the leases over, so other workers run what is queued at once."""
        held = [lease for lease in leases if not lease.lost]
        if not held:
            return
        try:
            async with asyncio.timeout(self.timings.renew_every_s):
                async with self.redis.pipeline(transaction=False) as pipe:
                    for lease in held:
                        await self._hand_over(args=[self.prefix, lease.channel_id, lease.token],
                                              client=pipe)
                    await pipe.execute()
        except (RedisError, OSError, TimeoutError):
            log.warning("%d lease(s) not handed back; they will lapse", len(held))

    # ---- signals and upkeep --------------------------------------------------------------

    def _stop_turn(self, lease: Lease) -> None:
        """Lease lost, or stop flagged by a renewal: stop the local turn (S7) — the turn of
        this lease, not a later one of the same channel."""
        if self.keeper.get(lease.channel_id) is lease:
            self._registry.request_stop(lease.channel_id)

    def _targeted(self, what: str, channel_id: str, fence: int) -> Lease | None:
        """The lease a signal targets: this worker's for the channel, running the turn of
        `fence`. A signal for an earlier turn (late, or replayed) is ignored."""
        lease = self.keeper.get(channel_id)
        if lease is None or lease.fence != fence:
            self.stale_signals += 1
            log.info("channel %s: %s for fence %d ignored (running: %s)", channel_id, what,
                     fence, "none" if lease is None else f"fence {lease.fence}")
            return None
        return lease

    def _on_kill(self, channel_id: str, fence: int) -> None:
        lease = self._targeted("kill", channel_id, fence)
        if lease is not None:
            lease.stop = True
            self._registry.request_stop(channel_id)

    def _follow_up(self, channel_id: str, author_id: int, fence: int) -> None:
        if self._on_follow_up is not None and \
                self._targeted("follow-up", channel_id, fence) is not None:
            self._on_follow_up(channel_id, author_id)

    async def upkeep_once(self) -> None:
        """Renew every lease, then take over channels whose owner's lease lapsed."""
        await self.keeper.renew_all()
        await self.take_over()

    async def take_over(self) -> int:
        """One takeover scan; returns how many channels this worker took over."""
        sent_at = asyncio.get_running_loop().time()
        try:
            taken = await self._takeover(args=[self.prefix, self.worker_id,
                                               f"{self.worker_id}:{uuid.uuid4().hex[:8]}",
                                               self.timings.ttl_ms, TAKEOVER_BATCH])
        except (RedisError, OSError) as exc:
            log.warning("takeover scan failed: %s", type(exc).__name__)
            return 0
        for channel, token, fence, head, chain in taken:
            channel_id = _text(channel)
            log.warning("channel %s: lease of a lost worker taken over", channel_id)
            lease = Lease(channel_id, _text(token), int(fence), self.timings.valid_until(sent_at))
            self._spawn(lease, _decoded(channel_id, head), _count(chain))
        self.taken_over += len(taken)
        return len(taken)

    async def _run_upkeep(self) -> None:
        """Renew every period; wake earlier when another worker's lease is due to lapse, so
        its channel is taken over right after its lifetime."""
        while True:
            try:
                await self.upkeep_once()
            except Exception:
                log.exception("lease upkeep failed")
            delay = self.timings.renew_every_s
            due = self.keeper.next_expiry_in_s
            if due is not None and due < delay:
                delay = max(due + 0.005, MIN_UPKEEP_DELAY_S)
            await asyncio.sleep(delay)
