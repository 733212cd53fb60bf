"""Whether the bot answers a message: a pure decision over a few facts of the message.

The bot replies when it is mentioned, when the message replies to one of its messages, in
DMs, or when a configured trigger word appears; it never answers bots (loops between bots
are the classic failure) or itself. An operator's access lists then narrow that down (users,
roles, channels, DMs on or off), with a deny entry winning over an allow entry.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Literal

import discord

from .member_roles import role_ids_of

Reason = Literal[
    "self", "bot", "dm", "mention", "reply", "trigger_word", "not_addressed", "dms_off",
    "user_not_allowed", "channel_not_allowed",
]


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    """Who may talk to the bot, where (llmcord's permissions): an empty allow list allows
    everyone; a deny entry always wins. In DMs only the user lists apply."""

    allowed_users: frozenset[int] = frozenset()
    blocked_users: frozenset[int] = frozenset()
    allowed_roles: frozenset[int] = frozenset()
    blocked_roles: frozenset[int] = frozenset()
    allowed_channels: frozenset[int] = frozenset()
    blocked_channels: frozenset[int] = frozenset()
    allow_dms: bool = True

    @classmethod
    def of(cls, *, allow_dms: bool = True, **lists: Iterable[int]) -> AccessPolicy:
        return cls(allow_dms=allow_dms, **{k: frozenset(v) for k, v in lists.items()})


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """What addresses the bot besides mentions and replies, and who may."""

    trigger_words: tuple[str, ...] = ()
    reply_in_dms: bool = True
    access: AccessPolicy = field(default_factory=AccessPolicy)


@dataclass(frozen=True, slots=True)
class MessageFacts:
    """The parts of a message admission looks at."""

    author_id: int
    author_is_bot: bool
    is_dm: bool
    mentions_bot: bool
    replies_to_bot: bool
    content: str
    role_ids: frozenset[int] = frozenset()
    channel_ids: frozenset[int] = frozenset()
    """The channel, and for a thread or a categorised channel its parent and category."""


@dataclass(frozen=True, slots=True)
class Admission:
    reply: bool
    reason: Reason


def _has_word(content: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", content, re.IGNORECASE) is not None


def user_allowed(facts: MessageFacts, access: AccessPolicy) -> bool:
    if facts.author_id in access.blocked_users or facts.role_ids & access.blocked_roles:
        return False
    roles_apply = not facts.is_dm
    if not access.allowed_users and not (roles_apply and access.allowed_roles):
        return True
    return facts.author_id in access.allowed_users or bool(
        roles_apply and facts.role_ids & access.allowed_roles)


def channel_allowed(facts: MessageFacts, access: AccessPolicy) -> bool:
    if facts.channel_ids & access.blocked_channels:
        return False
    if facts.is_dm:
        return access.allow_dms
    return not access.allowed_channels or bool(facts.channel_ids & access.allowed_channels)


def decide(facts: MessageFacts, bot_user_id: int, policy: AdmissionPolicy) -> Admission:
    """Reply or not, and why."""
    if facts.author_id == bot_user_id:
        return Admission(False, "self")
    if facts.author_is_bot:
        return Admission(False, "bot")
    addressed = _addressed(facts, policy)
    if not addressed.reply:
        return addressed
    if facts.is_dm and not policy.access.allow_dms:
        return Admission(False, "dms_off")
    if not channel_allowed(facts, policy.access):
        return Admission(False, "channel_not_allowed")
    if not user_allowed(facts, policy.access):
        return Admission(False, "user_not_allowed")
    return addressed


def _addressed(facts: MessageFacts, policy: AdmissionPolicy) -> Admission:
    if facts.is_dm and policy.reply_in_dms:
        return Admission(True, "dm")
    if facts.mentions_bot:
        return Admission(True, "mention")
    if facts.replies_to_bot:
        return Admission(True, "reply")
    if any(
        word.strip() and _has_word(facts.content, word.strip()) for word in policy.trigger_words
    ):
        return Admission(True, "trigger_word")
    return Admission(False, "not_addressed")


def addresses_bot(message: discord.Message, bot_user_id: int, policy: AdmissionPolicy) -> bool:
    """Whether `message` asks the bot for a turn (mention, reply, DM, trigger word), whether
    or not the access lists then grant it one."""
    facts = facts_of(message, bot_user_id)
    if facts.author_id == bot_user_id or facts.author_is_bot:
        return False
    return _addressed(facts, policy).reply


def facts_of(
    message: discord.Message, bot_user_id: int, bot_message_ids: Container[int] = ()
) -> MessageFacts:
    """Read the facts off a discord.py message.

    A reply counts as addressed to the bot when the referenced message (which Discord sends
    along with a reply) is the bot's, or its id is in `bot_message_ids` when it was not sent.
    """
    reference = message.reference
    replies_to_bot = False
    if reference is not None:
        resolved = reference.resolved
        if isinstance(resolved, discord.Message):
            replies_to_bot = resolved.author.id == bot_user_id
        elif reference.message_id is not None:
            replies_to_bot = reference.message_id in bot_message_ids
    return MessageFacts(
        author_id=message.author.id,
        author_is_bot=message.author.bot or message.webhook_id is not None,
        is_dm=message.channel.type == discord.ChannelType.private,
        mentions_bot=any(user.id == bot_user_id for user in message.mentions)
        or bot_user_id in message.raw_mentions,
        replies_to_bot=replies_to_bot,
        content=message.content,
        role_ids=role_ids_of(message.author) or frozenset(),
        channel_ids=channel_ids_of(message.channel),
    )


def channel_ids_of(channel: object) -> frozenset[int]:
    """The channel's id, its parent's (a thread) and its category's, as far as known."""
    ids = {getattr(channel, "id", None), getattr(channel, "parent_id", None),
           getattr(channel, "category_id", None)}
    parent = getattr(channel, "parent", None)
    if parent is not None:
        ids.add(getattr(parent, "category_id", None))
    return frozenset(i for i in ids if isinstance(i, int))


def should_reply(
    message: discord.Message,
    bot_user_id: int,
    policy: AdmissionPolicy,
    bot_message_ids: Container[int] = (),
) -> Admission:
    return decide(facts_of(message, bot_user_id, bot_message_ids), bot_user_id, policy)
