"""What the engine needs from the place a turn replies in: delivery, notices, reactor
look-ups. The in-memory channel (scenarios, demo) and the Discord channel implement it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

NoticeKind = Literal[
    "timeout_first_token", "timeout_idle", "still_working", "tool_error_loop", "max_iterations"
]

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
}


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
    sent so far; the turn then reports that, not what it handed over, as delivered (D2)."""

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
