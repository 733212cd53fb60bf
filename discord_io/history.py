"""Channel messages as the engine's dialogue context items, chosen by a history policy.

The policy (`HistoryPolicy`) reads either the channel's last messages or the reply chain of
the message being answered (as llmcord does); a `Visible` filter drops what the turn may not
show (messages waiting in the queue for a turn of their own, D4; messages the access lists
deny, A1), the answered message always kept. The bot's own messages are assistant turns.
Reactions appear as counts only; who reacted is looked up later, and only when the model
asks for message metadata (R6). The size budgets are applied to the rendered items, after
uploads are inlined (`context_budget`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import discord

from fsm import quoted_name

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


class HistoryRead(Protocol):
    """How a turn reads its channel's last messages: `recent_messages`, or the gateway's
    windows (`history_cache.GatewayHistory.read`), which answer the same."""

    async def __call__(self, channel: discord.abc.Messageable, *, limit: int,
                       before: discord.abc.Snowflake | None = None) -> list[discord.Message]:
        ...


HistoryMode = Literal["recent", "reply_chain"]


@dataclass(frozen=True, slots=True)
class HistoryPolicy:
    mode: HistoryMode = "recent"
    max_messages: int = 20
    max_chars: int = 24_000
    """Budget for all messages' content together (about 4 characters a token)."""
    max_message_chars: int = DEFAULT_MAX_CHARS


ParentRead = Callable[[discord.Message], Awaitable["discord.Message | None"]]
"""The message another one replies to, None where the chain ends: `referenced`, or the
gateway's windows (`history_cache.GatewayHistory.referenced`), which answer the same."""

Visible = Callable[[list[discord.Message]], Awaitable[list[discord.Message]]]
"""Of some messages, those the turn may show (queued ones and those the access lists deny
are not), in their order."""


async def select_history(trigger: discord.Message, policy: HistoryPolicy, *,
                         visible: Visible, waiting: int = 0,
                         read: HistoryRead = recent_messages,
                         parent: ParentRead | None = None) -> list[discord.Message]:
    """The messages the turn answering `trigger` may see, oldest first, `trigger` last or
    among the last (it is always kept). `visible` drops messages that wait for (or were
    refused) a turn of their own and those the model may not read; `waiting` is how many
    there may be, so the read still finds `max_messages` others."""
    if policy.mode == "reply_chain":
        chain = await reply_chain(trigger, limit=policy.max_messages,
                                  parent=parent or referenced)
        return await _visible_with(trigger, chain, visible)
    latest = await read(trigger.channel, limit=policy.max_messages + waiting + 1)
    if all(m.id != trigger.id for m in latest):
        # The channel moved on past the read window: read up to the trigger instead.
        latest = [*await read(trigger.channel, limit=policy.max_messages, before=trigger),
                  trigger]
    kept = await _visible_with(trigger, latest, visible)
    kept.sort(key=lambda m: (m.created_at, m.id))
    newest = kept[-policy.max_messages:]
    if all(m.id != trigger.id for m in newest):
        newest = [*newest[1:], trigger]
    return newest


async def _visible_with(trigger: discord.Message, messages: list[discord.Message],
                        visible: Visible) -> list[discord.Message]:
    shown = {m.id for m in await visible([m for m in messages if m.id != trigger.id])}
    return [m for m in messages if m.id == trigger.id or m.id in shown]


async def reply_chain(trigger: discord.Message, *, limit: int,
                      parent: ParentRead | None = None) -> list[discord.Message]:
    """`trigger` and the messages it replies to, back to the start of the chain or `limit`
    messages, oldest first. A deleted or unreadable message ends the chain."""
    read_parent = parent or referenced
    chain = [trigger]
    current = trigger
    while len(chain) < limit and current.reference is not None:
        found = await read_parent(current)
        if found is None or any(m.id == found.id for m in chain):
            break
        chain.append(found)
        current = found
    chain.reverse()
    return chain


async def referenced(message: discord.Message) -> discord.Message | None:
    """The message `message` replies to: as Discord sent it along or the client caches it,
    else one REST read."""
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


def replied_to(message: discord.Message) -> discord.Message | None:
    """The message `message` replies to, as Discord sent it along (or the client caches
    it); no REST call."""
    reference = message.reference
    if reference is None:
        return None
    if isinstance(reference.resolved, discord.Message):
        return reference.resolved
    return reference.cached_message
