"""The runtime machine: the shared `AsyncMachine` built from the table, its callbacks run in
order on the driver task, and turns that fire triggers on it without joining it as models
(BENCHMARKS.md F2, F3). All in virtual time."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import replace
from typing import Any

import pytest
from transitions.extensions.asyncio import AsyncMachine

from fsm.engine.machine import SequentialAsyncMachine, TableError, build_machine
from fsm.engine.table import TABLE, edge_keys
from fsm.engine.turn import Turn, shared_machine
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def test_callbacks_run_in_order_on_the_calling_task() -> None:
    # covers SPEC "States and what moves between them" (transitions fire the callbacks) and
    # issue 7 F2: a callback list runs in order on the driver's task, no task per callback
    ran: list[tuple[int, asyncio.Task[object] | None]] = []

    def step(n: int) -> object:
        async def callback() -> bool:
            ran.append((n, asyncio.current_task()))
            return n != 2
        return callback

    results = await SequentialAsyncMachine.await_all([step(1), step(2), step(3)])
    assert results == [True, False, True]
    assert [n for n, _ in ran] == [1, 2, 3]
    assert {task for _, task in ran} == {asyncio.current_task()}


async def test_the_shared_machine_is_an_async_machine_from_the_table() -> None:
    # covers SPEC "States and what moves between them": the declared table drives the
    # runtime machine
    machine = shared_machine()
    assert isinstance(machine, AsyncMachine) and shared_machine() is machine
    declared = {trigger for trigger, _source, _dest in edge_keys()}
    assert set(machine.events) == declared


async def test_a_turn_fires_triggers_without_joining_the_machine() -> None:
    # covers S14 and issue 7 F3: nothing of a turn stays in the shared machine once it ends
    machine = shared_machine()
    scenario = parse_scenario({"passes": [
        [{"at": 1, "text": "Looking"}, {"at": 2, "tool_call": {"name": "lookup", "args": {}}}],
        [{"at": 1, "text": "Found it."}, {"at": 2, "end": "completed"}]],
        "tools": {"lookup": [{"after": 1, "success": True, "data": {"x": 1}}]}})
    played = await play(scenario)
    assert played.result.status == "completed"
    assert [line["to"] for line in played.transitions] == [
        "AwaitingFirstToken", "Streaming", "ToolCall", "Preparing", "AwaitingFirstToken",
        "Streaming", "Done"]
    assert machine.models == [] and machine.async_tasks == {}
    assert not hasattr(played.turn, "trigger") and not hasattr(played.turn, "is_Done")


async def test_transitions_create_no_tasks() -> None:
    # covers issue 7 F2, S14: the only tasks a turn creates are its workers (one per pass,
    # one per tool run) and the one that holds the turn's task group; the machine's guards
    # and callbacks run on the driver's task
    loop = asyncio.get_running_loop()
    created: list[asyncio.Task[Any]] = []
    default_factory = loop.get_task_factory()

    def counting_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        if default_factory is not None:
            task = default_factory(loop, coro, **kwargs)
        else:
            task = asyncio.Task(coro, loop=loop, **kwargs)
        created.append(task)
        return task

    scenario = parse_scenario({"passes": [
        [{"at": 1, "text": "Looking"}, {"at": 2, "tool_call": {"name": "lookup", "args": {}}}],
        [{"at": 1, "text": "Found it."}, {"at": 2, "end": "completed"}]],
        "tools": {"lookup": [{"after": 1, "success": True, "data": {"x": 1}}]}})
    loop.set_task_factory(counting_factory)
    try:
        played = await play(scenario)
    finally:
        loop.set_task_factory(default_factory)
    assert len(played.transitions) == 7
    names = [task.get_name().removeprefix(played.turn.turn_id) for task in created
             if task.get_coro().__qualname__ != "Turn.run"]  # type: ignore[union-attr]
    assert names == ["-workers", "-pass-1", "-tool-1", "-pass-2"]


async def test_a_cancellation_inside_a_trigger_is_not_swallowed() -> None:
    # covers S16 (a kill is always honoured) against the 0.9.3 behaviour docs/architecture.md
    # describes: AsyncMachine turns a cancellation of a task inside a trigger into False
    entered = asyncio.Event()

    class Model:
        state = "a"

        async def slow(self) -> None:
            entered.set()
            await asyncio.Event().wait()

    machine = SequentialAsyncMachine(model=None, states=["a", "b"], initial="a",
                                     transitions=[{"trigger": "go", "source": "a",
                                                   "dest": "b", "after": "slow"}],
                                     auto_transitions=False)
    plain = AsyncMachine(model=None, states=["a", "b"], initial="a",
                         transitions=[{"trigger": "go", "source": "a", "dest": "b",
                                       "after": "slow"}], auto_transitions=False)
    outcomes: list[str] = []
    for runtime in (plain, machine):
        entered.clear()
        task = asyncio.get_running_loop().create_task(
            runtime.events["go"].trigger(Model()), context=contextvars.Context())
        await entered.wait()
        task.cancel()
        try:
            outcomes.append(f"returned {await task}")
        except asyncio.CancelledError:
            outcomes.append("cancelled")
    assert outcomes == ["returned False", "cancelled"]
    assert machine.async_tasks == {}


@pytest.mark.parametrize("role", ["callback", "guard", "unless"])
async def test_a_row_naming_a_method_the_driver_lacks_fails_at_build(role: str) -> None:
    # covers the table's rule (docs/transitions.md): callback and guard names are checked
    # when the machine is built, not first when the edge is taken
    edge = TABLE[0]
    bad = {"callback": replace(edge, callback="on_no_such_thing"),
           "guard": replace(edge, guards=("no_such_guard",)),
           "unless": replace(edge, unless=("no_such_guard",))}[role]
    with pytest.raises(TableError, match="no_such"):
        build_machine(Turn, (bad, *TABLE[1:]))
    build_machine(Turn, TABLE)  # the declared table itself builds
