"""What the engine needs from the place a turn replies in: delivery, notices, reactor
look-ups. The in-memory channel (scenarios, demo) and the Discord channel implement it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

NoticeKind = Literal[
    "timeout_first_token", "timeout_idle", "still_working", "tool_error_loop", "max_iterations",
    "failed_context_too_long", "failed_unreachable", "failed_rejected_key",
    "failed_rate_limited", "failed_blocked", "failed_empty_reply", "failed_other",
    "delivery_cap", "answered_by_fallback",
]
ERROR_NOTICES: frozenset[str] = frozenset({
    "timeout_first_token", "timeout_idle", "tool_error_loop", "max_iterations",
    "failed_context_too_long", "failed_unreachable", "failed_rejected_key",
    "failed_rate_limited", "failed_blocked", "failed_empty_reply", "failed_other",
    "delivery_cap",
})
"""The notices that tell the user a reply failed or was cut: a turn posts at most one (G2)."""

NOTICE_TEXT: dict[NoticeKind, tuple[str, str]] = {
    "timeout_first_token": (
        "No response from the model",
        "The model never started answering, so I stopped waiting. Please try again.",
    ),
    "timeout_idle": (
        "The model went quiet",
        "The model stopped sending text partway through, so I stopped waiting.",
    ),
    "still_working": ("Still working", "This is taking many steps; I'm still on it."),
    "tool_error_loop": (
        "Tools keep failing",
        "Several tool calls in a row failed, so I stopped this reply.",
    ),
    "max_iterations": (
        "Too many steps",
        "This reply reached its step limit, so I stopped it here.",
    ),
    "failed_context_too_long": (
        "Conversation too long",
        "The conversation is too long for the model to read, so it could not answer.",
    ),
    "failed_unreachable": (
        "Model unreachable",
        "I could not reach the model right now. Please try again in a little while.",
    ),
    "failed_rejected_key": (
        "Model access refused",
        "The model refused the bot's API key, so it could not answer. The bot's operator "
        "needs to check it.",
    ),
    "failed_rate_limited": (
        "Rate limited",
        "The model is rate limiting the bot right now. Please try again in a little while.",
    ),
    "failed_blocked": (
        "Reply blocked",
        "The model's safety filter blocked this reply.",
    ),
    "failed_empty_reply": (
        "Empty reply",
        "The model answered with nothing. Please try again.",
    ),
    "failed_other": (
        "Reply failed",
        "Something went wrong while answering, so I stopped this reply.",
    ),
    "delivery_cap": (
        "Reply too long",
        "This reply reached its length limit, so I stopped it here.",
    ),
    "answered_by_fallback": (
        "Fallback model",
        "The main model failed; a fallback model answered.",
    ),
}


class DestinationUnavailable(Exception):
    """The channel refuses the send for the destination itself (no access, no permission,
    the channel is gone): no attempt can deliver there, so the chain stops (G3)."""


class DeliveryCapReached(Exception):
    """The channel cut the reply at its message bound (D5): the turn ends, nothing more is
    sent."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A user-facing notice; Discord renders it as an embed."""

    kind: NoticeKind
    title: str
    description: str

    @classmethod
    def of(cls, kind: NoticeKind) -> Notice:
        title, description = NOTICE_TEXT[kind]
        return cls(kind=kind, title=title, description=description)


class TurnChannel(Protocol):
    """The channel a turn replies in.

    A channel that buffers may also expose `delivered_text: str`, everything it has really
    sent so far; the turn then reports that, not what it handed over, as delivered (D2). A
    channel may also offer `async cleanup() -> int` (delete what it delivered, for
    `superseded_output: delete`, G1) and `async post_thoughts(channel_id, owner, text)`
    (the thought log's channel destination, T8); the generation turn uses them when they
    exist. A send refused for the destination itself raises `DestinationUnavailable` (G3);
    a channel that bounds the reply in messages raises `DeliveryCapReached` (D5)."""

    async def deliver(self, text: str) -> None:
        """Stream visible text to the channel (may buffer to natural boundaries)."""

    async def finish_pass(self) -> None:
        """A pass ended: flush whatever text is buffered."""

    def discard_unsent(self) -> None:
        """The turn ended with its pass cut short (stopped, failed, or a timed-out pass that
        could not flush within the settle budget): drop the text handed over but not yet on
        its way to the user. It is in no continuation (G1), so sending it later, or with a
        fallback's answer, would show text twice or out of place. A send already on the wire
        is not dropped: it may still land (S10)."""

    async def post_notice(self, notice: Notice) -> None:
        """Post a user-facing notice."""

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        """Names of the users who reacted with `emoji` on `message_id` (one REST call)."""
        ...
