"""Threads and forum posts as a turn sees them (Topics › Threads).

A thread's history is its own messages; what it is about is its starter message. A thread
started from a message of a text channel shares that message's id, and the message itself
stays in the parent channel (the thread opens with a THREAD_STARTER_MESSAGE pointing to it);
a forum or media post's first message is in the thread, with the thread's id. Either way the
turn shows the starter first, so the model knows what the thread answers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

import discord

log = logging.getLogger(__name__)


async def starter_message(thread: discord.Thread) -> discord.Message | None:
    """The thread's starter message, from the cache or one read; None if it was deleted (an
    orphaned thread) or cannot be read."""
    cached = thread.starter_message
    if cached is not None:
        return cached
    parent = thread.parent
    source: discord.abc.Messageable | None = thread if isinstance(
        parent, discord.ForumChannel) or parent is None else parent
    if not isinstance(source, discord.abc.Messageable):
        return None
    try:
        return await source.fetch_message(thread.id)
    except discord.NotFound:
        return None
    except discord.HTTPException as exc:
        log.info("thread %s: its starter message could not be read (HTTP %s)", thread.id,
                 exc.status)
        return None


Visible = Callable[[list[discord.Message]], Awaitable[list[discord.Message]]]


async def with_starter(trigger: discord.Message, picked: Sequence[discord.Message], *,
                       visible: Visible) -> list[discord.Message]:
    """`picked` with the thread's starter message first when `trigger` is in a thread and
    the history does not hold it already (and `visible` lets the turn show it)."""
    thread = trigger.channel
    if not isinstance(thread, discord.Thread) or any(m.id == thread.id for m in picked):
        return list(picked)
    starter = await starter_message(thread)
    if starter is None or starter.id == trigger.id or not await visible([starter]):
        return list(picked)
    return [starter, *picked]
