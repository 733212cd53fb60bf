"""Channel history from the messages the gateway already delivered (D51–D53).

A turn reads its channel's last messages before it answers (`history.select_history`). A
REST read per turn is a request against the bot's global limit of 50 a second, and the
gateway has already delivered every one of those messages, the bot's own included. So each
channel may hold a *window*: its newest messages, every message newer than the window's
oldest (nothing missing in between), kept current by the gateway's creates, edits and
deletes. A read the window covers is answered from it, with authors and mentions resolved as
discord.py resolves a fetched message's (the REST message carries no member), so the turn
sees exactly what a fetch would have returned.

Only then. A channel has a window once one REST read filled it (a cold channel is fetched
once), or when Discord said at connect that it never had a message. A window is dropped or
not trusted when the bot cannot know it is whole: while a shard is disconnected (its events
wait for a RESUME), after a session was lost (the gap's events never come), after an edit of
a message it does not hold, after an edit or a delete of a message another held one
replies to (a read shows the reply's parent as it is now, `null` once deleted), and after a
reaction changes (the counts are part of what a fetch returns, and the window does not
count them). A read that races an event of its
channel does not fill a window. Windows are bounded (messages per channel, channels held).
"""

from __future__ import annotations

import bisect
import copy
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import discord

from .history import recent_messages, referenced
from .session_gaps import SessionGaps

DEFAULT_MESSAGES_PER_CHANNEL = 64
"""Enough for the default history (20) with a full queue (10) behind the turn, twice over."""
DEFAULT_MAX_CHANNELS = 2048


@dataclass(slots=True)
class _Window:
    ids: list[int]
    messages: list[discord.Message]
    """Oldest first; every message of the channel newer than the first is here."""
    complete: bool
    """Nothing older than the first exists: the window holds the channel from its start."""
    epoch: int
    """Sessions lost before it was filled (`SessionGaps.epoch`)."""


@dataclass(slots=True)
class HistoryCounts:
    """What the turns' history reads cost: served from windows, fetched over REST."""

    served: int = 0
    fetched: int = 0
    by_channel: dict[int, int] = field(default_factory=dict)
    """REST reads per channel."""
    parents_served: int = 0
    """Reply-chain parents answered from a window (`GatewayHistory.referenced`)."""
    parents_fetched: int = 0
    """Reply-chain parents read over REST (one message each)."""


