"""The provider contract: what every streaming adapter gives the engine.

An adapter turns one provider call into an async stream of normalized events and honours an
abort signal. The engine owns the signal (one per pass, S3); the adapter must close its HTTP
request as soon as the signal fires and then end the stream without raising.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias

ErrorKind = Literal["provider_stream_error", "stall_timeout", "blocked", "http"]


class AbortSignal:
    """A one-shot signal that the engine fires to stop a pass (timeout, kill, teardown).

    Callbacks run synchronously when the signal fires, so an adapter can close its
    connection at once instead of waiting for its next read to notice.
    """

    __slots__ = ("_callbacks", "_fired", "_reason", "_waiter")

    def __init__(self) -> None:
        self._fired = False
        self._reason = ""
        self._callbacks: list[Callable[[], None]] = []
        self._waiter: asyncio.Future[None] | None = None

    @property
    def fired(self) -> bool:
        return self._fired

    @property
    def reason(self) -> str:
        return self._reason

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the signal fires (at once if it already has)."""
        if self._fired:
            callback()
        else:
            self._callbacks.append(callback)

    def remove_callback(self, callback: Callable[[], None]) -> None:
        if callback in self._callbacks:
            self._callbacks.remove(callback)

    def fire(self, reason: str = "aborted") -> None:
        if self._fired:
            return
        self._fired = True
        self._reason = reason
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        """Suspend until the signal fires."""
        if self._fired:
            return
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._waiter)


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Visible content. An empty delta is not a token (S4)."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Thinking text: kept apart from the visible reply, never delivered to the channel."""

    text: str


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """Liveness that is not content (SSE comments, pings); never counts as a first token."""

    detail: str = ""


@dataclass(frozen=True, slots=True)
class ReasoningState:
    """A provider's opaque reasoning for one model turn (Anthropic's signed thinking and
    redacted_thinking blocks, a Gemini thought signature, reasoning a host wants back with
    a tool call). The API requires it back, unchanged, with the calls that turn made (P5):
    the engine only carries it, from the call to the call's history entry. `origin` names
    the adapter and model that made it, since signatures are bound to their model; `items`
    are that adapter's own JSON, opaque to everyone else."""

    origin: str
    items: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    """One function call the model asked for, arguments fully parsed.

    `truncated` marks a call whose arguments never completed (e.g. a `max_tokens` stop):
    such a call must never run (T4). `reasoning` is the model turn's opaque reasoning
    state, on the call that must carry it back (the turn's first call, or each call of a
    Gemini turn that signed it).
    """

    name: str
    arguments: dict[str, Any]
    id: str | None = None
    truncated: bool = False
    raw_arguments: str = ""
    reasoning: ReasoningState | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as the provider reported them; `thoughts_tokens` counts reasoning that
    is billed but not part of the visible reply."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    thoughts_tokens: int | None = None

    def as_dict(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.input_tokens is not None:
            out["input_tokens"] = self.input_tokens
        if self.output_tokens is not None:
            out["output_tokens"] = self.output_tokens
        if self.total_tokens is not None:
            out["total_tokens"] = self.total_tokens
        if self.thoughts_tokens is not None:
            out["thoughts_tokens"] = self.thoughts_tokens
        return out


@dataclass(frozen=True, slots=True)
class Finish:
    """The provider's own finish word (`stop`, `tool_calls`, `end_turn`, `STOP`, ...)."""

    reason: str


CUT_OFF_FINISHES: frozenset[str] = frozenset({
    "length", "max_tokens", "MAX_TOKENS", "pause_turn", "model_length",
    "model_context_window_exceeded",
})
"""Finish words that say a limit ended the output (the output tokens, a paused turn, the
context window), not the model: a pass that ended so and said nothing has not answered
(T10). Every word the adapters sort as truncated or context-filled (P6) is here."""


@dataclass(frozen=True, slots=True)
class ProviderError:
    """A provider-level error result: HTTP status or an in-band error after HTTP 200."""

    kind: ErrorKind
    message: str
    type: str | None = None
    status: int | None = None
    retryable: bool = False
    retry_after_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "type": self.type, "message": self.message}
        if self.status is not None:
            out["status"] = self.status
        if self.retryable:
            out["retryable"] = True
        if self.retry_after_s is not None:
            out["retry_after_s"] = self.retry_after_s
        return out


ProviderEvent: TypeAlias = (
    TextDelta | ReasoningDelta | KeepAlive | ToolCallRequest | Usage | Finish | ProviderError
)


@dataclass(slots=True)
class HistoryEntry:
    """One function-history item the next pass sees: a call, its result, and the visible
    text streamed before it (T7) so the model knows that text was already sent."""

    tool_name: str
    arguments: dict[str, Any]
    result: dict[str, Any]
    call_id: str | None = None
    pre_tool_text: str = ""
    success: bool = True
    batch: str | None = None
    """The model turn that made the call: consecutive entries with the same batch were
    parallel calls of one turn, and a provider sends them back as one turn (None: alone)."""
    reasoning: ReasoningState | None = None
    """The call's `ToolCallRequest.reasoning`, carried to every later pass, fallback and
    restart of the turn so the provider gets its reasoning state back (P5)."""


@dataclass(slots=True)
class PassRequest:
    """Everything one provider pass needs, rebuilt by Preparing before each pass (S1, S2)."""

    context_items: list[dict[str, Any]]
    function_history: list[HistoryEntry]
    tools: list[dict[str, Any]] = field(default_factory=list)
    system_prompt: str = ""
    prefill: str = ""
    request_notices: list[str] = field(default_factory=list)
    reply_to_message_id: str | None = None
    pass_index: int = 0
    tail: list[dict[str, Any]] = field(default_factory=list)
    """The ordered items after the context: tool history, then request-only notices, then the
    prefill last (S1). Adapters serialize `tail` in order; each item has a `kind` of
    `tool_history` (with `entry`), `notice` or `prefill` (with `role` and `content`)."""


class Provider(Protocol):
    """A streaming model client. `stream` must honour `abort` (S3)."""

    name: str

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]: ...
