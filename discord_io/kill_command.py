"""The /kill slash command (D3): stop the channel's running turn and clear its queue.

It only flips flags and empties a queue, both synchronous, so the ephemeral answer goes out
at once, well inside Discord's 3 s interaction window; the turn unwinds on its own. Its
reach depends on who runs it (`KillPermission`, A7): members with Manage Messages in the
channel and members of the roles an operator names stop any reply and clear the whole queue
(so does anyone in a DM, which has one user besides the bot); anyone else stops the reply
only if it answers their own message, and drops only their own queued messages, never
another user's question.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

import discord
from discord import app_commands

from fsm import ChannelLockRegistry

log = logging.getLogger(__name__)

KILL_NAME = "kill"
KILL_DESCRIPTION = "Stop the bot's reply in this channel and drop its queued messages."


NOT_ALLOWED_TEXT = (
    "Only the person this reply answers, or members who can manage messages here, can stop it."
)
NOT_YOURS_TEXT = "The reply running here answers someone else, so it goes on."


class QueueClearer(Protocol):
    def clear(self, channel_id: str, *, user: str | None = None) -> int:
        """Drop the channel's waiting messages (only `user`'s, when named); how many."""
        ...


@dataclass(frozen=True, slots=True)
class KillPermission:
    """Who may /kill in a channel. `requester_of(channel_id)` names the user whose message
    the running reply answers (None when nothing runs)."""

    requester_of: Callable[[str], int | None]
    roles: Collection[int] = ()

    def allows(self, interaction: discord.Interaction, channel_id: str) -> bool:
        """Whether the user may stop the reply running in the channel."""
        return (interaction.user.id == self.requester_of(channel_id)
                or self.moderates(interaction))

    def moderates(self, interaction: discord.Interaction) -> bool:
        """Whether the user's /kill reaches everyone's reply and queued messages."""
        if interaction.guild_id is None:
            return True  # a DM has one user besides the bot
        if interaction.permissions.manage_messages:
            return True
        return any(role.id in self.roles for role in getattr(interaction.user, "roles", ()))


def kill_reply(running: bool, dropped: int, *, own: bool = False,
               others_running: bool = False) -> str:
    """The ephemeral answer to /kill; `own`: the user's reach was their own messages, and
    `others_running`: a reply to someone else runs on."""
    if running:
        head = "Stopping the reply in this channel."
    else:
        head = NOT_YOURS_TEXT if others_running else "Nothing is running here."
    if not dropped:
        return head
    if own:
        mine = ("your queued message" if dropped == 1
                else f"{dropped} of your queued messages")
        return f"{head} Dropped {mine}."
    plural = "message" if dropped == 1 else "messages"
    return f"{head} Dropped {dropped} queued {plural}."


def make_kill_command(
    registry: ChannelLockRegistry, queue: QueueClearer,
    permission: KillPermission | None = None,
) -> app_commands.Command[Any, ..., None]:
    """/kill; without `permission` anyone may use it (tests of the engine's kill path)."""

    @app_commands.command(name=KILL_NAME, description=KILL_DESCRIPTION)
    async def kill(interaction: discord.Interaction) -> None:
        if interaction.channel_id is None:
            await respond(interaction, "No channel to stop.")
            return
        channel_id = str(interaction.channel_id)
        if permission is None or permission.moderates(interaction):
            running = registry.request_stop(channel_id)
            answer = kill_reply(running, dropped := queue.clear(channel_id))
        else:
            own_reply = interaction.user.id == permission.requester_of(channel_id)
            dropped = queue.clear(channel_id, user=str(interaction.user.id))
            if not own_reply and not dropped:
                log.info("/kill by %s in channel %s refused: not permitted",
                         interaction.user.id, channel_id)
                await respond(interaction, NOT_ALLOWED_TEXT)
                return
            running = own_reply and registry.request_stop(channel_id)
            answer = kill_reply(running, dropped, own=True, others_running=not own_reply and (
                permission.requester_of(channel_id) is not None))
        log.info("/kill by %s in channel %s: running=%s dropped=%d", interaction.user.id,
                 channel_id, running, dropped)
        await respond(interaction, answer)

    return kill


async def respond(interaction: discord.Interaction, text: str) -> None:
    """The ephemeral answer; one that comes too late (Discord gives 3 s: 10062) or twice
    (40060) is logged, not raised: what /kill does is done by then."""
    try:
        await interaction.response.send_message(text, ephemeral=True)
    except discord.HTTPException as exc:
        log.warning("/kill in channel %s: the answer was refused (HTTP %s, Discord code %s); "
                    "the kill itself is done", interaction.channel_id, exc.status, exc.code)


def install_kill_command(
    tree: app_commands.CommandTree[Any], registry: ChannelLockRegistry, queue: QueueClearer,
    permission: KillPermission | None = None,
) -> app_commands.Command[Any, ..., None]:
    """Add /kill to `tree` (sync the tree afterwards to register it with Discord)."""
    command = make_kill_command(registry, queue, permission)
    tree.add_command(command)
    return command
