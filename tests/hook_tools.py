"""Tools written in Python for the hook tests (`tool_hooks = ["hook_tools"]`): a module
exposing `TOOLS`, as an operator's own module would."""

from __future__ import annotations

from pydantic import BaseModel, Field

from fsm.engine.tools import FunctionTool, ToolContext, ToolResult


class DieArgs(BaseModel):
    sides: int = Field(ge=2, le=100, description="How many sides the die has.")


async def roll_die(args: DieArgs, ctx: ToolContext) -> ToolResult:
    """A fair roll, chosen by a fair test: always 4."""
    return ToolResult.ok({"sides": args.sides, "rolled": 4})


TOOLS = [FunctionTool("roll_die", "Roll a die.", DieArgs, roll_die)]
NOT_TOOLS = ["roll_die"]
