"""Channel messages as the engine's dialogue context items, chosen by a history policy.

The policy (`HistoryPolicy`) reads either the channel's last messages or the reply chain of
the message being answered (as llmcord does), and keeps what fits a character budget, oldest
dropped first, the answered message always kept. Messages that wait in the channel's queue
for a turn of their own are never shown (D4: a turn answers its own message, not the ones
behind it). The bot's own messages are assistant turns. Each message is also capped, so a
busy channel cannot blow up the request. Reactions appear as counts only; who reacted is
looked up later, and only when the model asks for message metadata (R6).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import discord

from fsm.engine.user_text import quoted_name

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 50
DEFAULT_MAX_CHARS = 4000
DIALOGUE_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})

ContextItem = dict[str, Any]


def _content(message: discord.Message, max_chars: int) -> str:
    """The text, then its attachments and stickers; their names are the uploader's choice,
    so each is a one-line quoted string (it cannot open a line or a directive of its own)."""
    parts = [message.clean_content]
    for attachment in message.attachments:
        kind = f" ({quoted_name(attachment.content_type)})" if attachment.content_type else ""
        parts.append(f"<attachment: {quoted_name(attachment.filename)}{kind}>")
    parts.extend(f"<sticker: {quoted_name(sticker.name)}>" for sticker in message.stickers)
    text = "\n".join(part for part in parts if part)
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return text


def dialogue_item(message: discord.Message, bot_user_id: int, max_chars: int) -> ContextItem:
    """One message as a context item."""
    reference = message.reference
    return {
        "type": "dialogue",
        "role": "assistant" if message.author.id == bot_user_id else "user",
        "message_id": str(message.id),
        "author": message.author.display_name,
        "author_id": str(message.author.id),
        "content": _content(message, max_chars),
        "sent_at": message.created_at.isoformat(),
        "reply_to": str(reference.message_id)
        if reference is not None and reference.message_id is not None
        else None,
        "reactions": [
            {"emoji": str(reaction.emoji), "count": reaction.count}
            for reaction in message.reactions
        ],
    }


def dialogue_items(
    messages: Iterable[discord.Message],
    *,
    bot_user_id: int,
    limit: int = DEFAULT_LIMIT,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> list[ContextItem]:
    """The most recent `limit` dialogue messages, oldest first. System messages are skipped."""
    dialogue = sorted(
        (m for m in messages if m.type in DIALOGUE_TYPES), key=lambda m: (m.created_at, m.id)
    )
    return (
        [dialogue_item(m, bot_user_id, max_chars) for m in dialogue[-limit:]] if limit > 0 else []
    )


async def recent_messages(
    channel: discord.abc.Messageable,
    *,
    limit: int = DEFAULT_LIMIT,
    before: discord.abc.Snowflake | None = None,
) -> list[discord.Message]:
    """Up to `limit` messages before `before` (or the latest), in one bounded history read."""
    return [message async for message in channel.history(limit=limit, before=before)]


HistoryMode = Literal["recent", "reply_chain"]


@dataclass(frozen=True, slots=True)
class HistoryPolicy:
    mode: HistoryMode = "recent"
    max_messages: int = 20
    max_chars: int = 24_000
    """Budget for all messages' content together (about 4 characters a token)."""
    max_message_chars: int = DEFAULT_MAX_CHARS


Excluded = Callable[[discord.Message], bool]


async def select_history(trigger: discord.Message, policy: HistoryPolicy, *,
                         excluded: Excluded, waiting: int = 0) -> list[discord.Message]:
    """The messages the turn answering `trigger` may see, oldest first, `trigger` last or
    among the last. `excluded` tells messages that wait for (or were refused) a turn of their
    own; `waiting` is how many there may be, so the read still finds `max_messages` others."""
    if policy.mode == "reply_chain":
        chain = await reply_chain(trigger, limit=policy.max_messages)
        return [m for m in chain if m.id == trigger.id or not excluded(m)]
    read = await recent_messages(trigger.channel, limit=policy.max_messages + waiting + 1)
    if all(m.id != trigger.id for m in read):
        # The channel moved on past the read window: read up to the trigger instead.
        read = [*await recent_messages(trigger.channel, limit=policy.max_messages,
                                       before=trigger), trigger]
    kept = [m for m in read if m.id == trigger.id or not excluded(m)]
    kept.sort(key=lambda m: (m.created_at, m.id))
    newest = kept[-policy.max_messages:]
    if all(m.id != trigger.id for m in newest):
        newest = [*newest[1:], trigger]
    return newest


async def reply_chain(trigger: discord.Message, *, limit: int) -> list[discord.Message]:
    """`trigger` and the messages it replies to, back to the start of the chain or `limit`
    messages, oldest first. A deleted or unreadable message ends the chain."""
    chain = [trigger]
    current = trigger
    while len(chain) < limit and current.reference is not None:
        parent = await _referenced(current)
        if parent is None or any(m.id == parent.id for m in chain):
            break
        chain.append(parent)
        current = parent
    chain.reverse()
    return chain


async def _referenced(message: discord.Message) -> discord.Message | None:
    reference = message.reference
    if reference is None or reference.message_id is None:
        return None
    resolved = reference.resolved
    if isinstance(resolved, discord.Message):
        return resolved
    if isinstance(resolved, discord.DeletedReferencedMessage):
        return None
    if reference.cached_message is not None:
        return reference.cached_message
    try:
        return await message.channel.fetch_message(reference.message_id)
    except discord.HTTPException as exc:
        log.info("reply chain ends at %s: %s", reference.message_id, exc.status)
        return None


def within_budget(items: list[ContextItem], max_chars: int,
                  keep_id: str | None = None) -> list[ContextItem]:
    """The newest items whose content fits `max_chars` together; the item `keep_id` (the
    message answered) is kept whatever it costs, older items are dropped first."""
    kept: list[ContextItem] = []
    used = 0
    full = False
    for item in reversed(items):
        cost = len(str(item.get("content") or ""))
        if item.get("message_id") == keep_id:
            kept.append(item)
            used += cost
            continue
        full = full or used + cost > max_chars
        if not full:
            kept.append(item)
            used += cost
    kept.reverse()
    return kept
