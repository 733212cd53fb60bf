"""Whose words a turn may show the model: one decision per message, from admission's facts.

The access lists (`AccessPolicy`) decide who may start a turn; the same lists decide whose
messages a turn may read — its history, the message a reply points at (inside the history
window or beyond it), a reply chain's parents, their images and inlined files, the reactors
a metadata reveal names. Every one of those paths asks `TurnAudience.admits`, which judges a
message the way admission judges the message it answers: the author's id, the roles the
author holds, the channel it was written in (with its parent and category). Messages read
from history carry no roles, so the roles are looked up (`MemberRoles`): an unknown fact is
found out, never taken for "no roles". Where it cannot be found out, the message is left
out and the log says so. The bot's own messages are always shown (they are assistant turns).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, replace

import discord

from .admission import AccessPolicy, MessageFacts, channel_allowed, channel_ids_of, user_allowed
from .member_roles import MemberRoles, role_ids_of

log = logging.getLogger(__name__)

Readable = Callable[[Collection[int]], Awaitable[set[int]]]


@dataclass(frozen=True, slots=True)
class Author:
    """Who wrote something, and where: what the access lists are judged on."""

    user_id: int
    channel: object
    guild: discord.Guild | None
    roles: frozenset[int] | None = None
    """The roles the source carried (a gateway message's member), if any."""
    webhook: bool = False

    @classmethod
    def of(cls, message: discord.Message) -> Author:
        return cls(message.author.id, message.channel, message.guild,
                   role_ids_of(message.author), message.webhook_id is not None)


class Exclusion:
    """The bot's one exclusion rule; `for_turn` gives each turn its own memo of verdicts."""

    def __init__(self, access_of: Callable[[], AccessPolicy], roles: MemberRoles,
                 bot_user_id: Callable[[], int]) -> None:
        self.access_of = access_of
        self.roles = roles
        self.bot_user_id = bot_user_id

    def for_turn(self) -> TurnAudience:
        return TurnAudience(self)


class TurnAudience:
    """One turn's verdicts: each message is judged once, and every path of the turn that
    puts a message's content into the request gets the same answer for it."""

    def __init__(self, exclusion: Exclusion) -> None:
        self._exclusion = exclusion
        self._verdicts: dict[int, bool] = {}
        self._users: dict[tuple[int, frozenset[int]], bool] = {}
        self.left_out: list[int] = []
        """Ids of the messages this turn left out, in the order they were judged."""

    async def admits(self, message: discord.Message) -> bool:
        """Whether the model may read `message` (its text, files and images)."""
        verdict = self._verdicts.get(message.id)
        if verdict is None:
            if message.author.id == self._exclusion.bot_user_id():
                verdict = True
            else:
                verdict = await self.admits_author(Author.of(message))
            self._verdicts[message.id] = verdict
            if not verdict:
                self.left_out.append(message.id)
        return verdict

    async def admitted(self, messages: Iterable[discord.Message]) -> list[discord.Message]:
        """The messages of `messages` the model may read, in their order; the authors'
        roles are looked up side by side, each author once."""
        listed = list(messages)
        authors = {(m.author.id, channel_ids_of(m.channel)): m for m in listed
                   if m.author.id != self._exclusion.bot_user_id()}
        await asyncio.gather(*(self.admits_author(Author.of(m)) for m in authors.values()))
        return [message for message in listed if await self.admits(message)]

    def reader_in(self, where: discord.Message) -> Readable:
        """Of the users whose names the turn would show beside `where` (who reacted to a
        message: the metadata reveal), those the access lists let the model read."""

        async def readable(user_ids: Collection[int]) -> set[int]:
            distinct = sorted(set(user_ids))
            verdicts = await asyncio.gather(*(
                self.admits_author(Author(user_id, where.channel, where.guild))
                for user_id in distinct))
            bot = self._exclusion.bot_user_id()
            return {user_id for user_id, verdict in zip(distinct, verdicts, strict=True)
                    if verdict or user_id == bot}

        return readable

    async def admits_author(self, author: Author) -> bool:
        """Whether the access lists let `author` be read where they wrote."""
        access = self._exclusion.access_of()
        channel_ids = channel_ids_of(author.channel)
        is_dm = getattr(author.channel, "type", None) == discord.ChannelType.private
        key = (author.user_id, channel_ids)
        if key in self._users:
            return self._users[key]
        facts = MessageFacts(author_id=author.user_id, author_is_bot=False, is_dm=is_dm,
                             mentions_bot=False, replies_to_bot=False, content="",
                             channel_ids=channel_ids)
        if not channel_allowed(facts, access):
            verdict = False
        elif is_dm or not _needs_roles(author.user_id, access):
            verdict = user_allowed(facts, access)
        else:
            roles = await self._roles(author)
            verdict = roles is not None and user_allowed(replace(facts, role_ids=roles),
                                                         access)
        self._users[key] = verdict
        return verdict

    async def _roles(self, author: Author) -> frozenset[int] | None:
        if author.webhook:
            return frozenset()  # a webhook is no member and holds no roles
        if author.guild is None:
            log.warning("user %s: no guild to look their roles up in; left out",
                        author.user_id)
            return None
        roles = await self._exclusion.roles.roles_of(author.guild, author.user_id)
        if roles is None:
            roles = author.roles
        if roles is None:
            log.warning("roles of user %s are unknown: their messages are left out of this "
                        "turn", author.user_id)
        return roles


def _needs_roles(user_id: int, access: AccessPolicy) -> bool:
    """Whether the verdict on `user_id` depends on their roles (a blocked id needs none)."""
    if user_id in access.blocked_users:
        return False
    if access.blocked_roles:
        return True
    return bool(access.allowed_roles) and user_id not in access.allowed_users

