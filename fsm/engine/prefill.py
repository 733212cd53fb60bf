"""Building each pass's request (S1, S2): prefill folding and the reply target."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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


def fold_into_history(
    history: list[HistoryEntry], prefill: str
) -> tuple[list[HistoryEntry], str]:
    """Where the prefill sits (S1): with no tool history it stays the request's last item;
    once there is tool history it is merged into the first tool-call turn, before that
    call's pre-tool text, and is not repeated at the end — the model already continued it
    when it made that call, and a trailing copy would ask it to continue text that came
    before its own call. Returns the history to send and the trailing prefill ("" when
    folded). The caller's entries are never changed."""
    if not history or not prefill:
        return list(history), prefill
    first = history[0]
    merged = prefill + first.pre_tool_text
    folded = replace(first, pre_tool_text=merged if merged.strip() else "")
    return [folded, *history[1:]], ""


def fold_prefill(
    history: list[HistoryEntry], notices: list[str], prefill: str
) -> list[dict[str, Any]]:
    """The request's tail after the context: tool history (the prefill folded into its
    first turn), then request-only notices, then the prefill when there is no tool history,
    which must stay the last item so the model continues it (S1)."""
    entries, trailing = fold_into_history(history, prefill)
    tail: list[dict[str, Any]] = []
    for entry in entries:
        tail.append({"kind": "tool_history", "entry": entry})
    for notice in notices:
        tail.append({"kind": "notice", "role": "user", "content": notice})
    if trailing:
        tail.append({"kind": "prefill", "role": "assistant", "content": trailing})
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
    entries, trailing = fold_into_history(history, request.prefill)
    return PassRequest(
        context_items=list(context_items),
        function_history=entries,
        tools=tools,
        system_prompt=request.system_prompt,
        prefill=trailing,
        request_notices=notices,
        reply_to_message_id=reply_target(request),
        pass_index=pass_index,
        tail=fold_prefill(history, notices, request.prefill),
    )
