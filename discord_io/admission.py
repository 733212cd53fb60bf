"""Whether the bot answers a message: a pure decision over a few facts of the message.

The bot replies when it is mentioned, when the message replies to one of its messages, in
DMs, or when a configured trigger word appears; it never answers bots (loops between bots
are the classic failure) or itself.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass
from typing import Literal

import discord

Reason = Literal["self", "bot", "dm", "mention", "reply", "trigger_word", "not_addressed"]


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """What addresses the bot besides mentions and replies."""

    trigger_words: tuple[str, ...] = ()
    reply_in_dms: bool = True


@dataclass(frozen=True, slots=True)
class MessageFacts:
    """The parts of a message admission looks at."""

    author_id: int
    author_is_bot: bool
    is_dm: bool
    mentions_bot: bool
    replies_to_bot: bool
    content: str


@dataclass(frozen=True, slots=True)
class Admission:
    reply: bool
    reason: Reason


def _has_word(content: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", content, re.IGNORECASE) is not None


def decide(facts: MessageFacts, bot_user_id: int, policy: AdmissionPolicy) -> Admission:
    """Reply or not, and why."""
    if facts.author_id == bot_user_id:
        return Admission(False, "self")
    if facts.author_is_bot:
        return Admission(False, "bot")
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
    )


def should_reply(
    message: discord.Message,
    bot_user_id: int,
    policy: AdmissionPolicy,
    bot_message_ids: Container[int] = (),
) -> Admission:
    return decide(facts_of(message, bot_user_id, bot_message_ids), bot_user_id, policy)
