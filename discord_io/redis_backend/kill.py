"""/kill across processes (D3): one script stops the channel's turn wherever it runs and drops
its queue; a second delivery of the same interaction is left to the session that got it
first, which answers it."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import discord
from discord import app_commands
from redis.exceptions import RedisError

from ..kill_command import KILL_DESCRIPTION, KILL_NAME, kill_reply

log = logging.getLogger(__name__)

UNREACHABLE_TEXT = "I can't reach my coordination service right now, so nothing was stopped."


class ChannelKiller(Protocol):
    async def kill(self, channel_id: str, interaction_id: str) -> tuple[bool, int] | None: ...


def make_redis_kill_command(queue: ChannelKiller) -> app_commands.Command[Any, ..., None]:
    @app_commands.command(name=KILL_NAME, description=KILL_DESCRIPTION)
    async def kill(interaction: discord.Interaction) -> None:
        if interaction.channel_id is None:
            await interaction.response.send_message("No channel to stop.", ephemeral=True)
            return
        channel_id = str(interaction.channel_id)
        try:
            outcome = await queue.kill(channel_id, str(interaction.id))
        except (RedisError, OSError) as exc:
            log.error("/kill in channel %s: %s", channel_id, type(exc).__name__)
            await interaction.response.send_message(UNREACHABLE_TEXT, ephemeral=True)
            return
        if outcome is None:
            log.info("/kill interaction %s delivered twice; answered elsewhere", interaction.id)
            return
        running, dropped = outcome
        log.info("/kill by %s in channel %s: running=%s dropped=%d", interaction.user.id,
                 channel_id, running, dropped)
        await interaction.response.send_message(kill_reply(running, dropped), ephemeral=True)

    return kill


def install_redis_kill_command(
    tree: app_commands.CommandTree[Any], queue: ChannelKiller
) -> app_commands.Command[Any, ..., None]:
    """Add the cross-process /kill to `tree` (sync the tree afterwards)."""
    command = make_redis_kill_command(queue)
    tree.add_command(command)
    return command
