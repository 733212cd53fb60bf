"""What the emulated Discord holds: users, guilds with their members and roles, channels
with their permission overwrites, threads and forum posts, messages, reactions, uploads, and
the ids and clock they are stamped with. Both halves of the emulator (REST, the gateway)
read it; the payload builders here shape its objects as Discord's spec requires them, so
both send the same thing.
"""

from __future__ import annotations

import asyncio
import datetime
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import permissions as perms
from .objects import role_object
from .spec_validation import SpecViolation

JsonDict = dict[str, Any]

DISCORD_EPOCH_MS = 1_420_070_400_000
START_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z: emulated wall clock at loop time 0

GUILD_TEXT, DM, GUILD_ANNOUNCEMENT = 0, 1, 5
ANNOUNCEMENT_THREAD, PUBLIC_THREAD, PRIVATE_THREAD = 10, 11, 12
GUILD_FORUM, GUILD_MEDIA = 15, 16
THREAD_STARTER_MESSAGE = 21
ARCHIVE_MINUTES = 1440


def as_referenced(message: JsonDict) -> JsonDict:
    """`message` as another message's `referenced_message`: one level deep, the way Discord
    sends it (the parent carries its own `message_reference`, not its parent), so a client
    walking a reply chain must read each further parent itself."""
    return {key: value for key, value in message.items() if key != "referenced_message"}


def embed_payload(embed: JsonDict) -> JsonDict:
    """An embed as Discord returns it: it always says its type."""
    return embed if "type" in embed else {"type": "rich", **embed}


@dataclass(frozen=True, slots=True)
class CdnFile:
    """A file the emulated CDN serves (avatars, attachments, GIFs)."""

    content_type: str = "application/octet-stream"
    data: bytes = b""
    delay_s: float = 0.0
    chunked: bool = False  # no Content-Length: the size shows only while reading
    redirect_to: str | None = None
    status: int = 200


