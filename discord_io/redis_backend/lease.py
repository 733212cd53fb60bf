"""A channel's lease and the worker's upkeep of all its leases in one round trip.

A lease is the cross-process form of the channel lock: an owner token, a fencing counter
and a lifetime on the Redis clock. The worker renews every lease it holds in one script call
per period (not per chunk: liveness is the lease, progress stays the local lock's touch).
Locally a lease counts as held until the moment its last renewal was *sent* plus a safety
share of the lifetime, so a worker that was paused or cut off knows it lost the lease
before Redis hands the channel to someone else — and stops before its next send.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from . import scripts

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL_S = 10.0
DEFAULT_RENEW_EVERY_S = 3.0
RENEW_BATCH = 200
SAFETY_SHARE = 0.8
"""The share of the lifetime a lease is trusted locally after a renewal was sent: the rest
absorbs clock-rate differences between this host and Redis."""


def _loop_time() -> float:
    return asyncio.get_running_loop().time()


@dataclass(eq=False, slots=True)
class Lease:
    """This worker's lease on one channel while it runs the channel's turns."""

    channel_id: str
    token: str
    fence: int
    valid_until: float
    lost: bool = False
    stop: bool = False
    popping: bool = False
    """The owner is popping the next turn or releasing: that answer, not a renewal's, says
    whether the lease goes on."""

    def held(self, now: float) -> bool:
        """Whether this worker may still act for the channel (send, start a turn)."""
        return not self.lost and now < self.valid_until


@dataclass(frozen=True, slots=True)
class LeaseTimings:
    """Lease lifetime and renewal period; the lifetime spans a few periods."""

    ttl_s: float = DEFAULT_LEASE_TTL_S
    renew_every_s: float = DEFAULT_RENEW_EVERY_S

    def __post_init__(self) -> None:
        if self.renew_every_s <= 0 or self.ttl_s < 2 * self.renew_every_s:
            raise ValueError("the lease lifetime must span at least two renewal periods")

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl_s * 1000)

    def valid_until(self, sent_at: float) -> float:
        return sent_at + self.ttl_s * SAFETY_SHARE


class LeaseKeeper:
    """Renews this worker's leases in one call; reports leases lost or flagged to stop."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        timings: LeaseTimings,
        *,
        on_lost: Callable[[Lease], None],
        on_stop: Callable[[Lease], None],
        clock: Callable[[], float] = _loop_time,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self.timings = timings
        self._on_lost = on_lost
        self._on_stop = on_stop
        self._clock = clock
        self._renew = redis.register_script(scripts.RENEW)
        self._leases: dict[str, Lease] = {}
        self.next_expiry_in_s: float | None = None
        """How long until the earliest lease of any worker expires, as of the last renewal."""
        self.renewals = 0
        self.failures = 0

    def __len__(self) -> int:
        return len(self._leases)

    def get(self, channel_id: str) -> Lease | None:
        return self._leases.get(channel_id)

    def add(self, lease: Lease) -> None:
        self._leases[lease.channel_id] = lease

    def remove(self, lease: Lease) -> None:
        if self._leases.get(lease.channel_id) is lease:
            del self._leases[lease.channel_id]

    def lose(self, lease: Lease, why: str) -> None:
        """Mark `lease` lost (once) and let the owner stop its turn."""
        if lease.lost:
            return
        lease.lost = True
        log.warning("channel %s: lease lost (%s); stopping its turn", lease.channel_id, why)
        self._on_lost(lease)

    async def renew_all(self) -> None:
        """One renewal of every lease held, `RENEW_BATCH` per script call so a kill or a
        chunk never waits behind a thousand leases' worth of encoding. Redis errors leave
        the leases to expire locally. A lease already past its local validity (the process
        was paused) is lost first: renewing it now could succeed after another worker saw it
        lapse."""
        self.expire_overdue()
        leases = [lease for lease in self._leases.values() if not lease.lost]
        for start in range(0, max(len(leases), 1), RENEW_BATCH):
            if not await self._renew_batch(leases[start:start + RENEW_BATCH]):
                break
        self.expire_overdue()

    async def _renew_batch(self, leases: list[Lease]) -> bool:
        args: list[str | int] = [self._prefix, self.timings.ttl_ms]
        for lease in leases:
            args += [lease.channel_id, lease.token]
        sent_at = self._clock()
        try:
            async with asyncio.timeout(self.timings.renew_every_s):
                reply = await self._renew(args=args)
        except (RedisError, OSError, TimeoutError) as exc:
            self.failures += 1
            log.warning("lease renewal failed: %s", type(exc).__name__)
            return False
        self.renewals += 1
        now_ms, first_expiry_ms, statuses = int(reply[0]), int(reply[1]), reply[2:]
        self.next_expiry_in_s = (
            None if first_expiry_ms < 0 else max(0.0, (first_expiry_ms - now_ms) / 1000)
        )
        for lease, status in zip(leases, statuses, strict=True):
            if lease.lost or lease.popping or self._leases.get(lease.channel_id) is not lease:
                continue  # released while the renewal was on its way: its answer is moot
            if int(status) == 0:
                self.lose(lease, "renewal refused: another worker owns the channel")
                continue
            lease.valid_until = self.timings.valid_until(sent_at)
            if int(status) == 2 and not lease.stop:
                lease.stop = True
                self._on_stop(lease)
        return True

    def expire_overdue(self) -> None:
        """Leases whose local validity ran out (no renewal got through in time) are lost."""
        now = self._clock()
        for lease in list(self._leases.values()):
            if not lease.lost and now >= lease.valid_until:
                self.lose(lease, "not renewed within its lifetime")
