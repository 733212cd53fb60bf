"""Discord's permission model, as Topics › Permissions documents it: the guild's @everyone
role and the member's roles give base permissions (the owner and ADMINISTRATOR get all), then
the channel's overwrites apply in the documented order (@everyone deny then allow, the
member's roles' denies then allows together, the member's own deny then allow). Implicit
rules follow: without VIEW_CHANNEL nothing else in the channel applies, and without
SEND_MESSAGES neither do the permissions that only qualify a send. Threads (Topics ›
Threads › Permissions) inherit their parent's permissions, except that SEND_MESSAGES has no
effect there and SEND_MESSAGES_IN_THREADS takes its place; a private thread is visible only
to its members and to those with MANAGE_THREADS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CREATE_INSTANT_INVITE = 1 << 0
ADMINISTRATOR = 1 << 3
ADD_REACTIONS = 1 << 6
VIEW_CHANNEL = 1 << 10
SEND_MESSAGES = 1 << 11
SEND_TTS_MESSAGES = 1 << 12
MANAGE_MESSAGES = 1 << 13
EMBED_LINKS = 1 << 14
ATTACH_FILES = 1 << 15
READ_MESSAGE_HISTORY = 1 << 16
MENTION_EVERYONE = 1 << 17
CHANGE_NICKNAME = 1 << 26
USE_APPLICATION_COMMANDS = 1 << 31
MANAGE_THREADS = 1 << 34
CREATE_PUBLIC_THREADS = 1 << 35
CREATE_PRIVATE_THREADS = 1 << 36
SEND_MESSAGES_IN_THREADS = 1 << 38
ALL = (1 << 51) - 1

NAMES = {VIEW_CHANNEL: "VIEW_CHANNEL", SEND_MESSAGES: "SEND_MESSAGES",
         READ_MESSAGE_HISTORY: "READ_MESSAGE_HISTORY", MANAGE_MESSAGES: "MANAGE_MESSAGES",
         MANAGE_THREADS: "MANAGE_THREADS", SEND_MESSAGES_IN_THREADS: "SEND_MESSAGES_IN_THREADS",
         EMBED_LINKS: "EMBED_LINKS", ATTACH_FILES: "ATTACH_FILES", ADD_REACTIONS: "ADD_REACTIONS",
         CHANGE_NICKNAME: "CHANGE_NICKNAME"}

DEFAULT_EVERYONE = (VIEW_CHANNEL | SEND_MESSAGES | EMBED_LINKS | ATTACH_FILES
                    | READ_MESSAGE_HISTORY | ADD_REACTIONS | USE_APPLICATION_COMMANDS
                    | SEND_MESSAGES_IN_THREADS | CREATE_PUBLIC_THREADS | CHANGE_NICKNAME)
"""What @everyone may do in a new emulated guild (close to a new Discord server's defaults)."""

THREAD_TYPES = frozenset({10, 11, 12})
PRIVATE_THREAD = 12
SEND_QUALIFIERS = MENTION_EVERYONE | SEND_TTS_MESSAGES | ATTACH_FILES | EMBED_LINKS

Overwrite = Mapping[str, Any]


def base_permissions(everyone: int, role_permissions: Iterable[int], *, is_owner: bool) -> int:
    """`compute_base_permissions` of the documentation."""
    if is_owner:
        return ALL
    permissions = everyone
    for role in role_permissions:
        permissions |= role
    return ALL if permissions & ADMINISTRATOR else permissions


def with_overwrites(base: int, overwrites: Iterable[Overwrite], *, guild_id: int,
                    role_ids: Iterable[int], user_id: int) -> int:
    """`compute_overwrites` of the documentation, then the implicit denials."""
    if base & ADMINISTRATOR:
        return ALL
    by_id = {int(o["id"]): o for o in overwrites}
    permissions = base
    everyone = by_id.get(guild_id)
    if everyone is not None:
        permissions = (permissions & ~int(everyone["deny"])) | int(everyone["allow"])
    allow = deny = 0
    for role_id in role_ids:
        overwrite = by_id.get(role_id)
        if overwrite is not None and overwrite.get("type", 0) == 0:
            allow |= int(overwrite["allow"])
            deny |= int(overwrite["deny"])
    permissions = (permissions & ~deny) | allow
    member = by_id.get(user_id)
    if member is not None and member.get("type", 1) == 1:
        permissions = (permissions & ~int(member["deny"])) | int(member["allow"])
    return implicit(permissions)


def implicit(permissions: int) -> int:
    """Topics › Permissions › Implicit Permissions."""
    if permissions & ADMINISTRATOR:
        return ALL
    if not permissions & VIEW_CHANNEL:
        return 0
    if not permissions & SEND_MESSAGES:
        permissions &= ~SEND_QUALIFIERS
    return permissions


def in_thread(parent_permissions: int, *, private: bool, member: bool) -> int:
    """A thread's permissions from its parent's: SEND_MESSAGES has no effect in a thread;
    a private thread is invisible to non-members without MANAGE_THREADS."""
    if parent_permissions == ALL:
        return ALL
    if private and not member and not parent_permissions & MANAGE_THREADS:
        return 0
    return parent_permissions & ~SEND_MESSAGES


def missing(permissions: int, needed: int) -> str:
    """The names of the permissions of `needed` that `permissions` lacks."""
    return ", ".join(name for bit, name in NAMES.items() if needed & bit and not permissions & bit)
