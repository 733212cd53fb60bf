"""The runtime machine: one `AsyncMachine` per process built from the declared table, to
which each live turn's model is added for its lifetime (cheaper than a machine per turn)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from transitions.extensions.asyncio import AsyncMachine

from .table import STATES, TABLE, State

CALLBACK_BY_TRIGGER: dict[str, str] = {
    "iteration_cap": "on_iteration_cap",
    "begin": "on_begin",
    "first_token": "on_first_token",
    "first_token_timeout": "on_stream_timeout",
    "idle_timeout": "on_stream_timeout",
    "settled": "on_settled",
    "settle_timeout": "on_settle_timeout",
    "completed": "on_stream_end",
    "empty": "on_stream_end",
    "provider_error": "on_stream_end",
    "tool_call": "on_tool_call",
    "follow_up": "on_follow_up",
    "nameless_call": "on_nameless_call",
    "tool_result": "on_tool_outcome",
    "tool_timeout": "on_tool_outcome",
    "restart_requested": "on_restart_requested",
    "restart": "on_restart",
    "kill": "on_kill",
    "crash": "on_crash",
}
"""The model method each trigger runs after its transition: short and synchronous."""


def transition_specs() -> list[dict[str, Any]]:
    """The table in the form `transitions` takes."""
    specs: list[dict[str, Any]] = []
    for edge in TABLE:
        specs.append(
            {
                "trigger": edge.trigger,
                "source": [s.value for s in edge.sources],
                "dest": edge.dest.value if edge.dest is not None else None,
                "conditions": list(edge.guards),
                "unless": list(edge.unless),
                "after": CALLBACK_BY_TRIGGER[edge.trigger],
            }
        )
    return specs


@lru_cache(maxsize=1)
def shared_machine() -> AsyncMachine:
    """The process-wide machine; models join with `add_model` and leave with `remove_model`."""
    return AsyncMachine(
        model=None,
        states=[s.value for s in STATES],
        transitions=transition_specs(),
        initial=State.PREPARING.value,
        auto_transitions=False,
        send_event=False,
        ignore_invalid_triggers=False,
    )
