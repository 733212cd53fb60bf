"""What a lost gateway session cost, said in the log.

A stalled event loop (a huge turn, a GC pause) misses heartbeats; Discord closes the
connection, and when the session has timed out meanwhile it refuses the RESUME: the client
identifies anew and the events dispatched in between — messages addressed to the bot among
them — are never delivered (Topics › Gateway › Resuming). discord.py recovers on its own;
`SessionGaps` makes the loss visible: a shard that comes back with a new session rather
than a resumed one logs the window whose events it lost.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass

import discord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SessionGap:
    """A window in which a shard's events were lost."""

    shard_id: int | None
    since: datetime.datetime
    until: datetime.datetime


class SessionGaps:
    """Watches a client's shards; `gaps` lists each window of lost events."""

    def __init__(self, client: discord.Client) -> None:
        self._client = client
        self._down: dict[int | None, datetime.datetime] = {}
        self._ready: set[int | None] = set()
        self.gaps: list[SessionGap] = []

    @property
    def epoch(self) -> int:
        """How many sessions were lost so far: what was learnt from events before a loss
        may be missing what came in the gap."""
        return len(self.gaps)

    @property
    def down(self) -> bool:
        """A shard is disconnected: its events wait for a RESUME, or are lost."""
        return bool(self._down)

    def disconnected(self, shard_id: int | None) -> None:
        self._down.setdefault(shard_id, discord.utils.utcnow())

    def resumed(self, shard_id: int | None) -> None:
        self._down.pop(shard_id, None)  # every event was replayed

    def ready(self, shard_id: int | None) -> None:
        """A new session: if the shard had one before, what came in between is lost."""
        since = self._down.pop(shard_id, None)
        if shard_id not in self._ready:
            self._ready.add(shard_id)
            return
        now = discord.utils.utcnow()
        gap = SessionGap(shard_id, since or now, now)
        self.gaps.append(gap)
        log.warning("shard %s: the gateway session was lost (RESUME refused) and a new one "
                    "started; events from %s to %s were not delivered, so messages sent then "
                    "get no answer", shard_id, gap.since.isoformat(timespec="seconds"),
                    gap.until.isoformat(timespec="seconds"))

    def client_ready(self) -> None:
        """The client's READY (`on_ready`, which the bot owns): a new session of a client
        without shards; a sharded client's shards say so themselves."""
        if not isinstance(self._client, discord.AutoShardedClient):
            self.ready(None)

    def attach(self) -> None:
        """Listen to the client's disconnects, resumes and (sharded) shard READYs."""
        client = self._client
        if not isinstance(client, discord.AutoShardedClient):
            async def on_disconnect() -> None:
                self.disconnected(None)

            async def on_resumed() -> None:
                self.resumed(None)

            client.event(on_disconnect)
            client.event(on_resumed)
            return

        async def on_shard_disconnect(shard_id: int) -> None:
            self.disconnected(shard_id)

        async def on_shard_resumed(shard_id: int) -> None:
            self.resumed(shard_id)

        async def on_shard_ready(shard_id: int) -> None:
            self.ready(shard_id)

        for handler in (on_shard_disconnect, on_shard_resumed, on_shard_ready):
            client.event(handler)
