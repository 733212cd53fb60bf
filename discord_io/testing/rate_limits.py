"""Discord's HTTP rate limits as Topics › Rate Limits describes them.

- **Per-route buckets**, per top-level resource (channel, guild, webhook): every answer of a
  limited route carries `X-RateLimit-Limit`, `-Remaining`, `-Reset`, `-Reset-After` and
  `-Bucket` (the same bucket string for every channel), and a request past the limit gets a
  429 with `X-RateLimit-Scope: user` and the bucket's headers too. The defaults are Discord's
  usual ones for a bot's message sends (5 per 5 s per channel) and a generous limit elsewhere.
- **The global limit**: 50 requests per second over every route but the interaction
  endpoints, answered with `X-RateLimit-Global: true` and scope `global`.
- **Invalid requests**: every 401, 403 and 429 is counted, except a 429 of scope `shared`;
  past 10,000 in 10 minutes the address is banned (Cloudflare's 429, which has no `Via`
  header and no JSON body) until the window has room again.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aiohttp import web

from .rest import SEND_MESSAGE, Fault, RecordedRequest

GLOBAL_LIMIT = 50
GLOBAL_WINDOW_S = 1.0
INVALID_LIMIT = 10_000
INVALID_WINDOW_S = 600.0
DEFAULT_ROUTE_LIMIT = (50, 1.0)
ROUTE_LIMITS: dict[str, tuple[int, float]] = {
    SEND_MESSAGE: (5, 5.0),
    "POST /channels/{channel_id}/typing": (5, 5.0),
}
UNLIMITED_PREFIXES = ("GET /gateway", "GET /cdn/")
INTERACTION_PREFIXES = ("POST /interactions/", "GET /webhooks/", "POST /webhooks/",
                        "PATCH /webhooks/", "DELETE /webhooks/")
"""Interaction endpoints: not bound to the bot's global limit (Topics › Rate Limits)."""


@dataclass(frozen=True, slots=True)
class RateLimitWait:
    """A request admitted in the window after an exhausted one: `floor` is when the
    window reopened, so `admitted_at - floor` is how late the client came back."""

    bucket: str
    floor: float
    admitted_at: float

    @property
    def lag_s(self) -> float:
        return self.admitted_at - self.floor


@dataclass(slots=True)
class _Bucket:
    limit: int
    window_s: float
    started_at: float = float("-inf")
    used: int = 0


