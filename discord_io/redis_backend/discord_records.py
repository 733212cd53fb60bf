"""Discord messages as queue records and back: Redis holds plain ids; the worker that runs a
record it did not receive reads the message over REST (one call per such turn)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import discord

from .queue import QueuedRecord


def record_of_message(message: discord.Message) -> QueuedRecord:
    return QueuedRecord(message_id=str(message.id), channel_id=str(message.channel.id),
                        author=str(message.author.id))


def message_loader(client: discord.Client
                   ) -> Callable[[QueuedRecord], Awaitable[discord.Message | None]]:
    """Reads a queued record's message; None when it was deleted meanwhile."""

    async def load(record: QueuedRecord) -> discord.Message | None:
        channel = client.get_partial_messageable(int(record.channel_id))
        try:
            return await channel.fetch_message(int(record.message_id))
        except discord.NotFound:
            return None

    return load
