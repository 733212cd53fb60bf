"""The runtime machine: one `AsyncMachine` per process built from the declared table.

Turns are not added to it as models: a turn keeps its own `state` and fires
`machine.events[trigger].trigger(turn, payload)`, which is all `transitions` needs to check
the guards, move the state and run the callback. `add_model` would bind ~50 convenience
methods onto every turn and register it in every state's lists (most of a parked turn's
memory, BENCHMARKS.md F3) for methods the driver never calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from transitions.extensions.asyncio import AsyncMachine

from .table import STATES, TABLE, Edge, State


class TableError(ValueError):
    """A row of the table names a callback or guard the driver does not have."""


def check_names(model: type, table: tuple[Edge, ...] = TABLE) -> None:
    """Every callback and guard a row names is a method of `model`, the driver, so a typo in
    the table fails when the machine is built, not when the edge is first taken."""
    problems = [
        f"{edge.trigger} from {edge.sources[0].value}: {role} {name!r}"
        for edge in table
        for role, names in (("callback", (edge.callback,)), ("guard", edge.guards),
                            ("guard", edge.unless))
        for name in names
        if not callable(getattr(model, name, None))
    ]
    if problems:
        raise TableError(f"{model.__name__} has no method for: " + "; ".join(problems))


def transition_specs(table: tuple[Edge, ...] = TABLE) -> list[dict[str, Any]]:
    """The table in the form `transitions` takes."""
    specs: list[dict[str, Any]] = []
    for edge in table:
        specs.append(
            {
                "trigger": edge.trigger,
                "source": [s.value for s in edge.sources],
                "dest": edge.dest.value if edge.dest is not None else None,
                "conditions": list(edge.guards),
                "unless": list(edge.unless),
                "after": edge.callback,
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


def build_machine(model: type, table: tuple[Edge, ...] = TABLE) -> AsyncMachine:
    """The machine for `table`, its names checked against `model` first (`check_names`).
    Turns are not added to it: each fires `machine.events[trigger].trigger(turn, payload)`."""
    check_names(model, table)
    return SequentialAsyncMachine(
        model=None,
        states=[s.value for s in STATES],
        transitions=transition_specs(table),
        initial=State.PREPARING.value,
        auto_transitions=False,
        send_event=False,
        ignore_invalid_triggers=False,
    )
