"""The settings store in Redis (with `TURN_REDIS_URL`): every bot process sees the same
choices, resets and usage. redis-py is an optional extra, imported only here.

Keys, under `turn:op:`: `choice:{scope}:{id}` a hash of key -> value (with `guild` naming the
channel's server), `guild-choices:{guild}` the set of choice keys in a server, `reset:{channel}`
the marker, `usage:{day}:{guild}` a hash of `user|channel|model|field` -> count and
`usage-user:{day}:{user}` the user's total (the quota's count). Usage keys expire after
`USAGE_DAYS`: Redis is memory, not an archive.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from discord_io.redis_backend.connection import connect

from .operator_settings import ScopeKind
from .settings_store import CHOICE_KEYS, Choice, ChoiceKey, StoreError, UsageRow

PREFIX = "turn:op:"
USAGE_DAYS = 400
GUILD_FIELD = "guild"


class RedisStore:
    """`SettingsStore` over Redis."""

    description = "Redis (TURN_REDIS_URL)"

    def __init__(self, url: str) -> None:
        self._redis: Redis = connect(url)

    async def _do(self, coro: Any) -> Any:
        try:
            return await coro
        except (RedisError, OSError) as exc:
            raise StoreError(f"Redis settings store: {type(exc).__name__}: {exc}") from None

    async def open(self) -> None:
        # Prove the server answers and takes writes now, not when a choice would be lost.
        await self._do(self._redis.set(PREFIX + "probe", "1", ex=60))

    async def aclose(self) -> None:
        await self._redis.aclose()

    async def _hash_choices(self, scope: ScopeKind, scope_id: str) -> list[Choice]:
        raw: dict[bytes, bytes] = await self._do(
            self._redis.hgetall(f"{PREFIX}choice:{scope}:{scope_id}"))
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        guild = fields.get(GUILD_FIELD) or None
        return [Choice(scope, scope_id, key, fields[key], guild)
                for key in CHOICE_KEYS if key in fields]

    async def choices_for(self, guild_id: str | None, channel_id: str) -> list[Choice]:
        found = await self._hash_choices("channel", channel_id)
        if guild_id is not None:
            found += await self._hash_choices("guild", guild_id)
        return found

    async def choices_in(self, guild_id: str) -> list[Choice]:
        members: set[bytes] = await self._do(
            self._redis.smembers(f"{PREFIX}guild-choices:{guild_id}"))
        found: list[Choice] = []
        for member in sorted(m.decode() for m in members):
            scope, _, scope_id = member.partition(":")
            if scope in ("guild", "channel"):
                found += await self._hash_choices(scope, scope_id)  # type: ignore[arg-type]
        return found

    async def set_choice(self, choice: Choice) -> None:
        key = f"{PREFIX}choice:{choice.scope}:{choice.scope_id}"
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(key, mapping={choice.key: choice.value, GUILD_FIELD: choice.guild_id or ""})
        if choice.guild_id:
            pipe.sadd(f"{PREFIX}guild-choices:{choice.guild_id}",
                      f"{choice.scope}:{choice.scope_id}")
        await self._do(pipe.execute())

    async def clear_choice(self, scope: ScopeKind, scope_id: str, key: ChoiceKey) -> bool:
        removed = await self._do(self._redis.hdel(f"{PREFIX}choice:{scope}:{scope_id}", key))
        return bool(removed)

    async def reset_marker(self, channel_id: str) -> int | None:
        value = await self._do(self._redis.get(f"{PREFIX}reset:{channel_id}"))
        return int(value) if value is not None else None

    async def set_reset_marker(self, channel_id: str, before_id: int) -> None:
        # Never move the marker back: two /reset racing keep the later one.
        script = ("local old = tonumber(redis.call('GET', KEYS[1]) or '0') "
                  "if tonumber(ARGV[1]) > old then redis.call('SET', KEYS[1], ARGV[1]) end")
        await self._do(self._redis.eval(script, 1, f"{PREFIX}reset:{channel_id}",
                                        str(before_id)))

    async def add_usage(self, row: UsageRow) -> None:
        day_key = f"{PREFIX}usage:{row.day}:{row.guild_id or ''}"
        user_key = f"{PREFIX}usage-user:{row.day}:{row.user_id}"
        head = f"{row.user_id}|{row.channel_id}|{row.model}|"
        ttl = USAGE_DAYS * 86_400
        pipe = self._redis.pipeline(transaction=True)
        pipe.hincrby(day_key, head + "in", row.input_tokens)
        pipe.hincrby(day_key, head + "out", row.output_tokens)
        pipe.hincrby(day_key, head + "replies", row.replies)
        pipe.incrby(user_key, row.input_tokens + row.output_tokens)
        pipe.expire(day_key, ttl)
        pipe.expire(user_key, ttl)
        await self._do(pipe.execute())

    async def usage(self, day: str, guild_id: str | None) -> list[UsageRow]:
        raw: dict[bytes, bytes] = await self._do(
            self._redis.hgetall(f"{PREFIX}usage:{day}:{guild_id or ''}"))
        counts: dict[tuple[str, str, str], dict[str, int]] = {}
        for field, value in raw.items():
            user, channel, rest = field.decode().split("|", 2)
            model, _, name = rest.rpartition("|")
            counts.setdefault((user, channel, model), {})[name] = int(value)
        return [UsageRow(day, user, channel, guild_id, model, c.get("in", 0), c.get("out", 0),
                         c.get("replies", 0))
                for (user, channel, model), c in sorted(counts.items())]

    async def user_tokens(self, day: str, user_id: str) -> int:
        value = await self._do(self._redis.get(f"{PREFIX}usage-user:{day}:{user_id}"))
        return int(value) if value is not None else 0
