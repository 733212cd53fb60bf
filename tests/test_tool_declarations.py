"""What the model is told about tools and their calls (SPEC T5, T6, T7, T9): each tool's
declaration, the refusal of a call to a tool that does not exist, every problem of bad
arguments named, and the loop policies a tool may declare."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import BaseModel

from fsm.engine.flags import TurnFlags
from fsm.engine.tools import (
    LOOP_POLICIES,
    FunctionTool,
    LoopPolicy,
    ToolContext,
    ToolRegistry,
    ToolResult,
)
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play


class _Trip(BaseModel):
    origin: str
    destination: str


async def _plan(args: _Trip, ctx: ToolContext) -> ToolResult:
    return ToolResult.ok({"from": args.origin, "to": args.destination})


TRIP = FunctionTool("plan_trip", "Plan a trip between two cities.", _Trip, _plan)


def test_each_tool_is_declared_by_name_description_and_parameters() -> None:
    # covers T7, T5: the declaration every adapter turns into its provider's tool format
    (schema,) = ToolRegistry([TRIP]).schemas(TurnFlags())
    assert schema == {"name": "plan_trip", "description": "Plan a trip between two cities.",
                      "parameters": _Trip.model_json_schema()}


def test_bad_arguments_name_every_problem() -> None:
    # covers T6 (bad input): the model is told each wrong field, to fix them in one go
    problem = ToolRegistry([TRIP]).parse_args(TRIP, {})
    assert problem == ("invalid arguments for plan_trip: origin: Field required; "
                       "destination: Field required")


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_call_to_a_tool_that_does_not_exist_is_refused_by_name() -> None:
    # covers T6 (bad input): the model asked for a tool the bot lacks; the next pass is told
    played = await play(parse_scenario({"passes": [
        [{"at": 1, "tool_call": {"name": "teleport"}}],
        [{"at": 1, "text": "I cannot do that."}, {"at": 2, "end": "completed"}]]}))
    (entry,) = played.provider.requests[1].function_history
    assert entry.tool_name == "teleport" and entry.result == {"success": False,
                                                             "error": "unknown tool"}


def test_the_published_loop_policies_are_the_loops_own() -> None:
    # covers T9: the list an embedder or a settings check reads names exactly the
    # policies a tool may declare
    assert set(LOOP_POLICIES) == set(get_args(LoopPolicy)) == {
        "next_pass", "ends_turn", "requires_follow_up", "end_after_pre_tool_text"}
