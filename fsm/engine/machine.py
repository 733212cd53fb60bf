"""The runtime machine: one `AsyncMachine` per process built from the declared table.

Turns are not added to it as models: a turn keeps its own `state` and fires
`machine.events[trigger].trigger(turn, payload)`, which is all `transitions` needs to check
the guards, move the state and run the callback. `add_model` would bind ~50 convenience
methods onto every turn and register it in every state's lists (most of a parked turn's
memory, BENCHMARKS.md F3) for methods the driver never calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable
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
    "delivery_cap": "on_delivery_cap",
    "empty_after_text": "on_empty_after_text",
    "tool_ended_turn": "on_tool_outcome",
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


class SequentialAsyncMachine(AsyncMachine):
    """`AsyncMachine` running a callback or guard list one after the other on the calling
    task, instead of one task each under `asyncio.gather` (BENCHMARKS.md F2). The engine's
    callbacks and guards are short and synchronous by design, so there is nothing to run
    concurrently, and a gather costs a task per guard and callback on every transition —
    and a list, partials and a gather for each of the ~9 callback lists a transition
    visits, nearly all of them empty."""

    @staticmethod
    async def await_all(
        callables: list[Callable[[], Coroutine[Any, Any, Any]]],
    ) -> list[Any]:
        return [await func() for func in callables]

    async def callbacks(  # type: ignore[override]  # as in AsyncMachine's own stub
        self, funcs: Iterable[Any], event_data: Any,
    ) -> None:
        for func in funcs:
            await self.callback(func, event_data)

    async def process_context(self, func: Callable[[], Awaitable[Any]], model: object) -> bool:
        """Run the trigger on the calling task. `AsyncMachine` records every task inside a
        trigger per model so that the next successful trigger can cancel it, and it turns a
        cancellation of that task into `False` (docs/architecture.md; upstream #704, #712). Here the
        turn's driver is the only task that fires triggers, one at a time, and its callbacks
        never await, so there is never another transition to cancel — and a cancellation
        aimed at the driver is not swallowed."""
        return bool(await func())

    async def cancel_running_transitions(self, model: object, msg: str | None = None) -> None:
        """Nothing to cancel (see `process_context`)."""


@lru_cache(maxsize=1)
def shared_machine() -> AsyncMachine:
    """The process-wide machine every turn fires its triggers on."""
    return SequentialAsyncMachine(
        model=None,
        states=[s.value for s in STATES],
        transitions=transition_specs(),
        initial=State.PREPARING.value,
        auto_transitions=False,
        send_event=False,
        ignore_invalid_triggers=False,
    )
