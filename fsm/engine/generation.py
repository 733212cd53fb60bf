"""The generation turn (G1-G3): a chain of model attempts around the tool loop.

Each attempt is one run of the turn machine with its own provider. While another attempt
remains, errors are suppressed to the user (timeout notices are deferred, S12); a fallback
continues from the text already delivered (a continuation prefill, S1) and is told which tool
calls the earlier attempt already completed — or, with `superseded_output: delete`, the
failed attempt's messages are deleted and the fallback answers in full. A destination that
refuses the send ends the chain (G3). If every attempt fails, the turn posts one notice for
why the last one failed: its deferred timeout notice, or one naming the failure's kind (G2).
What the whole reply may deliver is bounded across its attempts (D5).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .channel import ERROR_NOTICES, Notice, NoticeKind, TurnChannel
from .config import TurnConfig
from .failures import NOTICE_BY_FAILURE, FailureKind, turn_failure
from .locks import ChannelLock, ChannelLockRegistry
from .prefill import TurnRequest
from .provider import HistoryEntry, Provider
from .result import TurnResult, TurnStatus
from .stash import ContextStash
from .thoughts import publish_thoughts
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
    failure_notice_posted: str | None = None
    superseded_deleted: int = 0
    """Messages of failed attempts deleted before a fallback answered in full."""
    thoughts_sent_to: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "text": self.text,
            "delivered_text": self.delivered_text,
            "notices": list(self.notices),
            "deferred_notice_posted": self.deferred_notice_posted,
            "failure_notice_posted": self.failure_notice_posted,
            "superseded_deleted": self.superseded_deleted,
            "thoughts_sent_to": self.thoughts_sent_to,
            "attempts": [{"label": label, **result.as_dict()}
                         for label, result in zip(self.labels, self.attempts, strict=True)],
        }


def failure_of(result: TurnResult) -> FailureKind | None:
    """What ended the attempt: the turn's own account, else read from its status and its
    last pass's provider error."""
    if result.failure is not None:
        return result.failure
    error = result.passes[-1].error if result.passes else None
    return turn_failure(result.status, error, None)


