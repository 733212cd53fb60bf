"""Building each pass's request (S1, S2): prefill folding and the reply target."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .provider import HistoryEntry, PassRequest


@dataclass(slots=True)
class TurnRequest:
    """What the caller hands a turn: its context and how it should reply.

    `prefill` is assistant output the model must continue (a fallback continues from the
    text already delivered, G1); `request_notices` are request-only notes such as the one
    naming tool calls an earlier attempt already completed.
    """

    context_items: list[dict[str, Any]] = field(default_factory=list)
    system_prompt: str = ""
    prefill: str = ""
    request_notices: list[str] = field(default_factory=list)
    function_history: list[HistoryEntry] = field(default_factory=list)
    trigger_message_id: str | None = None
    queued: bool = False
    scene_turn: bool = False
    owner: str = "assistant"


def reply_target(request: TurnRequest) -> str | None:
    """A queued turn replies to its trigger; a scene turn never does (S2)."""
    if request.scene_turn or not request.queued:
        return None
    return request.trigger_message_id


def fold_prefill(
    history: list[HistoryEntry], notices: list[str], prefill: str
) -> list[dict[str, Any]]:
    """The request's tail after the context: tool history, then request-only notices, then
    the prefill, which must stay the last item so the model continues it (S1)."""
    tail: list[dict[str, Any]] = []
    for entry in history:
        tail.append({"kind": "tool_history", "entry": entry})
    for notice in notices:
        tail.append({"kind": "notice", "role": "user", "content": notice})
    if prefill:
        tail.append({"kind": "prefill", "role": "assistant", "content": prefill})
    return tail


def build_pass_request(
    request: TurnRequest,
    context_items: list[dict[str, Any]],
    history: list[HistoryEntry],
    tools: list[dict[str, Any]],
    pass_index: int,
    turn_notices: list[str] | None = None,
) -> PassRequest:
    """A fresh request for pass `pass_index`, built from the turn's current state.
    `turn_notices` are request-only notes the turn itself added (they follow the caller's)."""
    notices = list(request.request_notices) + list(turn_notices or ())
    return PassRequest(
        context_items=list(context_items),
        function_history=list(history),
        tools=tools,
        system_prompt=request.system_prompt,
        prefill=request.prefill,
        request_notices=notices,
        reply_to_message_id=reply_target(request),
        pass_index=pass_index,
        tail=fold_prefill(history, notices, request.prefill),
    )
