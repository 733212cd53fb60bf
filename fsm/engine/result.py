"""What a pass and a turn report (S13, T8)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .channel import NoticeKind
from .failures import FailureKind

TurnStatus = Literal[
    "completed", "function_call", "error", "timeout", "stopped_by_user", "empty_response",
    "follow_up_interrupt", "delivery_cap",
]


@dataclass(slots=True)
class PassResult:
    """One provider pass: its status and everything that had arrived when it ended. `text`
    is the visible text (what the channel was handed); `details` the bodies of the
    `<details>` blocks the model wrote, taken out of it (T8); `reasoning` its thinking."""

    index: int
    status: TurnStatus = "completed"
    text: str = ""
    details: str = ""
    reasoning: str = ""
    tool_calls: list[str] = field(default_factory=list)
    usage: dict[str, int] | None = None
    finish_reason: str | None = None
    error: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "status": self.status, "text": self.text}
        if self.details:
            out["details"] = self.details
        if self.reasoning:
            out["reasoning"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = list(self.tool_calls)
        if self.usage is not None:
            out["usage"] = dict(self.usage)
        if self.finish_reason is not None:
            out["finish_reason"] = self.finish_reason
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass(slots=True)
class TurnResult:
    """The turn's outcome, in the journal's `result` shape (docs/scenarios.md) plus T8 extras:
    `text` is the final visible text with the `<details>` suffix merged; `failure` names
    what kind of failure ended it, if one did (G2, G3)."""

    status: TurnStatus
    state: str
    text: str
    passes: list[PassResult]
    consecutive_tool_errors: int
    flags: dict[str, bool]
    function_history: list[str]
    context_items_added: int
    stash_items: int
    reactor_lookups: int
    notices: list[str]
    deferred_notice: NoticeKind | None
    metrics: list[dict[str, Any]]
    delivered_text: str = ""
    error: str | None = None
    thoughts: dict[str, Any] = field(default_factory=dict)
    review_log: list[dict[str, Any]] = field(default_factory=list)
    follow_up_queued: bool = False
    failure: FailureKind | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "state": self.state,
            "text": self.text,
            "passes": len(self.passes),
            "consecutive_tool_errors": self.consecutive_tool_errors,
            "flags": dict(self.flags),
            "function_history": list(self.function_history),
            "context_items_added": self.context_items_added,
            "stash_items": self.stash_items,
            "reactor_lookups": self.reactor_lookups,
            "notices": list(self.notices),
            "deferred_notice": self.deferred_notice,
            "metrics": [dict(m) for m in self.metrics],
            "delivered_text": self.delivered_text,
            "error": self.error,
            "follow_up_queued": self.follow_up_queued,
            "failure": self.failure,
            "pass_results": [p.as_dict() for p in self.passes],
            "thoughts": dict(self.thoughts),
            "review_log": [dict(r) for r in self.review_log],
        }
