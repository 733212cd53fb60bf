"""What a turn reports (S13, T8): its status and error, the notices it posted or deferred,
its metrics, its passes and the text they delivered, and its journal of transitions.

The driver and its callbacks write here; nothing here moves the machine. The turn's result
is read from it once the turn has ended.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .channel import Notice, NoticeKind, TurnChannel
from .config import TurnConfig
from .details import details_suffix
from .failures import turn_failure
from .result import PassResult, TurnResult, TurnStatus

log = logging.getLogger(__name__)


@dataclass(slots=True)
class TurnLedger:
    """The turn's account of itself, as its result and journal give it."""

    status: TurnStatus | None = None
    error: str | None = None
    crash: BaseException | None = None
    notices: list[str] = field(default_factory=list)
    """The kinds of the notices actually posted, in order."""
    outbox: list[Notice] = field(default_factory=list)
    """Notices queued by a callback, posted by the driver after the transition."""
    deferred_notice: NoticeKind | None = None
    still_working_sent: bool = False
    metrics: list[dict[str, Any]] = field(default_factory=list)
    passes: list[PassResult] = field(default_factory=list)
    final_text: str = ""
    delivered: list[str] = field(default_factory=list)
    """The text each pass handed the channel (when the channel keeps no account)."""
    channel_mark: int = 0
    """How much the channel had delivered before this turn began."""
    review_log: list[dict[str, Any]] = field(default_factory=list)
    follow_up_queued: bool = False
    stop_requested_at: float | None = None
    """Seconds into the turn a stop was asked for: where kill latency counts from."""
    transitions: list[dict[str, Any]] = field(default_factory=list)
    internal_transitions: list[dict[str, Any]] = field(default_factory=list)

    # ------------------------------------------------------------- notices

    def notify(self, kind: NoticeKind, config: TurnConfig) -> None:
        """Queue a user-facing notice; with user errors off none is posted (G2)."""
        if config.surface_user_errors:
            self.outbox.append(Notice.of(kind))

    def timeout(self, phase: str, config: TurnConfig) -> None:
        """Metric, then the phase-aware notice, posted or deferred while a fallback is
        pending (S11-S13)."""
        self.metrics.append({"name": "stream_sdk_timeout", "phase": phase})
        kind: NoticeKind = "timeout_first_token" if phase == "first_token" else "timeout_idle"
        if config.surface_user_errors:
            if config.fallback_pending:
                self.deferred_notice = kind
            else:
                self.outbox.append(Notice.of(kind))
        self.status = "timeout"

    # ------------------------------------------------------------- passes

    def begin_pass(self, index: int, config: TurnConfig) -> int:
        """A pass begins: its result so far, and before the 21st call the still-working
        notice, once (T1: iteration index 20). Returns what the pass may still deliver
        (D5)."""
        chars_left = config.max_delivered_chars - sum(len(p.text) for p in self.passes)
        self.passes.append(PassResult(index=index, status="function_call"))
        if index - 1 == config.soft_warn_iteration and not self.still_working_sent:
            self.still_working_sent = True
            self.notify("still_working", config)
        return chars_left

    def close_pass(self, result: PassResult) -> None:
        self.passes[-1] = result
        self.final_text = result.text
        self.delivered.append(result.text)

    def delivered_text(self, channel: TurnChannel) -> str:
        """What reached the channel during this turn: the channel's own account when it
        keeps one (a Discord channel buffers, so accepting a chunk is not sending it),
        else the text every pass handed over (D2, G1)."""
        sent = channel_delivered(channel)
        if sent is not None:
            return sent[self.channel_mark:]
        return "".join(self.delivered)

    async def post_notices(self, channel: TurnChannel, turn_id: str) -> None:
        """Post what the callbacks queued; a notice that cannot be posted is logged, not
        counted as seen."""
        outbox = self.outbox
        while outbox:
            notice = outbox.pop(0)
            try:
                await channel.post_notice(notice)
            except Exception as exc:
                log.warning("turn %s: notice %s could not be posted: %s",
                            turn_id, notice.kind, type(exc).__name__)
                continue
            self.notices.append(notice.kind)

    # ------------------------------------------------------------- journal

    def record(self, t: float, trigger: str, source: str, dest: str) -> float:
        t = round(t, 6)
        self.transitions.append({"t": t, "event": trigger, "from": source, "to": dest})
        return t

    def record_internal(self, t: float, trigger: str, state: str) -> None:
        self.internal_transitions.append({"t": round(t, 6), "event": trigger, "state": state})

    # ------------------------------------------------------------- the result

    def result(self, state: str, channel: TurnChannel, *, owner: str, flags: dict[str, bool],
               function_history: list[str], consecutive_tool_errors: int,
               context_items_added: int, reactor_lookups: int,
               stash_items: int) -> TurnResult:
        """The turn's result, with what the runners and the conversation hold."""
        status: TurnStatus = self.status or "error"
        passes = self.passes
        last_error = passes[-1].error if passes else None
        return TurnResult(
            status=status,
            state=state,
            text=self.final_text + details_suffix([p.details for p in passes]),
            passes=list(passes),
            consecutive_tool_errors=consecutive_tool_errors,
            flags=flags,
            function_history=function_history,
            context_items_added=context_items_added,
            stash_items=stash_items,
            reactor_lookups=reactor_lookups,
            notices=list(self.notices),
            deferred_notice=self.deferred_notice,
            metrics=list(self.metrics),
            delivered_text=self.delivered_text(channel),
            error=self.error,
            thoughts={"owner": owner, "log": [p.reasoning for p in passes if p.reasoning]},
            review_log=list(self.review_log),
            follow_up_queued=self.follow_up_queued,
            failure=turn_failure(status, last_error, self.crash),
        )


def channel_delivered(channel: TurnChannel) -> str | None:
    """The channel's record of the text it actually delivered, if it keeps one."""
    text = getattr(channel, "delivered_text", None)
    return text if isinstance(text, str) else None
