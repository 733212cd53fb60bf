"""Recent channel messages as the engine's dialogue context items.

Bounded on both ends: at most `limit` messages (the most recent) and at most `max_chars` of
content each, so a busy channel cannot blow up the request. Reactions appear as counts only;
who reacted is looked up later, and only when the model asks for message metadata (R6).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import discord

DEFAULT_LIMIT = 50
DEFAULT_MAX_CHARS = 4000
DIALOGUE_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})

ContextItem = dict[str, Any]


def _content(message: discord.Message, max_chars: int) -> str:
    parts = [message.clean_content]
    for attachment in message.attachments:
        kind = f" ({attachment.content_type})" if attachment.content_type else ""
        parts.append(f"<attachment: {attachment.filename}{kind}>")
    parts.extend(f"<sticker: {sticker.name}>" for sticker in message.stickers)
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
