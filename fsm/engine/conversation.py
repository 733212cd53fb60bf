"""What the next pass is built from (S1, S2, R8): the caller's request, the context items a
restart enriched, the tool history, the turn's own request-only notices and the enrichment
flags. The tool runner adds history, the restart runner items, notices and flags; the
driver builds each pass's request from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .flags import TurnFlags
from .prefill import TurnRequest, build_pass_request
from .provider import HistoryEntry, PassRequest
from .tools import ToolRegistry


@dataclass(slots=True)
class Conversation:
    """The turn's growing input to the model."""

    request: TurnRequest
    context_items: list[dict[str, Any]] = field(default_factory=list)
    function_history: list[HistoryEntry] = field(default_factory=list)
    turn_notices: list[str] = field(default_factory=list)
    flags: TurnFlags = field(default_factory=TurnFlags)

    @classmethod
    def of(cls, request: TurnRequest) -> Conversation:
        return cls(request=request, context_items=list(request.context_items),
                   function_history=list(request.function_history))

    def next_request(self, tools: ToolRegistry, pass_index: int) -> PassRequest:
        """Pass `pass_index`'s request, with the tools the flags allow (S1, S2, R8). Built
        in Preparing before `begin`, so a failure here is a crash from Preparing."""
        return build_pass_request(self.request, self.context_items, self.function_history,
                                  tools.schemas(self.flags), pass_index, self.turn_notices)
