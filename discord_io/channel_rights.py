"""What the bot may do in a channel, known before a turn spends anything there.

Discord refuses a send without SEND_MESSAGES (in a thread: SEND_MESSAGES_IN_THREADS, and in a
locked thread MANAGE_THREADS too), a reply without READ_MESSAGE_HISTORY (403 160002), and
answers a history read without it with nothing; every refusal counts toward the 10,000
invalid requests per 10 minutes past which Cloudflare bans the bot's address (Topics › Rate
Limits). So the bot asks first: `ChannelRights.of` reads its computed permissions off
discord.py's cache (the guild's roles, the channel's overwrites, its own member, the thread's
state), and `RightsCache` keeps the answer per channel until an event that can change it —
a role, a channel or thread, or the bot's own member updated. Where it may not write it says
nothing and spends nothing (one log line names what is missing); where only the reply is
refused it answers without the reference, and it reads no history it may not read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import discord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ChannelRights:
    """What the bot may do in one channel; `missing` names what stops it sending."""

    send: bool = True
    reply: bool = True
    """Reply with a `message_reference` (READ_MESSAGE_HISTORY)."""
    read_history: bool = True
    missing: str | None = None

    @classmethod
    def of(cls, channel: Any, me: discord.Member | None) -> ChannelRights:
        """The bot's rights in `channel`; everything where it cannot know (a DM, a channel
        or member not in the cache): Discord will say, and delivery copes."""
        if me is None or not isinstance(channel, discord.abc.GuildChannel | discord.Thread):
            return cls()
        if isinstance(channel, discord.Thread) and channel.parent is None:
            return cls()
        granted = channel.permissions_for(me)
        history = granted.read_message_history
        if not granted.view_channel:
            return cls(False, False, False, "VIEW_CHANNEL")
        if isinstance(channel, discord.ForumChannel):
            return cls(False, False, history, "a forum takes posts (threads), not messages")
        if isinstance(channel, discord.Thread):
            missing = _thread_refusal(channel, granted)
        else:
            missing = None if granted.send_messages else "SEND_MESSAGES"
        return cls(missing is None, history, history, missing)


def _thread_refusal(thread: discord.Thread, granted: discord.Permissions) -> str | None:
    if thread.is_private() and thread.me is None and not granted.manage_threads:
        return "VIEW_CHANNEL (a private thread the bot is not a member of)"
    if not granted.send_messages_in_threads:
        return "SEND_MESSAGES_IN_THREADS"
    if thread.locked and not granted.manage_threads:
        return "MANAGE_THREADS (the thread is locked)"
    return None


class RightsCache:
    """`ChannelRights` per channel, recomputed after any event that may change them."""

    def __init__(self, client: discord.Client) -> None:
        self._client = client
        self._rights: dict[int, ChannelRights] = {}
        self.computed = 0
        """How many times rights were computed (not served from the cache)."""

    def rights(self, channel: Any) -> ChannelRights:
        channel_id = getattr(channel, "id", None)
        if not isinstance(channel_id, int):
            return ChannelRights()
        known = self._rights.get(channel_id)
        if known is not None:
            return known
        guild = getattr(channel, "guild", None)
        rights = ChannelRights.of(channel, guild.me if guild is not None else None)
        self.computed += 1
        self._rights[channel_id] = rights
        if rights.missing is not None:
            log.warning("channel %s: the bot may not post there (missing %s); messages there "
                        "get no answer", channel_id, rights.missing)
        elif not rights.reply:
            log.warning("channel %s: no READ_MESSAGE_HISTORY; answers go without a reply "
                        "reference and without history", channel_id)
        return rights

    def forget(self) -> None:
        self._rights.clear()

    def attach(self) -> None:
        """Forget everything on the events that can change a permission or a thread
        (discord.py calls ``client.on_<event>``; these names are the cache's own)."""
        client = self._client

        async def changed(*_args: Any) -> None:
            self.forget()

        async def member_changed(_before: discord.Member, after: discord.Member) -> None:
            if client.user is not None and after.id == client.user.id:
                self.forget()

        for event in INVALIDATING_EVENTS:
            setattr(client, event, changed)
        client.on_member_update = member_changed  # type: ignore[attr-defined]


INVALIDATING_EVENTS = (
    "on_guild_role_update", "on_guild_role_delete", "on_guild_channel_update",
    "on_guild_channel_delete", "on_thread_update", "on_thread_remove", "on_thread_join",
    "on_thread_member_join", "on_thread_member_remove")
"""GUILD_ROLE_UPDATE/DELETE, CHANNEL_UPDATE/DELETE, THREAD_UPDATE, THREAD_CREATE (a thread
joined) and THREAD_MEMBERS_UPDATE; GUILD_MEMBER_UPDATE of the bot itself (`on_member_update`)."""