class World:
    """The emulated Discord's state and its seeding API (docs/emulator.md, "The world")."""

    def __init__(self, token: str, *, validate: bool = True) -> None:
        self.token = token
        self.validate = validate
        """Validate traffic against Discord's spec (the default; off only for benchmarks)."""
        self.spec_violations: list[SpecViolation] = []
        self.commands: dict[int | None, list[JsonDict]] = {}
        self.users: dict[int, JsonDict] = {}
        self.guilds: dict[int, JsonDict] = {}
        self.channels: dict[int, JsonDict] = {}
        self.messages: dict[int, dict[int, JsonDict]] = defaultdict(dict)
        self.roles: dict[int, JsonDict] = {}
        """Every guild's roles but @everyone (`role_guild` says whose)."""
        self.role_guild: dict[int, int] = {}
        self.member_roles: dict[int, list[int]] = defaultdict(list)
        """Each user's roles (in whichever guild each role belongs to)."""
        self.thread_members: dict[int, list[int]] = defaultdict(list)
        self.cdn: dict[str, CdnFile] = {}
        self.cdn_base = ""
        self._reactions: dict[int, dict[str, list[int]]] = defaultdict(dict)
        self._last_id = 0
        self._t0: float | None = None

        self.bot = self.add_user("turnbot", global_name="Turn Bot", bot=True)
        self.bot_id = int(self.bot["id"])
        self.application_id = self.bot_id
        self.add_guild("emulated guild")
        self.channel_id = self.add_text_channel("general")
        self.alice = self.add_user("alice", global_name="Alice")
        self.alice_id = int(self.alice["id"])
        self.guilds[self.guild_id]["owner_id"] = self.alice_id

    # ---- clock and ids -------------------------------------------------------------------

    def now(self) -> float:
        """The loop's clock (0 outside a running loop)."""
        return self._now()

    def _now(self) -> float:
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:
            return 0.0
        if self._t0 is None:
            self._t0 = now
        return now

    def next_id(self) -> int:
        """A snowflake whose timestamp follows the loop clock (from 2025-01-01)."""
        elapsed = self._now() - (self._t0 if self._t0 is not None else self._now())
        ms = START_MS + int(max(0.0, elapsed) * 1000)
        candidate = (ms - DISCORD_EPOCH_MS) << 22
        self._last_id = max(candidate, self._last_id + 1)
        return self._last_id

    @staticmethod
    def timestamp_of(snowflake: int) -> str:
        ms = (snowflake >> 22) + DISCORD_EPOCH_MS
        moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
        return moment.isoformat()

    def wall_clock(self) -> float:
        """Seconds since 1970 on the emulated wall clock (`X-RateLimit-Reset`)."""
        return START_MS / 1000 + self._now() - (self._t0 or 0.0)

    def cdn_url(self, path: str) -> str:
        """The URL of `path` (e.g. "/files/a.gif") on the emulated CDN."""
        return self.cdn_base + path

    # ---- users, guilds, members, roles ---------------------------------------------------

    @property
    def guild_id(self) -> int:
        """The first guild (where seeded users are members)."""
        return next(iter(self.guilds))

    def add_user(self, username: str, *, global_name: str | None = None, bot: bool = False,
                 avatar: str | None = None) -> JsonDict:
        user_id = self.next_id()
        user: JsonDict = {
            "id": str(user_id), "username": username, "discriminator": "0", "avatar": avatar,
            "global_name": global_name, "public_flags": 0, "flags": 0, "primary_guild": None,
        }
        if bot:
            user["bot"] = True
        self.users[user_id] = user
        if self.guilds:  # everyone seeded is a member of the first guild
            self.add_member(self.guild_id, user_id)
        return user

    def add_guild(self, name: str, *, owner_id: int | None = None,
                  everyone: int = perms.DEFAULT_EVERYONE) -> int:
        """A guild the bot is in (its members: the bot; add more with `add_member`).
        `everyone` is what its @everyone role allows.

        Each guild's id is a millisecond later than the last one's, so consecutive guilds
        fall on consecutive shards (`(guild_id >> 22) % shards`)."""
        guild_id = self.next_id() + (len(self.guilds) << 22)
        self._last_id = guild_id
        owner = owner_id if owner_id is not None else getattr(self, "alice_id", None)
        self.guilds[guild_id] = {"id": str(guild_id), "name": name, "members": [],
                                 "owner_id": owner, "everyone": everyone,
                                 "joined": {}, "nicks": {}}
        self.add_member(guild_id, self.bot_id)
        return guild_id

    def add_member(self, guild_id: int, user_id: int, *, nick: str | None = None) -> None:
        guild = self.guilds[guild_id]
        if user_id not in guild["members"]:
            guild["members"].append(user_id)
            guild["joined"][user_id] = self.next_id()
        if nick is not None:
            guild["nicks"][user_id] = nick

    def is_member(self, guild_id: int, user_id: int) -> bool:
        guild = self.guilds.get(guild_id)
        return guild is not None and user_id in guild["members"]

    def add_role(self, name: str, *, permissions: int = 0, guild_id: int | None = None) -> int:
        """A role of a guild (the first unless `guild_id`); give it to members with
        `member_roles[user_id].append`."""
        role_id = self.next_id()
        guild = guild_id if guild_id is not None else self.guild_id
        position = 1 + sum(1 for g in self.role_guild.values() if g == guild)
        self.roles[role_id] = role_object(role_id, name, permissions, position=position)
        self.role_guild[role_id] = guild
        return role_id

    def set_role_permissions(self, role_id: int, permissions: int) -> None:
        """Change a role's permissions (@everyone's when `role_id` is the guild's id);
        announce it with ``gateway.role_update``."""
        if role_id in self.guilds:
            self.guilds[role_id]["everyone"] = permissions
        else:
            self.roles[role_id]["permissions"] = str(permissions)

    def roles_in(self, guild_id: int, user_id: int) -> list[int]:
        """The member's roles in `guild_id` (not @everyone)."""
        return [r for r in self.member_roles[user_id] if self.role_guild.get(r) == guild_id]

    def guild_roles(self, guild_id: int) -> list[JsonDict]:
        """@everyone first, then the guild's roles."""
        everyone = role_object(guild_id, "@everyone", self.guilds[guild_id]["everyone"],
                               position=0)
        return [everyone, *(r for i, r in self.roles.items() if self.role_guild[i] == guild_id)]

    def member_payload(self, user_id: int, guild_id: int | None = None, *,
                       with_user: bool = False) -> JsonDict:
        """A guild member (`GuildMemberResponse`; without the user, as MESSAGE_CREATE's
        `member`), its roles those of `member_roles` in the guild (the first by default)."""
        guild_id = guild_id if guild_id is not None else self.guild_id
        guild = self.guilds[guild_id]
        joined = guild["joined"].get(user_id, user_id)
        member: JsonDict = {
            "roles": [str(r) for r in self.roles_in(guild_id, user_id)],
            "nick": guild["nicks"].get(user_id), "avatar": None, "banner": None,
            "joined_at": self.timestamp_of(joined), "premium_since": None,
            "communication_disabled_until": None, "pending": False,
            "deaf": False, "mute": False, "flags": 0,
        }
        if with_user:
            member["user"] = self.users[user_id]
        return member

    # ---- channels, threads, overwrites ---------------------------------------------------

    def add_text_channel(self, name: str, *, guild_id: int | None = None,
                         channel_type: int = GUILD_TEXT) -> int:
        """A guild channel: text by default, or GUILD_ANNOUNCEMENT, GUILD_FORUM, GUILD_MEDIA."""
        channel_id = self.next_id()
        guild = guild_id if guild_id is not None else self.guild_id
        channel: JsonDict = {
            "id": str(channel_id), "type": channel_type, "guild_id": str(guild), "name": name,
            "position": len(self.channels), "permission_overwrites": [], "nsfw": False,
            "flags": 0, "last_message_id": None,
        }
        if channel_type in (GUILD_FORUM, GUILD_MEDIA):
            channel.update(available_tags=[], default_reaction_emoji=None,
                           default_sort_order=None, default_forum_layout=0,
                           default_thread_rate_limit_per_user=0)
        self.channels[channel_id] = channel
        return channel_id

    def add_announcement_channel(self, name: str, *, guild_id: int | None = None) -> int:
        """A GUILD_ANNOUNCEMENT channel where, as usual, only moderators post: @everyone is
        denied SEND_MESSAGES (threads in it stay open to SEND_MESSAGES_IN_THREADS)."""
        channel_id = self.add_text_channel(name, guild_id=guild_id,
                                           channel_type=GUILD_ANNOUNCEMENT)
        self.set_overwrite(channel_id, self.guild_of(channel_id) or self.guild_id,
                           deny=perms.SEND_MESSAGES)
        return channel_id

    def add_forum_channel(self, name: str, *, guild_id: int | None = None,
                          media: bool = False) -> int:
        """A GUILD_FORUM (or GUILD_MEDIA) channel: only threads (posts) are made in it."""
        return self.add_text_channel(name, guild_id=guild_id,
                                     channel_type=GUILD_MEDIA if media else GUILD_FORUM)

    def add_dm_channel(self, user_id: int) -> int:
        channel_id = self.next_id()
        self.channels[channel_id] = {"id": str(channel_id), "type": DM,
                                     "recipients": [self.users[user_id]], "flags": 0,
                                     "last_message_id": None}
        return channel_id

    def set_overwrite(self, channel_id: int, target_id: int, *, allow: int = 0, deny: int = 0,
                      member: bool = False) -> None:
        """A permission overwrite on a channel for a role (the guild's id: @everyone) or a
        member; replaces the target's previous one. Announce it with
        ``gateway.channel_update``."""
        overwrites: list[JsonDict] = self.channels[channel_id]["permission_overwrites"]
        overwrites[:] = [o for o in overwrites if o["id"] != str(target_id)]
        overwrites.append({"id": str(target_id), "type": 1 if member else 0,
                           "allow": str(allow), "deny": str(deny)})

    def add_thread(self, parent_id: int, name: str, *, private: bool = False,
                   owner_id: int | None = None, from_message: int | None = None,
                   archived: bool = False, locked: bool = False,
                   members: Iterable[int] = ()) -> int:
        """A thread in a text or announcement channel. `from_message` starts it from a
        message of the parent: the thread takes that message's id and opens with a
        THREAD_STARTER_MESSAGE pointing to it (Topics › Threads › New Message Types)."""
        parent = self.channels[parent_id]
        if parent["type"] == GUILD_ANNOUNCEMENT:
            thread_type = ANNOUNCEMENT_THREAD
        else:
            thread_type = PRIVATE_THREAD if private else PUBLIC_THREAD
        thread_id = from_message if from_message is not None else self.next_id()
        owner = owner_id if owner_id is not None else self.alice_id
        self.channels[thread_id] = {
            "id": str(thread_id), "type": thread_type, "guild_id": parent["guild_id"],
            "parent_id": str(parent_id), "name": name, "owner_id": str(owner), "flags": 0,
            "last_message_id": None, "rate_limit_per_user": 0, "message_count": 0,
            "member_count": 0, "total_message_sent": 0,
            "thread_metadata": {"archived": archived, "locked": locked,
                                "auto_archive_duration": ARCHIVE_MINUTES,
                                "archive_timestamp": self.timestamp_of(self.next_id()),
                                "create_timestamp": self.timestamp_of(thread_id),
                                **({"invitable": True} if private else {})},
        }
        for user_id in [owner, *members]:
            self.join_thread(thread_id, user_id)
        if from_message is not None:
            starter = self.message_payload(thread_id, self.users[owner], "",
                                           message_type=THREAD_STARTER_MESSAGE)
            starter["message_reference"] = {"type": 0, "message_id": str(from_message),
                                            "channel_id": str(parent_id),
                                            "guild_id": parent["guild_id"]}
            referenced = self.messages[parent_id].get(from_message)
            if referenced is not None:
                starter["referenced_message"] = as_referenced(referenced)
            self.store_message(thread_id, starter)
        return thread_id

    def add_forum_post(self, forum_id: int, author_id: int, title: str, content: str) -> int:
        """A post in a forum or media channel: a thread whose first message, the post
        itself, shares the thread's id (Topics › Threads › Forums)."""
        post_id = self.next_id()
        parent = self.channels[forum_id]
        self.channels[post_id] = {
            "id": str(post_id), "type": PUBLIC_THREAD, "guild_id": parent["guild_id"],
            "parent_id": str(forum_id), "name": title, "owner_id": str(author_id), "flags": 0,
            "last_message_id": None, "rate_limit_per_user": 0, "message_count": 0,
            "member_count": 0, "total_message_sent": 0, "applied_tags": [],
            "thread_metadata": {"archived": False, "locked": False,
                                "auto_archive_duration": ARCHIVE_MINUTES,
                                "archive_timestamp": self.timestamp_of(post_id),
                                "create_timestamp": self.timestamp_of(post_id)},
        }
        self.join_thread(post_id, author_id)
        message = self.message_payload(post_id, self.users[author_id], content,
                                       message_id=post_id)
        self.store_message(post_id, message)
        parent["last_message_id"] = str(post_id)
        return post_id

    def join_thread(self, thread_id: int, user_id: int) -> bool:
        """Add a member to a thread; False if they were one already."""
        members = self.thread_members[thread_id]
        if user_id in members:
            return False
        members.append(user_id)
        self.channels[thread_id]["member_count"] = min(50, len(members))
        return True

    def thread_member_payload(self, thread_id: int, user_id: int) -> JsonDict:
        return {"id": str(thread_id), "user_id": str(user_id),
                "join_timestamp": self.timestamp_of(thread_id), "flags": 0}

    def is_thread(self, channel_id: int) -> bool:
        return self.channels.get(channel_id, {}).get("type") in perms.THREAD_TYPES

    def guild_of(self, channel_id: int) -> int | None:
        guild = self.channels.get(channel_id, {}).get("guild_id")
        return int(guild) if guild is not None else None

    def thread_payload(self, thread_id: int, *, for_user: int | None = None) -> JsonDict:
        """A thread as a channel object, with `member` when `for_user` has joined it."""
        thread = dict(self.channels[thread_id])
        if for_user is not None and for_user in self.thread_members[thread_id]:
            thread["member"] = self.thread_member_payload(thread_id, for_user)
        return thread

    # ---- permissions ---------------------------------------------------------------------

    def permissions(self, channel_id: int, user_id: int) -> int:
        """What `user_id` may do in a guild channel or thread (Topics › Permissions)."""
        channel = self.channels[channel_id]
        if channel.get("guild_id") is None:
            return perms.ALL
        if channel["type"] in perms.THREAD_TYPES:
            parent = self.permissions(int(channel["parent_id"]), user_id)
            return perms.in_thread(parent, private=channel["type"] == PRIVATE_THREAD,
                                   member=user_id in self.thread_members[channel_id])
        guild_id = int(channel["guild_id"])
        guild = self.guilds[guild_id]
        roles = self.roles_in(guild_id, user_id)
        base = perms.base_permissions(
            guild["everyone"], (int(self.roles[r]["permissions"]) for r in roles),
            is_owner=guild.get("owner_id") == user_id)
        return perms.with_overwrites(base, channel.get("permission_overwrites", ()),
                                     guild_id=guild_id, role_ids=roles, user_id=user_id)

    def can_view(self, channel_id: int, user_id: int) -> bool:
        return bool(self.permissions(channel_id, user_id) & perms.VIEW_CHANNEL)

    # ---- messages ------------------------------------------------------------------------

    def message_payload(self, channel_id: int, author: JsonDict, content: str, *,
                        message_type: int = 0, flags: int = 0,
                        embeds: Iterable[JsonDict] = (),
                        message_id: int | None = None) -> JsonDict:
        """A new message object with every field Discord's spec requires (not stored)."""
        message_id = message_id if message_id is not None else self.next_id()
        message: JsonDict = {
            "id": str(message_id), "channel_id": str(channel_id), "author": author,
            "content": content, "timestamp": self.timestamp_of(message_id),
            "edited_timestamp": None, "tts": False, "mention_everyone": False,
            "mentions": [], "mention_roles": [], "attachments": [],
            "embeds": [embed_payload(e) for e in embeds], "components": [], "pinned": False,
            "type": message_type, "flags": flags,
        }
        guild_id = self.channels.get(channel_id, {}).get("guild_id")
        if guild_id is not None:
            message["guild_id"] = guild_id
        return message

    def store_message(self, channel_id: int, message: JsonDict) -> None:
        """Keep a message in its channel; a thread counts it (Topics › Threads)."""
        self.messages[channel_id][int(message["id"])] = message
        channel = self.channels.get(channel_id)
        if channel is None:
            return
        channel["last_message_id"] = message["id"]
        if channel.get("type") in perms.THREAD_TYPES:
            channel["message_count"] += 1
            channel["total_message_sent"] += 1

    def add_message(self, channel_id: int, author_id: int, content: str, *,
                    mentions: Iterable[int] = (), reply_to: int | None = None,
                    attachments: Iterable[JsonDict] = ()) -> JsonDict:
        """Store a message as if a user had sent it; returns its payload. `attachments` are
        `add_attachment` results. History serves its author as a plain user, as Discord's
        does (no member object)."""
        message = self.message_payload(channel_id, self.users[author_id], content)
        message["mentions"] = [self.users[user_id] for user_id in mentions]
        message["attachments"] = list(attachments)
        if reply_to is not None:
            message["type"] = 19
            message["message_reference"] = {"type": 0, "message_id": str(reply_to),
                                            "channel_id": str(channel_id)}
            referenced = self.messages[channel_id].get(reply_to)
            if referenced is not None:
                message["referenced_message"] = as_referenced(referenced)
        self.store_message(channel_id, message)
        return message

    def add_attachment(self, filename: str, content_type: str, data: bytes, *,
                       channel_id: int | None = None) -> JsonDict:
        """An uploaded file, served by the emulated CDN, for `add_message(attachments=...)`;
        filed under the channel it is posted in, as Discord's CDN paths are (default: the
        emulator's text channel)."""
        attachment_id = self.next_id()
        channel = channel_id if channel_id is not None else self.channel_id
        path = f"/attachments/{channel}/{attachment_id}/{filename}"
        self.cdn[path] = CdnFile(content_type, data)
        return {"id": str(attachment_id), "filename": filename, "size": len(data),
                "url": self.cdn_url(path), "proxy_url": self.cdn_url(path),
                "content_type": content_type}

    def add_reaction(self, message_id: int, emoji: str, user_id: int) -> None:
        """`emoji` in route form: a unicode emoji, or `name:id` for a custom one."""
        users = self._reactions[message_id].setdefault(emoji, [])
        if user_id not in users:
            users.append(user_id)

    def reactors(self, message_id: int, emoji: str) -> list[int]:
        return self._reactions[message_id].get(emoji, [])

    def served(self, message: JsonDict) -> JsonDict:
        """A stored message as Discord answers a read or sends an update of it now: its
        reactions counted, and the message it replies to as it is now — edited, or `null`
        once deleted (Resources › Message: "If the field exists but is null, the
        referenced message was deleted")."""
        out = self.with_reactions(message)
        reference = message.get("message_reference")
        if "referenced_message" not in message or not isinstance(reference, dict):
            return out
        parent = self.messages.get(int(reference["channel_id"]), {}).get(
            int(reference["message_id"]))
        out = dict(out)
        out["referenced_message"] = (None if parent is None
                                     else as_referenced(self.with_reactions(parent)))
        return out

    def with_reactions(self, message: JsonDict) -> JsonDict:
        reactions = self._reactions.get(int(message["id"]))
        if not reactions:
            return message
        bot_id = self.bot_id
        out = dict(message)
        out["reactions"] = [
            {"emoji": emoji_payload(emoji), "count": len(users),
             "count_details": {"burst": 0, "normal": len(users)}, "me": bot_id in users,
             "me_burst": False, "burst_colors": []}
            for emoji, users in reactions.items() if users
        ]
        return out


def emoji_payload(emoji: str) -> JsonDict:
    name, sep, emoji_id = emoji.partition(":")
    if sep:
        return {"id": emoji_id, "name": name}
    return {"id": None, "name": emoji}
