"""The /kill slash command (D3): stop the channel's running turn and clear its queue.

It only flips flags and empties a queue, both synchronous, so the ephemeral answer goes out
at once, well inside Discord's 3 s interaction window; the turn unwinds on its own.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import discord
from discord import app_commands

from fsm.engine.locks import ChannelLockRegistry

log = logging.getLogger(__name__)

KILL_NAME = "kill"
KILL_DESCRIPTION = "Stop the bot's reply in this channel and drop its queued messages."


class QueueClearer(Protocol):
    def clear(self, channel_id: str) -> int: ...


def kill_reply(running: bool, dropped: int) -> str:
    """The ephemeral answer to /kill."""
    head = "Stopping the reply in this channel." if running else "Nothing is running here."
    if dropped:
        plural = "message" if dropped == 1 else "messages"
        return f"{head} Dropped {dropped} queued {plural}."
    return head


def make_kill_command(
    registry: ChannelLockRegistry, queue: QueueClearer
) -> app_commands.Command[Any, ..., None]:
    @app_commands.command(name=KILL_NAME, description=KILL_DESCRIPTION)
    async def kill(interaction: discord.Interaction) -> None:
        if interaction.channel_id is None:
            await interaction.response.send_message("No channel to stop.", ephemeral=True)
            return
        channel_id = str(interaction.channel_id)
        running = registry.request_stop(channel_id)
        dropped = queue.clear(channel_id)
        log.info(
            "/kill by %s in channel %s: running=%s dropped=%d",
            interaction.user.id,
            channel_id,
            running,
            dropped,
        )
        await interaction.response.send_message(kill_reply(running, dropped), ephemeral=True)

    return kill


def install_kill_command(
    tree: app_commands.CommandTree[Any], registry: ChannelLockRegistry, queue: QueueClearer
) -> app_commands.Command[Any, ..., None]:
    """Add /kill to `tree` (sync the tree afterwards to register it with Discord)."""
    command = make_kill_command(registry, queue)
    tree.add_command(command)
    return command
