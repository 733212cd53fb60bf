"""Folding a provider's event stream into one summary (what `stream-file` prints).

The summary is the fixture README's normalized result: visible text, reasoning, tool calls,
the provider's finish word, the last usage seen, and the error if the stream ended in one.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from typing import Any

from fsm import (
    Finish,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    Usage,
)


@dataclass(slots=True)
class StreamSummary:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None
    error: ProviderError | None = None

    def add(self, event: ProviderEvent) -> None:
        if isinstance(event, TextDelta):
            self.text.append(event.text)
        elif isinstance(event, ReasoningDelta):
            self.reasoning.append(event.text)
        elif isinstance(event, ToolCallRequest):
            self.tool_calls.append(event)
        elif isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, Finish):
            self.finish_reason = event.reason
        elif isinstance(event, ProviderError):
            self.error = event

    def as_json(self) -> dict[str, Any]:
        return {
            "text": "".join(self.text),
            "reasoning": "".join(self.reasoning),
            "tool_calls": [
                {
                    "id": call.id,
                    "name": call.name,
                    "arguments": call.arguments,
                    "truncated": call.truncated,
                }
                for call in self.tool_calls
            ],
            "finish_reason": self.finish_reason,
            "usage": self.usage.as_dict() if self.usage is not None else None,
            "error": error_json(self.error) if self.error is not None else None,
        }


def error_json(error: ProviderError) -> dict[str, Any]:
    """`{"kind", "type", "message"}`, plus `code` when the provider gave a numeric one."""
    out: dict[str, Any] = {"kind": error.kind, "type": error.type, "message": error.message}
    if error.status is not None:
        out["code"] = error.status
    return out


async def summarize(events: AsyncIterable[ProviderEvent]) -> StreamSummary:
    summary = StreamSummary()
    async for event in events:
        summary.add(event)
    return summary