def should_fall_back(result: TurnResult) -> bool:
    """A failure of the model itself (error, timeout, empty answer in its own pass) moves on
    to the next attempt; tool-loop failures, the iteration cap, a kill or a follow-up do not,
    since another model would meet the same tools or the same user. A destination that
    refuses the send is not the model's failure: no other model can deliver there (G3)."""
    if failure_of(result) == "destination_unavailable":
        return False
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
    successful ordinary calls replayed, and the delivered text as the prefill. The replayed
    calls carry no pre-tool text: it is part of the delivered text, which the prefill
    carries (folded into the first call's turn, S1), and must not be shown twice."""
    replayed = [replace(entry, pre_tool_text="") for entry in turn.function_history
                if entry.success]
    notices = list(request.request_notices)
    if turn.replayable_calls:
        notices.append(completed_calls_notice(turn.replayable_calls))
    known = [(e.tool_name, e.arguments, e.result, e.call_id) for e in request.function_history]
    history: list[HistoryEntry] = list(request.function_history) + [
        entry for entry in replayed
        if (entry.tool_name, entry.arguments, entry.result, entry.call_id) not in known
    ]
    return replace(request, prefill=request.prefill + delivered, request_notices=notices,
                   function_history=history)


def _turn_id(owner: str, label: str, occurrence: int) -> str:
    """An attempt's turn id, unique within its chain even when two attempts share a label
    (one model behind two endpoints): journals are named by it, tool batches derive from it."""
    return f"{owner}-{label}" if occurrence == 1 else f"{owner}-{label}#{occurrence}"


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
    """Try each attempt in order until one does not fail (G1); if all fail, post the one
    notice for why the last failed (G2). `on_attempt` sees each attempt's turn before it
    runs (to route a follow-up to it, or to journal it)."""
    if not attempts:
        raise ValueError("a generation turn needs at least one attempt")
    base = config if config is not None else TurnConfig()
    results: list[TurnResult] = []
    labels: list[str] = []
    notices: list[str] = []
    deferred: NoticeKind | None = None
    delivered = ""
    deleted = 0
    current = request
    seen: Counter[str] = Counter()
    for index, attempt in enumerate(attempts):
        seen[attempt.label] += 1
        last = index == len(attempts) - 1
        budget = max(1, base.max_delivered_chars - len(delivered))
        attempt_config = base.model_copy(update={"fallback_pending": not last,
                                                 "max_delivered_chars": budget})
        turn = Turn(provider=attempt.provider, channel=channel, locks=locks, lock=lock,
                    request=current, tools=tools, stash=stash, config=attempt_config,
                    observer=observer, turn_id=_turn_id(lock.owner, attempt.label,
                                                        seen[attempt.label]))
        if on_attempt is not None:
            on_attempt(turn)
        result = await turn.run()
        results.append(result)
        labels.append(attempt.label)
        notices.extend(result.notices)
        delivered += result.delivered_text
        deferred = result.deferred_notice  # each attempt clears an earlier one's (G2)
        if failure_of(result) == "destination_unavailable":
            log.warning("attempt %s: the channel refuses the send; no fallback", attempt.label)
        if last or not should_fall_back(result):
            break
        log.warning("attempt %s ended %s; falling back to %s", attempt.label, result.status,
                    attempts[index + 1].label)
        shown = result.delivered_text
        if base.superseded_output == "delete" and delivered:
            removed = await _delete_superseded(channel)
            if removed is not None:
                deleted += removed
                delivered = shown = ""
                current = replace(current, prefill=request.prefill)
        if len(delivered) >= base.max_delivered_chars:
            break  # the reply delivered all it may: a fallback could only go past it (D5)
        current = _continuation(current, shown, turn)
    final = results[-1]
    outcome = GenerationResult(status=final.status, attempts=results, labels=labels,
                               text=final.text, delivered_text=delivered, notices=notices,
                               superseded_deleted=deleted)
    if base.surface_user_errors:
        await _final_notice(channel, base, outcome, deferred)
    owner = request.owner
    thoughts = [text for r in results for text in r.thoughts.get("log", [])]
    outcome.thoughts_sent_to = await publish_thoughts(base, owner, thoughts, channel)
    return outcome


async def _delete_superseded(channel: TurnChannel) -> int | None:
    """Delete what the failed attempts delivered (item of `superseded_output: delete`), so
    the fallback answers in full. None when the channel cannot, or not all of it: then the
    fallback continues from what is still shown (G1)."""
    cleanup = getattr(channel, "cleanup", None)
    if cleanup is None:
        return None
    try:
        removed = await cleanup()
    except Exception as exc:
        log.warning("superseded messages could not all be deleted (%s); the fallback "
                    "continues from them", type(exc).__name__)
        return None
    return int(removed)


async def _final_notice(channel: TurnChannel, config: TurnConfig, outcome: GenerationResult,
                        deferred: NoticeKind | None) -> None:
    """One notice for the reply's outcome, at most (G2): when the chain failed and its last
    attempt posted no error notice of its own, the one naming why that last attempt failed —
    its deferred timeout notice (S12) when it timed out, else one naming the failure's kind;
    or, when asked for, a line saying a fallback answered. A dead destination gets none:
    there is nowhere to post it (G3)."""
    final = outcome.attempts[-1]
    if any(kind in ERROR_NOTICES for kind in final.notices):
        return
    notice: NoticeKind | None = None
    failure = failure_of(final)
    if failure is not None and failure != "destination_unavailable":  # the chain has ended
        if failure == "timeout":
            notice = deferred
        else:
            notice = NOTICE_BY_FAILURE.get(failure, "failed_other")
    elif final.status == "completed" and len(outcome.attempts) > 1 and config.announce_fallback:
        notice = "answered_by_fallback"
    if notice is None:
        return
    try:
        await channel.post_notice(Notice.of(notice))
    except Exception as exc:
        log.warning("the %s notice could not be posted: %s", notice, type(exc).__name__)
        return
    outcome.notices.append(notice)
    if notice == deferred:
        outcome.deferred_notice_posted = notice
    else:
        outcome.failure_notice_posted = notice
