"""How the operator turns the Redis backend on (`TURN_REDIS_URL`) and what the bot then uses
(SPEC D3, D4): the setting is a secret, the bot gets the Redis queue and the cross-process
/kill, and a Redis that may evict keys is reported at start."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import discord
import pytest

from discord_io.history import recent_messages
from discord_io.redis_backend.connection import check_server, connect
from discord_io.testing.redis_server import RedisServer, running_redis
from turn_engine.bot import TurnBot
from turn_engine.scale_out import attach_scale_out
from turn_engine.settings import AppSettings


@pytest.fixture
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


def test_redis_url_is_a_secret_and_unset_by_default(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    # covers D4: unset, the bot stays in-process; a URL's password never shows
    monkeypatch.chdir(tmp_path)
    assert AppSettings().redis_url is None
    monkeypatch.setenv("TURN_REDIS_URL", "redis://:hunter2@redis.internal:6379/0")
    settings = AppSettings()
    assert settings.redis_url is not None
    assert settings.redis_url.get_secret_value().startswith("redis://:hunter2@")
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings)


@pytest.mark.asyncio
async def test_attached_bot_uses_the_redis_queue_and_kill(redis_server: RedisServer) -> None:
    # covers D3, D4, D53: with a URL the bot's messages and /kill go through Redis
    bot = TurnBot(discord.Client(intents=discord.Intents.default()), [])
    assert bot.scale_out is None
    assert bot.history_read == bot.history_cache.read
    queue = attach_scale_out(bot, redis_server.url, worker_id="w1")
    assert bot.scale_out is queue and queue.worker_id == "w1"
    # D53: another process may get a channel's events, so every history read is a fetch
    assert bot.history_read is recent_messages
    kill = bot.tree.get_command("kill")
    assert kill is not None and kill.callback.__module__ == "discord_io.redis_backend.kill"
    await queue.start()
    assert queue.inbox.subscribed.is_set()
    await queue.aclose()


@pytest.mark.asyncio
async def test_a_redis_that_may_evict_keys_is_reported(redis_server: RedisServer) -> None:
    # covers D4: an evicted lease or queue would break one turn per channel silently
    redis = connect(redis_server.url)
    assert await check_server(redis) is None
    await redis.config_set("maxmemory-policy", "allkeys-lru")
    warning = await check_server(redis)
    assert warning is not None and "noeviction" in warning and "allkeys-lru" in warning
    await redis.aclose()
