"""Building `ToolCallRequest`s from streamed arguments, safely.

Arguments arrive as JSON text in fragments. A call whose text never became a JSON object (a
`max_tokens` stop, a dropped stream, a model that wrote garbage) is marked truncated: the
engine must never run it (T4), so there is no "best effort" repair here.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fsm import ToolCallRequest


def mint_call_id() -> str:
    """An id for a call the provider sent without one (Gemini, some local servers): the
    function history needs one to pair the call with its result."""
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call(name: str, raw: str, call_id: str | None, *, cut: bool = False) -> ToolCallRequest:
    """A call from its accumulated argument text; `cut` says the provider stopped mid-call.

    Empty text means a call without arguments (`{}`), unless the call was cut. Arguments that
    cannot be read — malformed, or JSON Python will not read (an integer past its digit limit,
    nesting past its recursion limit) — mark the call truncated: it never runs (T4), and the
    stream goes on instead of the adapter raising.
    """
    arguments: dict[str, Any] = {}
    truncated = cut
    text = raw.strip()
    if text:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):  # malformed, or JSON Python will not read
            value = None
        if isinstance(value, dict):
            arguments = value
        else:
            truncated = True
    return ToolCallRequest(
        name=name,
        arguments=arguments,
        id=call_id or mint_call_id(),
        truncated=truncated,
        raw_arguments=raw,
    )