@dataclass(slots=True)
class RateLimiter:
    """The emulator's rate limits; `clock` is the loop's, `wall_clock` the emulated epoch."""

    clock: Callable[[], float]
    wall_clock: Callable[[], float]
    route_limits: dict[str, tuple[int, float]] = field(
        default_factory=lambda: dict(ROUTE_LIMITS))
    global_limit: int | None = GLOBAL_LIMIT
    """Requests per second over all routes (None: no global limit)."""
    invalid_limit: int = INVALID_LIMIT
    waits: list[RateLimitWait] = field(default_factory=list)
    """Requests that waited out an exhausted bucket, in order."""
    invalid: deque[float] = field(default_factory=deque)
    """When each invalid request (401, 403, 429 not `shared`) of the last 10 minutes came."""
    invalid_total: int = 0
    global_hits: int = 0
    """How many requests the global limit refused."""
    route_hits: int = 0
    """How many requests an exhausted per-route bucket refused."""
    refused: Counter[str] = field(default_factory=Counter)
    """Every 429 answered, by its `X-RateLimit-Scope` (`global`, `user`: a route's bucket,
    `shared`) or `cloudflare` (the ban, which has none); scripted faults included."""
    _buckets: dict[str, _Bucket] = field(default_factory=dict)
    _recent: deque[float] = field(default_factory=deque)

    def set_limits(self, limit: int, window_s: float, routes: Iterable[str]) -> None:
        for route in routes:
            self.route_limits[route] = (limit, window_s)

    def banned(self) -> web.Response | None:
        """Cloudflare's answer while the address is over the invalid-request limit."""
        self._forget_invalid()
        if len(self.invalid) < self.invalid_limit:
            return None
        retry = math.ceil(self.invalid[0] + INVALID_WINDOW_S - self.clock())
        return web.Response(status=429, text="error code: 1015",
                            headers={"Retry-After": str(max(1, retry))})

    def admit(self, record: RecordedRequest) -> tuple[web.Response | None, dict[str, str]]:
        """A 429 for `record`, or None and the bucket headers its answer carries."""
        route = record.route
        if route.startswith(UNLIMITED_PREFIXES):
            return None, {}
        now = self.clock()
        if self.global_limit is not None and not route.startswith(INTERACTION_PREFIXES):
            while self._recent and self._recent[0] + GLOBAL_WINDOW_S <= now:
                self._recent.popleft()
            if len(self._recent) >= self.global_limit:
                self.global_hits += 1
                retry_after = math.ceil((self._recent[0] + GLOBAL_WINDOW_S - now) * 1000) / 1000
                return Fault.rate_limited(max(retry_after, 0.001), is_global=True).response(), {}
        bucket_key = f"{route}:{_top_level(record)}"
        limit, window_s = self.route_limits.get(route, DEFAULT_ROUTE_LIMIT)
        bucket = self._buckets.setdefault(bucket_key, _Bucket(limit, window_s))
        if now >= bucket.started_at + bucket.window_s:
            if bucket.used >= bucket.limit:  # this request waited for the window to reopen
                self.waits.append(RateLimitWait(bucket_key, bucket.started_at + bucket.window_s,
                                                now))
            bucket.started_at, bucket.used = now, 0
        # Rounded up to the millisecond, so a client that waits it out finds a fresh window.
        reset_after = math.ceil((bucket.started_at + bucket.window_s - now) * 1000) / 1000
        if bucket.used >= bucket.limit:
            self.route_hits += 1
            limited = Fault.rate_limited(reset_after).response()
            limited.headers.update(self._headers(route, bucket, reset_after))
            return limited, {}
        bucket.used += 1
        if self.global_limit is not None and not route.startswith(INTERACTION_PREFIXES):
            self._recent.append(now)
        return None, self._headers(route, bucket, reset_after)

    def _headers(self, route: str, bucket: _Bucket, reset_after: float) -> dict[str, str]:
        return {
            "X-RateLimit-Bucket": hashlib.sha1(route.encode()).hexdigest()[:16],
            "X-RateLimit-Limit": str(bucket.limit),
            "X-RateLimit-Remaining": str(bucket.limit - bucket.used),
            "X-RateLimit-Reset-After": f"{reset_after:.3f}",
            "X-RateLimit-Reset": f"{self.wall_clock() + reset_after:.3f}",
        }

    def answered(self, response: web.StreamResponse) -> None:
        """Count an invalid request (Topics › Rate Limits › Invalid Request Limit)."""
        if response.status not in (401, 403, 429):
            return
        scope = response.headers.get("X-RateLimit-Scope")
        if response.status == 429:
            self.refused[scope or "cloudflare"] += 1
        if scope == "shared":
            return
        self.invalid.append(self.clock())
        self.invalid_total += 1

    def invalid_in_window(self) -> int:
        """Invalid requests in the last 10 minutes (Cloudflare bans at 10,000)."""
        self._forget_invalid()
        return len(self.invalid)

    def _forget_invalid(self) -> None:
        now = self.clock()
        while self.invalid and self.invalid[0] + INVALID_WINDOW_S <= now:
            self.invalid.popleft()


def _top_level(record: RecordedRequest) -> str:
    """The top-level resource a bucket is per: channel, guild, webhook (+ token)."""
    params = record.params
    for key in ("channel_id", "guild_id", "interaction_id"):
        if key in params:
            return params[key]
    if "token" in params:
        return f"{params.get('application_id', '')}:{params['token']}"
    return ""
