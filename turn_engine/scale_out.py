"""Many bot processes on one Redis (`TURN_REDIS_URL`): the bot's queue, /kill and follow-ups
go through `discord_io.redis_backend`; unset, the bot stays in-process (docs/redis.md)."""

from __future__ import annotations

from typing import Protocol

import discord
from discord import app_commands

from discord_io.channel_queue import ChannelQueue
from discord_io.kill_command import KILL_NAME, KillPermission
from discord_io.redis_backend.connection import connect
from discord_io.redis_backend.discord_records import message_loader, record_of_message
from discord_io.redis_backend.fence import fencing_trace
from discord_io.redis_backend.kill import install_redis_kill_command
from discord_io.redis_backend.lease import LeaseTimings
from discord_io.redis_backend.queue import DEFAULT_PREFIX, RedisChannelQueue
from fsm import ChannelLock, ChannelLockRegistry, Turn

__all__ = ["attach_scale_out", "fencing_trace"]


class ScalableBot(Protocol):
    """What the wiring needs of the bot (`turn_engine.bot.TurnBot`), without importing it."""

    client: discord.Client
    locks: ChannelLockRegistry
    queue: ChannelQueue[discord.Message]
    tree: app_commands.CommandTree[discord.Client]
    kill_permission: KillPermission
    current: dict[str, tuple[Turn, int]]
    scale_out: RedisChannelQueue[discord.Message] | None

    async def run_turn(self, message: discord.Message, lock: ChannelLock) -> None: ...


def attach_scale_out(
    bot: ScalableBot,
    url: str,
    *,
    worker_id: str | None = None,
    timings: LeaseTimings | None = None,
    prefix: str = DEFAULT_PREFIX,
) -> RedisChannelQueue[discord.Message]:
    """Give `bot` the Redis queue and the cross-process /kill; `bot.start` starts it. The
    bot's client must send through the lease gate: `discord.Client(http_trace=fencing_trace())`."""

    def follow_up(channel_id: str, author_id: int) -> None:
        running = bot.current.get(channel_id)
        if running is not None and running[1] == author_id:
            running[0].notify_follow_up()

    queue: RedisChannelQueue[discord.Message] = RedisChannelQueue(
        connect(url), bot.locks, bot.run_turn, record_of=record_of_message,
        load=message_loader(bot.client), on_follow_up=follow_up,
        max_queued=bot.queue.max_queued, timings=timings, worker_id=worker_id, prefix=prefix,
        owns_redis=True)
    bot.tree.remove_command(KILL_NAME)
    install_redis_kill_command(bot.tree, queue, bot.kill_permission)
    bot.scale_out = queue
    return queue
