"""/kill across processes (D3): one script stops the channel's turn wherever it runs and drops
its queue; a second delivery of the same interaction is left to the session that got it
first, which answers it."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import discord
from discord import app_commands
from redis.exceptions import RedisError

from ..kill_command import (
    KILL_DESCRIPTION,
    KILL_NAME,
    NOT_ALLOWED_TEXT,
    KillPermission,
    kill_reply,
)
from .queue import KillOutcome

log = logging.getLogger(__name__)

UNREACHABLE_TEXT = "I can't reach my coordination service right now, so nothing was stopped."


class ChannelKiller(Protocol):
    async def kill(self, channel_id: str, interaction_id: str, *, user_id: int = 0,
                   privileged: bool = True) -> KillOutcome: ...


def _no_requester(_channel_id: str) -> int | None:
    return None


def make_redis_kill_command(
    queue: ChannelKiller, permission: KillPermission | None = None
) -> app_commands.Command[Any, ..., None]:
    """/kill for many processes. Who the running reply answers is known to the lease, not to
    this process, so the script checks it; here only the wider rights are looked up."""
    wider = (None if permission is None
             else KillPermission(_no_requester, roles=permission.roles))

    @app_commands.command(name=KILL_NAME, description=KILL_DESCRIPTION)
    async def kill(interaction: discord.Interaction) -> None:
        if interaction.channel_id is None:
            await interaction.response.send_message("No channel to stop.", ephemeral=True)
            return
        channel_id = str(interaction.channel_id)
        privileged = wider is None or wider.allows(interaction, channel_id)
        try:
            outcome = await queue.kill(channel_id, str(interaction.id),
                                       user_id=interaction.user.id, privileged=privileged)
        except (RedisError, OSError) as exc:
            log.error("/kill in channel %s: %s", channel_id, type(exc).__name__)
            await interaction.response.send_message(UNREACHABLE_TEXT, ephemeral=True)
            return
        if outcome.status == "duplicate":
            log.info("/kill interaction %s delivered twice; answered elsewhere", interaction.id)
            return
        if outcome.status == "not_allowed":
            await interaction.response.send_message(NOT_ALLOWED_TEXT, ephemeral=True)
            return
        running, dropped = outcome.running, outcome.dropped
        log.info("/kill by %s in channel %s: running=%s dropped=%d", interaction.user.id,
                 channel_id, running, dropped)
        answer = kill_reply(running, dropped, own=not privileged,
                            others_running=outcome.others_running)
        await interaction.response.send_message(answer, ephemeral=True)

    return kill


def install_redis_kill_command(
    tree: app_commands.CommandTree[Any], queue: ChannelKiller,
    permission: KillPermission | None = None,
) -> app_commands.Command[Any, ..., None]:
    """Add the cross-process /kill to `tree` (sync the tree afterwards)."""
    command = make_redis_kill_command(queue, permission)
    tree.add_command(command)
    return command
