"""The live state of one provider pass, shared by the stream worker, the driver and the
journal recorder (the seed's streaming context)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from .details import DetailsFilter
from .provider import AbortSignal, PassRequest, ProviderError, ToolCallRequest, Usage
from .result import PassResult, TurnStatus

TextSink = Callable[[tuple[float, str]], None]
"""Takes `(seconds since the pass began, text)` for each content chunk of one pass."""


@dataclass(eq=False, slots=True)
class PassRun:
    """The live state of one pass (the seed's streaming context)."""

    no: int
    request: PassRequest
    abort: AbortSignal
    started_at: float
    deadline: float | None
    chars_left: int = 20_000
    """What this pass may still deliver (D5): the reply's bound less what it delivered."""
    record_text: TextSink | None = None
    kill_handle: Callable[[str], None] | None = None
    parts: list[str] = field(default_factory=list)
    landed: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    usage: Usage | None = None
    finish: str | None = None
    error: ProviderError | None = None
    got_token: bool = False
    capped: bool = False
    """The pass reached the reply's delivery bound (D5)."""
    details: DetailsFilter = field(default_factory=DetailsFilter)
    """Takes the model's `<details>` block out of the visible text (T8)."""
    flushed: bool = False
    closed: bool = False
    aborted_at: float | None = None
    worker: asyncio.Task[None] | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def result(self, status: TurnStatus, include_landed: bool) -> PassResult:
        text = self.text + ("".join(self.landed) if include_landed else "")
        return PassResult(
            index=self.no,
            status=status,
            text=text,
            details=self.details.details,
            reasoning="".join(self.reasoning),
            tool_calls=[call.name for call in self.tool_calls],
            usage=self.usage.as_dict() if self.usage is not None else None,
            finish_reason=self.finish,
            error=self.error.as_dict() if self.error is not None else None,
        )