class GatewayHistory:
    """The windows of one client; `read` answers like `history.recent_messages`."""

    def __init__(self, client: discord.Client, gaps: SessionGaps, *,
                 messages_per_channel: int = DEFAULT_MESSAGES_PER_CHANNEL,
                 max_channels: int = DEFAULT_MAX_CHANNELS) -> None:
        self._client = client
        self._gaps = gaps
        self.messages_per_channel = messages_per_channel
        self.max_channels = max_channels
        self._windows: OrderedDict[int, _Window] = OrderedDict()
        self._events: dict[int, int] = {}
        """Message events seen per channel (a read that saw one arrive fills no window)."""
        self.counts = HistoryCounts()

    def holds(self, channel_id: int) -> bool:
        """Whether a read of the channel may be answered from its window now."""
        window = self._windows.get(channel_id)
        return window is not None and window.epoch == self._gaps.epoch and not self._gaps.down

    # ---- reads ---------------------------------------------------------------------------

    async def read(self, channel: discord.abc.Messageable, *, limit: int,
                   before: discord.abc.Snowflake | None = None) -> list[discord.Message]:
        """Up to `limit` messages before `before` (or the latest), newest first: from the
        channel's window where it holds exactly what a fetch returns, else one REST read."""
        channel_id = _channel_id(channel)
        served = self._serve(channel_id, limit, before)
        if served is not None:
            self.counts.served += 1
            return served
        self.counts.fetched += 1
        self.counts.by_channel[channel_id] = self.counts.by_channel.get(channel_id, 0) + 1
        mark = (self._events.get(channel_id, 0), self._gaps.epoch)
        fetched = await recent_messages(channel, limit=limit, before=before)
        if before is None and not self._gaps.down and \
                mark == (self._events.get(channel_id, 0), self._gaps.epoch):
            oldest_first = sorted(fetched, key=lambda m: m.id)
            self._hold(channel_id, _Window([m.id for m in oldest_first], oldest_first,
                                           complete=len(fetched) < limit,
                                           epoch=self._gaps.epoch))
        return fetched

    def _serve(self, channel_id: int, limit: int,
               before: discord.abc.Snowflake | None) -> list[discord.Message] | None:
        window = self._windows.get(channel_id)
        if window is None or not self.holds(channel_id):
            return None
        end = len(window.ids) if before is None else bisect.bisect_left(window.ids, before.id)
        if end < limit and not window.complete:
            return None
        picked = window.messages[max(0, end - limit):end]
        return [as_fetched(m) for m in reversed(picked)]

    async def referenced(self, message: discord.Message) -> discord.Message | None:
        """The message `message` replies to, as `history.referenced` answers (D59): what
        Discord sent along or the client caches; else from the channel's window where it
        knows the answer (the message, or that it no longer exists: a fetch would get 404);
        else, in a channel with no window yet, one read that fills the window (a chain
        walks many parents; one read is cheaper than a fetch per parent) and then the
        window; else one REST read of the message."""
        reference = message.reference
        if reference is None or reference.message_id is None or \
                reference.resolved is not None or reference.cached_message is not None or \
                reference.channel_id != message.channel.id:
            return await referenced(message)
        channel_id, wanted = message.channel.id, reference.message_id
        known, found = self._lookup(channel_id, wanted)
        if not known and channel_id not in self._windows:
            await self.read(message.channel, limit=self.messages_per_channel)
            known, found = self._lookup(channel_id, wanted)
        if known:
            self.counts.parents_served += 1
            return found
        self.counts.parents_fetched += 1
        return await referenced(message)

    def _lookup(self, channel_id: int, message_id: int) -> tuple[bool, discord.Message | None]:
        """Whether the window knows what a fetch of the message returns, and that."""
        window = self._windows.get(channel_id)
        if window is None or not self.holds(channel_id):
            return False, None
        at = bisect.bisect_left(window.ids, message_id)
        if at < len(window.ids) and window.ids[at] == message_id:
            return True, as_fetched(window.messages[at])
        inside = bool(window.ids) and message_id > window.ids[0]
        return inside or window.complete, None

    # ---- what the gateway says -----------------------------------------------------------

    def saw(self, message: discord.Message) -> None:
        """MESSAGE_CREATE (`on_message`, the bot's own messages too)."""
        channel_id = message.channel.id
        self._count(channel_id)
        window = self._windows.get(channel_id)
        if window is None:
            return
        self._windows.move_to_end(channel_id)
        at = bisect.bisect_left(window.ids, message.id)
        if at < len(window.ids) and window.ids[at] == message.id:
            window.messages[at] = message
            return
        if at == 0 and window.ids and not window.complete:
            return  # older than the window: a fetch of the latest would not reach it
        window.ids.insert(at, message.id)
        window.messages.insert(at, message)
        if len(window.ids) > self.messages_per_channel:
            del window.ids[0], window.messages[0]
            window.complete = False

    def edited(self, payload: discord.RawMessageUpdateEvent) -> None:
        """MESSAGE_UPDATE: the held message becomes the update (Discord sends the whole
        message); an edit the window cannot place drops it."""
        self._count(payload.channel_id)
        window = self._windows.get(payload.channel_id)
        if window is None:
            return
        if _replies_to(window, {payload.message_id}):
            self.forget(payload.channel_id)  # a read shows the replies' parent edited
            return
        at = bisect.bisect_left(window.ids, payload.message_id)
        if at < len(window.ids) and window.ids[at] == payload.message_id:
            data: dict[str, Any] = dict(payload.data)
            if "content" not in data or "author" not in data:
                self.forget(payload.channel_id)  # a partial update: what changed is unknown
                return
            updated = payload.message
            if "reactions" not in data:
                updated.reactions = window.messages[at].reactions
            window.messages[at] = updated
        elif at > 0 or window.complete:
            self.forget(payload.channel_id)  # in the window's span, yet not held: unknown

    def deleted(self, channel_id: int, message_ids: set[int]) -> None:
        """MESSAGE_DELETE and MESSAGE_DELETE_BULK."""
        self._count(channel_id)
        window = self._windows.get(channel_id)
        if window is None:
            return
        if _replies_to(window, message_ids):
            self.forget(channel_id)  # a read shows the replies' parent as deleted (null)
            return
        kept = [i for i, message_id in enumerate(window.ids) if message_id not in message_ids]
        window.ids = [window.ids[i] for i in kept]
        window.messages = [window.messages[i] for i in kept]

    def forget(self, channel_id: int) -> None:
        """The window can no longer be known whole (a reaction, an unknown edit)."""
        self._count(channel_id)
        self._windows.pop(channel_id, None)

    def never_written(self, channel: discord.abc.GuildChannel | discord.Thread) -> None:
        """A channel Discord says has never had a message (`last_message_id` null in
        GUILD_CREATE or CHANNEL_CREATE), and no message event seen for it: an empty,
        complete window."""
        if getattr(channel, "last_message_id", 0) is not None or channel.id in self._events:
            return
        self._hold(channel.id, _Window([], [], complete=True, epoch=self._gaps.epoch))

    def _hold(self, channel_id: int, window: _Window) -> None:
        if len(window.ids) > self.messages_per_channel:
            del window.ids[:-self.messages_per_channel], \
                window.messages[:-self.messages_per_channel]
            window.complete = False
        self._windows[channel_id] = window
        self._windows.move_to_end(channel_id)
        while len(self._windows) > self.max_channels:
            self._windows.popitem(last=False)

    def _count(self, channel_id: int) -> None:
        self._events[channel_id] = self._events.get(channel_id, 0) + 1

    # ---- wiring --------------------------------------------------------------------------

    def attach(self) -> None:
        """Listen to the client's message, reaction and channel events (`saw` is the bot's
        `on_message`'s to call, which discord.py gives one handler)."""
        client = self._client

        async def on_raw_message_edit(payload: discord.RawMessageUpdateEvent) -> None:
            self.edited(payload)

        async def on_raw_message_delete(payload: discord.RawMessageDeleteEvent) -> None:
            self.deleted(payload.channel_id, {payload.message_id})

        async def on_raw_bulk_message_delete(
                payload: discord.RawBulkMessageDeleteEvent) -> None:
            self.deleted(payload.channel_id, set(payload.message_ids))

        async def on_raw_reaction(payload: Any) -> None:
            self.forget(payload.channel_id)

        async def on_guild_available(guild: discord.Guild) -> None:
            for channel in [*guild.channels, *guild.threads]:
                if not isinstance(channel, discord.Thread):  # a thread opens with its starter
                    self.never_written(channel)

        async def on_guild_channel_create(channel: discord.abc.GuildChannel) -> None:
            self.never_written(channel)

        for handler in (on_raw_message_edit, on_raw_message_delete,
                        on_raw_bulk_message_delete, on_guild_available, on_guild_channel_create):
            client.event(handler)
        for event in ("on_raw_reaction_add", "on_raw_reaction_remove", "on_raw_reaction_clear",
                      "on_raw_reaction_clear_emoji"):
            setattr(client, event, on_raw_reaction)
        client.on_guild_join = on_guild_available  # type: ignore[attr-defined]


def as_fetched(message: discord.Message) -> discord.Message:
    """`message` as a REST read would give it: a fetched message carries no member, so
    discord.py makes its author (and each user mentioned) the member it has cached, or else
    the plain user."""
    guild = message.guild
    if guild is None:
        return message
    fetched = copy.copy(message)
    fetched.author = _as_fetched_user(guild, message.author)
    fetched.mentions = [_as_fetched_user(guild, user) for user in message.mentions]
    return fetched


def _as_fetched_user(guild: discord.Guild,
                     user: discord.User | discord.Member) -> discord.User | discord.Member:
    member = guild.get_member(user.id)
    if member is not None:
        return member
    return user._user if isinstance(user, discord.Member) else user


def _replies_to(window: _Window, message_ids: set[int]) -> bool:
    """Whether a held message replies to one of `message_ids`: its `referenced_message`, as
    a read returns it, changes with that message."""
    return any(m.reference is not None and m.reference.message_id in message_ids
               for m in window.messages)


def _channel_id(channel: discord.abc.Messageable) -> int:
    channel_id = getattr(channel, "id", None)
    if not isinstance(channel_id, int):
        raise TypeError(f"a channel with an id, not {type(channel).__name__}")
    return channel_id
