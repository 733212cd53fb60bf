"""What the runtime machine tells the operator and what it refuses (the table's rules in
docs/transitions.md; SPEC "States and what moves between them", S15): a table naming methods
the driver lacks fails at start-up with one message naming every bad row and its role, and
a trigger with no edge from the turn's state is refused rather than ignored."""

from __future__ import annotations

from dataclasses import replace

import pytest
from transitions.core import MachineError

from fsm.engine.machine import TableError, build_machine
from fsm.engine.table import TABLE
from fsm.engine.turn import Turn, shared_machine
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def test_the_start_up_error_names_every_bad_row_and_its_role() -> None:
    # covers the table's rule (docs/transitions.md): the operator reads, in one line, each
    # row whose callback or guard the driver lacks, with the trigger, source state and role
    table = list(TABLE)
    cap, first_token, idle = (next(i for i, edge in enumerate(TABLE) if edge.trigger == name)
                              for name in ("iteration_cap", "first_token_timeout",
                                           "idle_timeout"))
    table[cap] = replace(table[cap], callback="on_no_such_thing")
    table[first_token] = replace(table[first_token], guards=("no_such_guard",))
    table[idle] = replace(table[idle], unless=("no_such_unless",))
    with pytest.raises(TableError) as caught:
        build_machine(Turn, tuple(table))
    assert str(caught.value) == (
        "Turn has no method for: "
        f"iteration_cap from {TABLE[cap].sources[0].value}: callback 'on_no_such_thing'; "
        f"first_token_timeout from {TABLE[first_token].sources[0].value}: guard "
        "'no_such_guard'; "
        f"idle_timeout from {TABLE[idle].sources[0].value}: guard 'no_such_unless'")


async def test_a_finished_turn_refuses_every_trigger() -> None:
    # covers S15 and the table's rule: no edge leaves a terminal state, and a trigger fired
    # without an edge from the turn's state raises (the driver's crash path then ends the
    # turn) instead of passing unnoticed; the finished turn stays where it ended
    played = await play(parse_scenario({"passes": [[{"at": 1, "text": "Hi."},
                                                    {"at": 2, "end": "completed"}]]}))
    turn = played.turn
    journal = list(turn.transitions)
    machine = shared_machine()
    for trigger in machine.events:
        with pytest.raises(MachineError):
            await machine.events[trigger].trigger(turn, None)
    assert turn.state == "Done" and turn.transitions == journal
