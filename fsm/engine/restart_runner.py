"""The restart half of the loop (R1-R10): the restart a tool asked for, resolving its item
from either transport, the message-metadata reveal's reactor look-ups under their budget, and
applying the enrichment to the conversation.

Like the tool runner it never fires a trigger: the driver asks it what to fire. Its worker
(the look-ups) posts to the driver's mailbox.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

from .channel import TurnChannel
from .clock import reading
from .config import TurnConfig
from .conversation import Conversation
from .events import RestartReady, TurnEvent, WorkerCrashed
from .locks import ChannelLock, ChannelLockRegistry
from .mailbox import Mailbox
from .metadata import (
    LookupBudget,
    LookupProgress,
    ReactorSource,
    annotate,
    fetch_reactors,
    neutralize,
    tail_directive,
)
from .provider import ToolCallRequest
from .recording import InputRecorder
from .restart import METADATA_TAIL_DIRECTIVE, RestartRequest, resolve_item
from .stash import ContextStash
from .tasks import Work
from .tool_runner import Verdict
from .tools import ToolResult

log = logging.getLogger(__name__)


class RestartRunner:
    """Holds the restart between the request and its application, and runs its look-ups."""

    def __init__(
        self,
        *,
        config: TurnConfig,
        channel: TurnChannel,
        mailbox: Mailbox[TurnEvent],
        turn_id: str,
        clock: Callable[[], float],
        locks: ChannelLockRegistry,
        lock: ChannelLock,
        spawn: Callable[[Work, str], asyncio.Task[None]],
    ) -> None:
        self.recorder: InputRecorder | None = None
        """Where the reveal's look-ups are recorded, with their timing (the turn sets it)."""
        self._config = config
        self._locks = locks
        self._lock = lock
        self._channel = channel
        self._mailbox = mailbox
        self._turn_id = turn_id
        self._clock = clock
        self._spawn = spawn
        self._seq = itertools.count(1)
        self._no = 0
        self._lookups = LookupProgress()
        self._task: asyncio.Task[None] | None = None
        self.pending: RestartRequest | None = None
        self.call: ToolCallRequest | None = None
        self.deadline: float | None = None
        self.started = False
        self.context_items_added = 0
        self.reactor_lookups = 0

    def busy(self) -> bool:
        """Reactor look-ups are still running (none may outlive the turn, S14)."""
        return self._task is not None and not self._task.done()

    def requested(self, restart: RestartRequest, call: ToolCallRequest, result: ToolResult,
                  pre_tool_text: str, conversation: Conversation) -> dict[str, Any] | None:
        """Hold the restart until it is applied. Its call has no history entry (R1), so its
        pre-tool text is named to the next passes instead (T7); with drafting on, the
        review log keeps the call and its result (R10): the entry is returned."""
        self.pending = restart
        self.call = call
        self.started = False
        if pre_tool_text:
            conversation.turn_notices.append(already_sent_notice(pre_tool_text))
        if not self._config.drafting:
            return None
        return {"call": call.name, "arguments": call.arguments,
                "result": without_stash_key(result.for_model()), "pre_tool_text": pre_tool_text}

    def begin(self, context_items: list[dict[str, Any]], stash: ContextStash) -> Verdict | None:
        """Resolve the item (R2-R5), or start the reactor look-ups of a metadata reveal (R6).
        Returns what to fire now, or None when the look-ups started."""
        restart = self.pending
        assert restart is not None
        self.started = True
        self._no = next(self._seq)
        if restart.kind == "message_metadata":
            self.deadline = self._clock() + self._config.tool_timeout_s
            self._lookups = LookupProgress()
            source = TimedLookups(self._channel, self._clock(), self.recorder)
            work = self._metadata_worker(self._no, self._lookups, context_items, source)
            self._task = self._spawn(work, f"{self._turn_id}-metadata")
            return None
        return ("restart", resolve_item(restart, stash))

    def ready(self, event: RestartReady) -> bool:
        """The look-ups' result belongs to the restart running now."""
        return event.restart_no == self._no

    def timed_out(self, context_items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """Reactor look-ups that never answer do not hold the turn: past the tool budget
        the reveal goes on with the names found so far and reaction counts for the rest,
        the calls made counted (R6)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()  # the turn's task group awaits it
        log.warning("turn %s: reactor look-ups timed out; revealing with what was found",
                    self._turn_id)
        found = self._lookups
        items = annotate(context_items, found.reactors, self._config.metadata_recent_messages)
        return items, found.lookups

    async def _metadata_worker(self, restart_no: int, progress: LookupProgress,
                               context_items: list[dict[str, Any]],
                               source: TimedLookups) -> None:
        """Reactor look-ups (sequential REST calls, bounded) and the annotated items (R6).
        They run under the lock's watchdog like a tool (S6): a slow but healthy reveal is
        not released as a stale lock; its own budget is the tool timeout."""
        cfg = self._config
        budget = LookupBudget(per_turn=cfg.reactor_lookups_per_turn,
                              per_message=cfg.reactor_lookups_per_message,
                              per_reaction=cfg.reactors_per_reaction)
        try:
            with self._locks.watchdog(self._lock):
                reactors, lookups = await fetch_reactors(
                    context_items, source, budget, cfg.metadata_recent_messages, progress)
            items = annotate(context_items, reactors, cfg.metadata_recent_messages)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._mailbox.post(WorkerCrashed(exc))
            return
        # Ready when the last look-up answered: annotating takes no time on the turn's clock,
        # as in replay.
        self._mailbox.post(RestartReady(restart_no, (items, lookups)), source.answered_at)

    def apply(self, payload: Any, conversation: Conversation) -> dict[str, Any] | None:
        """Apply the enrichment and set its flag (R6-R8); with drafting on, the review log's
        continuation message is returned (R10)."""
        restart = self.pending
        assert restart is not None
        if restart.kind == "message_metadata":
            items, lookups = payload if isinstance(payload, tuple) else (None, 0)
            self.reactor_lookups += lookups
            if items is not None:
                conversation.context_items = items
            conversation.context_items.append(tail_directive(METADATA_TAIL_DIRECTIVE))
            self.context_items_added += 1
        elif payload is not None:
            conversation.context_items.append(payload)
            self.context_items_added += 1
        if restart.enrichment is not None:
            conversation.flags.disable(restart.enrichment)
        call = self.call
        self._applied()
        if self._config.drafting and call is not None:
            return {"continuation": f"[System: {call.name} added context; continue the reply.]"}
        return None

    def _applied(self) -> None:
        """The restart edge was taken: nothing of this restart stays."""
        self.pending = None
        self.call = None
        self._task = None
        self.deadline = None
        self.started = False


def without_stash_key(result: dict[str, Any]) -> dict[str, Any]:
    """A result as the review log keeps it: the live stash key is a one-time random token
    that means nothing once drained (R4), so it is not kept."""
    data = result.get("data")
    if isinstance(data, dict) and "pending_context_key" in data:
        return {**result, "data": {**data, "pending_context_key": "<stashed>"}}
    return result


def already_sent_notice(text: str) -> str:
    """Visible text streamed before a restart call, which has no history entry to carry it
    (R10, drafting off): the next passes are told it was sent, so it is not repeated (T7)."""
    return f"[System: this reply already began with the text below; continue it without " \
           f"repeating it.]\n{neutralize(text)}"


class TimedLookups:
    """The channel's reactor look-ups, timed on the turn's clock: they run back to back from
    the moment the reveal began, so each one's duration is the time since the one before
    answered, and the reveal is ready when the last one answered. With a recorder, each is
    recorded with its duration and answer, so a live reveal replays at the same microseconds
    with the same names (docs/scenarios.md); one cut off by the reveal's budget or a kill is
    recorded as never answering."""

    def __init__(self, channel: ReactorSource, began_at: float,
                 recorder: InputRecorder | None) -> None:
        self._channel = channel
        self._recorder = recorder
        self.answered_at = began_at

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        asked: dict[str, Any] = {"message_id": message_id, "emoji": emoji}
        try:
            names = await self._channel.fetch_reactors(message_id, emoji, limit)
        except asyncio.CancelledError:
            self._record({**asked, "hang": True})
            raise
        except Exception as exc:
            self._record({**asked, "after": self._answered(), "error_type": type(exc).__name__})
            raise
        self._record({**asked, "after": self._answered(), "users": [str(n) for n in names]})
        return names

    def _answered(self) -> float:
        """The time since the previous answer (or the reveal's start), and now the last."""
        now = reading()
        after, self.answered_at = now - self.answered_at, now
        return after

    def _record(self, lookup: dict[str, Any]) -> None:
        if self._recorder is not None:
            self._recorder.on_lookup(lookup)
