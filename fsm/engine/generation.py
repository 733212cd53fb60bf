"""The generation turn (G1, G2): a chain of model attempts around the tool loop.

Each attempt is one run of the turn machine with its own provider. While another attempt
remains, errors are suppressed to the user (timeout notices are deferred, S12); a fallback
continues from the text already delivered (a continuation prefill, S1) and is told which tool
calls the earlier attempt already completed. If every attempt fails, the first deferred
timeout notice is posted, once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .channel import Notice, NoticeKind, TurnChannel
from .config import TurnConfig
from .locks import ChannelLock, ChannelLockRegistry
from .prefill import TurnRequest
from .provider import HistoryEntry, Provider
from .result import TurnResult, TurnStatus
from .stash import ContextStash
from .tools import ToolRegistry
from .turn import Turn, TurnObserver

log = logging.getLogger(__name__)

_FALLBACK_STATUSES = frozenset({"error", "timeout", "empty_response"})


@dataclass(frozen=True, slots=True)
class Attempt:
    """One model of the chain: the provider to call and a label for logs and journals."""

    provider: Provider
    label: str


@dataclass(slots=True)
class GenerationResult:
    status: TurnStatus
    attempts: list[TurnResult]
    labels: list[str]
    text: str
    delivered_text: str
    notices: list[str] = field(default_factory=list)
    deferred_notice_posted: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "text": self.text,
            "delivered_text": self.delivered_text,
            "notices": list(self.notices),
            "deferred_notice_posted": self.deferred_notice_posted,
            "attempts": [{"label": label, **result.as_dict()}
                         for label, result in zip(self.labels, self.attempts, strict=True)],
        }


def should_fall_back(result: TurnResult) -> bool:
    """A failure of the model itself (error, timeout, empty answer in its own pass) moves on
    to the next attempt; tool-loop failures, the iteration cap, a kill or a follow-up do not,
    since another model would meet the same tools or the same user."""
    if result.status not in _FALLBACK_STATUSES or not result.passes:
        return False
    return result.passes[-1].status == result.status


def completed_calls_notice(calls: list[dict[str, Any]]) -> str:
    """A request-only notice naming tool calls an earlier attempt already completed."""
    shown = "; ".join(
        f"{call['name']}({json.dumps(call['arguments'], ensure_ascii=False, sort_keys=True)})"
        for call in calls
    )
    return (f"[System: an earlier attempt already completed these tool calls: {shown}. "
            "Their results are in the history; do not call them again.]")


def _continuation(request: TurnRequest, delivered: str, turn: Turn) -> TurnRequest:
    """The next attempt's request: the original context (no injected media, R10), the
    successful ordinary calls replayed, and the delivered text as the prefill."""
    replayed = [entry for entry in turn.function_history if entry.success]
    notices = list(request.request_notices)
    if turn.replayable_calls:
        notices.append(completed_calls_notice(turn.replayable_calls))
    history: list[HistoryEntry] = list(request.function_history) + [
        entry for entry in replayed if entry not in request.function_history
    ]
    return replace(request, prefill=request.prefill + delivered, request_notices=notices,
                   function_history=history)


async def run_generation_turn(
    attempts: Sequence[Attempt],
    *,
    channel: TurnChannel,
    locks: ChannelLockRegistry,
    lock: ChannelLock,
    request: TurnRequest,
    config: TurnConfig | None = None,
    tools: ToolRegistry | None = None,
    stash: ContextStash | None = None,
    observer: TurnObserver | None = None,
    on_attempt: Callable[[Turn], None] | None = None,
) -> GenerationResult:
    """Try each attempt in order until one does not fail (G1); post the deferred notice
    if all fail (G2). `on_attempt` sees each attempt's turn before it runs (to route a
    follow-up to it, or to journal it)."""
    if not attempts:
        raise ValueError("a generation turn needs at least one attempt")
    base = config if config is not None else TurnConfig()
    results: list[TurnResult] = []
    labels: list[str] = []
    notices: list[str] = []
    deferred: NoticeKind | None = None
    delivered = ""
    current = request
    for index, attempt in enumerate(attempts):
        last = index == len(attempts) - 1
        attempt_config = base.model_copy(update={"fallback_pending": not last})
        turn = Turn(provider=attempt.provider, channel=channel, locks=locks, lock=lock,
                    request=current, tools=tools, stash=stash, config=attempt_config,
                    observer=observer, turn_id=f"{lock.owner}-{attempt.label}")
        if on_attempt is not None:
            on_attempt(turn)
        result = await turn.run()
        results.append(result)
        labels.append(attempt.label)
        notices.extend(result.notices)
        delivered += result.delivered_text
        if deferred is None and result.deferred_notice is not None:
            deferred = result.deferred_notice
        if last or not should_fall_back(result):
            break
        log.warning("attempt %s ended %s; falling back to %s", attempt.label, result.status,
                    attempts[index + 1].label)
        current = _continuation(current, result.delivered_text, turn)
    final = results[-1]
    posted: str | None = None
    all_failed = should_fall_back(final) and len(results) == len(attempts)
    final_posted_timeout = any(n.startswith("timeout_") for n in final.notices)
    if all_failed and deferred is not None and not final_posted_timeout \
            and base.surface_user_errors:
        try:
            await channel.post_notice(Notice.of(deferred))
        except Exception as exc:
            log.warning("deferred notice could not be posted: %s", type(exc).__name__)
        else:
            posted = deferred
            notices.append(deferred)
    return GenerationResult(status=final.status, attempts=results, labels=labels,
                            text=final.text, delivered_text=delivered, notices=notices,
                            deferred_notice_posted=posted)
