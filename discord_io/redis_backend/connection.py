"""The Redis connection of a worker, from one URL, and the server setting it relies on."""

from __future__ import annotations

import logging

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

REQUIRED_EVICTION_POLICY = "noeviction"


MAX_CONNECTIONS = 64
POOL_WAIT_S = 5.0


def connect(url: str, *, max_connections: int = MAX_CONNECTIONS) -> Redis:
    """A client for `url` (`redis://`, `rediss://` or `unix://`); connects lazily. A burst of
    messages waits for a pooled connection (up to `POOL_WAIT_S`) instead of failing."""
    pool = BlockingConnectionPool.from_url(url, max_connections=max_connections,
                                           timeout=POOL_WAIT_S)
    return Redis(connection_pool=pool)


async def check_server(redis: Redis) -> str | None:
    """A warning when the server may evict keys (a lease or queue evicted under memory
    pressure would break one turn per channel); None when it is configured as needed."""
    try:
        config = await redis.config_get("maxmemory-policy")
    except (RedisError, OSError):
        return None  # managed services may refuse CONFIG; docs/redis.md says what to set
    policy = str(config.get("maxmemory-policy", ""))
    if policy != REQUIRED_EVICTION_POLICY:
        return (f"Redis maxmemory-policy is {policy!r}; set it to {REQUIRED_EVICTION_POLICY!r} "
                "so leases and queues are never evicted")
    return None
