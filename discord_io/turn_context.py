"""The context items of one turn: the history its policy picks, less what the turn may not
show, the message replied to, the uploads, all within the budget.

What the turn may not show: messages waiting in the queue for a turn of their own, and later
messages addressed to the bot (they get, or were refused, their own turn: D4); messages the
access lists deny (`TurnAudience`, one verdict per message whatever path reaches it). The
message the trigger replies to is shown even when it lies beyond the history window — as
a dialogue item that counts against the budget, and with its uploads. Text files are
inlined, and images read, for the message answered and the ones it replies to only: a
download per file of the whole history on every turn would not scale. The budget is
measured on the rendered items (`context_budget`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import discord

from .admission import AdmissionPolicy, addresses_bot
from .attachments import AttachmentReader, ShownImage, image_caption, image_item
from .context_budget import Draft, fit
from .exclusion import TurnAudience
from .history import (
    DIALOGUE_TYPES,
    HistoryPolicy,
    HistoryRead,
    ParentRead,
    dialogue_item,
    dialogue_items,
    recent_messages,
    replied_to,
    select_history,
)
from .threads import with_starter

ContextItem = dict[str, Any]
Hidden = Callable[[discord.Message], bool]


def hidden_from(trigger: discord.Message, *, pending: Callable[[], Iterable[discord.Message]],
                bot_user_id: int, policy: AdmissionPolicy) -> Hidden:
    """What the turn answering `trigger` must not show for the queue's sake (D4): messages
    queued behind it, and any later message addressed to the bot (it gets, or was refused,
    a turn of its own), whoever wrote it."""

    def hidden(candidate: discord.Message) -> bool:
        if candidate.author.id == bot_user_id:
            return False
        if any(m.id == candidate.id for m in pending()):
            return True
        return candidate.id > trigger.id and addresses_bot(candidate, bot_user_id, policy)

    return hidden


async def build_context(trigger: discord.Message, *, history: HistoryPolicy,
                        audience: TurnAudience, hidden: Hidden, bot_user_id: int,
                        attachments: AttachmentReader | None = None,
                        waiting: int = 0, read_history: bool = True,
                        read: HistoryRead = recent_messages,
                        read_parent: ParentRead | None = None) -> list[ContextItem]:
    """The dialogue the model sees for `trigger`, oldest first, then the images' item. In a
    thread the starter message comes first (D7); without `read_history` (no
    READ_MESSAGE_HISTORY: Discord would answer the read with nothing) only `trigger` (D6)."""

    async def visible(messages: list[discord.Message]) -> list[discord.Message]:
        return await audience.admitted(m for m in messages if not hidden(m))

    if read_history:
        picked = await select_history(trigger, history, visible=visible, waiting=waiting,
                                      read=read, parent=read_parent)
        picked = await with_starter(trigger, picked, visible=visible)
    else:
        picked = [trigger]
    parent_id = trigger.reference.message_id if trigger.reference is not None else None
    parent = next((m for m in picked if m.id == parent_id), None)
    if parent is None and parent_id is not None:
        # replied to from beyond the history window (or a message the history left out)
        parent = replied_to(trigger)
        if parent is not None and (parent.type not in DIALOGUE_TYPES or hidden(parent)
                                   or not await audience.admits(parent)):
            parent = None
    drafts = [Draft(item) for item in dialogue_items(
        picked, bot_user_id=bot_user_id, limit=history.max_messages,
        max_chars=history.max_message_chars)]
    if parent is not None and all(d.message_id != str(parent.id) for d in drafts):
        drafts.insert(0, Draft(dialogue_item(parent, bot_user_id, history.max_message_chars)))
    shown = _with_uploads(trigger, parent, picked)
    images: list[ShownImage] = []
    if attachments is not None:
        by_id = {d.message_id: d for d in drafts}
        for message in shown:
            draft = by_id.get(str(message.id))
            for attachment in message.attachments if draft is not None else ():
                text = await attachments.text_of(attachment)
                if text is not None and draft is not None:
                    draft.files.append((attachment.filename, text))
        images = await attachments.images(shown)
    first = [str(trigger.id)] + ([str(parent.id)] if parent is not None else [])
    items = fit(drafts, max_chars=history.max_chars, max_item_chars=history.max_message_chars,
                first=first, reserve=len(image_caption(images)) if images else 0)
    kept = {item["message_id"] for item in items}
    shown_images = image_item([image for image in images if str(image.message.id) in kept])
    return items + ([shown_images] if shown_images is not None else [])


def _with_uploads(trigger: discord.Message, parent: discord.Message | None,
                  picked: Sequence[discord.Message]) -> list[discord.Message]:
    """The messages whose uploads the model sees: the one answered, the one it replies to
    and, as far as the history holds them, the ones that replies to, newest first."""
    shown = [trigger] + ([parent] if parent is not None else [])
    by_id = {m.id: m for m in picked}
    current = parent
    while current is not None and current.reference is not None:
        current = by_id.get(current.reference.message_id or 0)
        if current is None or current in shown:
            break
        shown.append(current)
    return shown
