"""Which roles a guild member holds, for messages that arrive without a member object.

Discord sends an author's member object (and so their roles) only with MESSAGE_CREATE and
MESSAGE_UPDATE; a history read, a fetched message and the message a reply carries along
(`referenced_message`) have plain users. Without the privileged members intent discord.py
keeps no member cache either. So the roles are looked up here, freshest source first:

- discord.py's member cache, when the client has the members intent (GUILD_MEMBER_UPDATE
  keeps it current);
- what this cache last learned: the member object of the member's latest gateway message
  (`saw`), or a REST look-up (GET /guilds/{guild.id}/members/{user.id}), for `ttl_s` seconds
  of the loop's clock — without the members intent Discord sends no role changes, so an
  entry ages out and is looked up again;
- the REST look-up itself. A user who is no member (Unknown Member) holds no roles there.
  A look-up that fails otherwise answers the last entry known, however old, or None: the
  roles are unknown, and the caller must not guess.

The cache is bounded (least recently used entries go first): the bot runs for weeks.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import aiohttp
import discord

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 300.0
DEFAULT_MAX_MEMBERS = 10_000
UNKNOWN_MEMBER = 10007
UNKNOWN_USER = 10013


def role_ids_of(author: object) -> frozenset[int] | None:
    """The role ids a message author holds, as Discord sent them, or None for a plain user.

    Read from the member's raw role list (`Member._roles`) rather than `Member.roles`, which
    leaves out roles the client's guild cache does not know yet: a blocked role must count
    even before GUILD_ROLE_CREATE reached the client. Every member holds @everyone (its id
    is the guild's), as `Member.roles` says."""
    if not isinstance(author, discord.Member):
        return None
    raw = getattr(author, "_roles", None)
    held = (frozenset(int(role) for role in raw) if raw is not None
            else frozenset(role.id for role in author.roles))
    return held | {author.guild.id}


@dataclass(frozen=True, slots=True)
class _Entry:
    roles: frozenset[int]
    at: float


class MemberRoles:
    """Role look-ups for the members whose messages a turn reads; one per bot."""

    def __init__(self, client: discord.Client | None = None, *, ttl_s: float = DEFAULT_TTL_S,
                 max_members: int = DEFAULT_MAX_MEMBERS) -> None:
        self._client = client
        self.ttl_s = ttl_s
        self.max_members = max_members
        self._entries: OrderedDict[tuple[int, int], _Entry] = OrderedDict()
        self.lookups = 0
        """REST look-ups made so far (for tests and an operator's look)."""

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def record(self, guild_id: int, user_id: int, roles: Iterable[int]) -> None:
        """What the gateway (or a look-up) just said this member holds."""
        key = (guild_id, user_id)
        self._entries[key] = _Entry(frozenset(roles), self._now())
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_members:
            self._entries.popitem(last=False)

    def saw(self, message: discord.Message) -> None:
        """A message from the gateway: a guild message's author comes with their member
        object, the freshest word on their roles."""
        roles = role_ids_of(message.author)
        if roles is not None and message.guild is not None:
            self.record(message.guild.id, message.author.id, roles)

    def known(self, guild_id: int, user_id: int) -> frozenset[int] | None:
        """The roles on record, fresh or not (no look-up)."""
        entry = self._entries.get((guild_id, user_id))
        return entry.roles if entry is not None else None

    async def roles_of(self, guild: discord.Guild, user_id: int) -> frozenset[int] | None:
        """The member's roles now, as far as they can be found out; None when unknown."""
        if self._client is not None and self._client.intents.members:
            cached = guild.get_member(user_id)
            if cached is not None:
                return role_ids_of(cached)
        key = (guild.id, user_id)
        entry = self._entries.get(key)
        if entry is not None and self._now() - entry.at < self.ttl_s:
            self._entries.move_to_end(key)
            return entry.roles
        self.lookups += 1
        try:
            member = await guild.fetch_member(user_id)
        except discord.NotFound as exc:
            if exc.code not in (UNKNOWN_MEMBER, UNKNOWN_USER):
                return self._stale(entry, user_id, exc)
            self.record(guild.id, user_id, ())
            return frozenset()
        except (discord.HTTPException, discord.RateLimited, aiohttp.ClientError,
                OSError, TimeoutError) as exc:
            return self._stale(entry, user_id, exc)
        roles = role_ids_of(member) or frozenset()
        self.record(guild.id, user_id, roles)
        return roles

    @staticmethod
    def _stale(entry: _Entry | None, user_id: int, exc: BaseException) -> frozenset[int] | None:
        status = getattr(exc, "status", None)
        log.warning("roles of user %s could not be looked up (%s)%s", user_id,
                    f"HTTP {status}" if status is not None else type(exc).__name__,
                    "; using the last known ones" if entry is not None else "")
        return entry.roles if entry is not None else None
