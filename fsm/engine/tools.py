"""The tool contract and registry.

A tool declares its arguments as a pydantic model (bad arguments become a failed result the
model sees, never a crash), the enrichment it performs if any (its disable flag guards it,
R8), how the loop treats its success (T9), and an async `run` that receives a `ToolContext`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from .channel import TurnChannel
from .flags import EnrichmentKind, TurnFlags
from .provider import AbortSignal
from .stash import ContextStash

NOT_AVAILABLE = "not available for the current turn"

LoopPolicy = Literal["next_pass", "ends_turn", "requires_follow_up", "end_after_pre_tool_text"]
"""How the loop treats a tool's success (T9):

- `next_pass` (the default): the model sees the result in the next pass;
- `ends_turn`: the tool delivered the reply itself; the turn completes without another pass;
- `requires_follow_up`: the model must speak after it, so an empty pass after it is an empty
  response, not a completed turn (T10);
- `end_after_pre_tool_text`: when visible text came before the call (a memory write after
  the answer), the turn completes instead of starting another pass.
"""
LOOP_POLICIES: tuple[LoopPolicy, ...] = (
    "next_pass", "ends_turn", "requires_follow_up", "end_after_pre_tool_text",
)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returns. `data` is only meaningful on success."""

    success: bool
    data: Any = None
    error: str | None = None

    @classmethod
    def ok(cls, data: Any = None) -> ToolResult:
        return cls(success=True, data=data)

    @classmethod
    def fail(cls, error: str) -> ToolResult:
        return cls(success=False, error=error)

    def for_model(self) -> dict[str, Any]:
        """The shape the model sees in the function history."""
        if self.success:
            return {"success": True, "data": self.data}
        return {"success": False, "error": self.error}


@dataclass(slots=True)
class ToolContext:
    """What a running tool may use: the channel, the turn's flags, the abort, the stash."""

    channel: TurnChannel
    flags: TurnFlags
    abort: AbortSignal
    stash: ContextStash
    turn_id: str
    context_items: list[dict[str, Any]] = field(default_factory=list)


ArgsT = TypeVar("ArgsT", bound=BaseModel)


class AnyArgs(BaseModel):
    """Arguments of a tool that accepts whatever object the model sends."""

    model_config = ConfigDict(extra="allow")


class Tool(Protocol):
    """A tool the model may call."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def args_model(self) -> type[BaseModel]: ...

    @property
    def guard(self) -> EnrichmentKind | None: ...

    @property
    def loop(self) -> LoopPolicy: ...

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult: ...


@dataclass(frozen=True)
class FunctionTool(Generic[ArgsT]):
    """A tool made from an async function and its arguments model. (No `slots`: a slotted
    generic dataclass cannot be constructed as `FunctionTool[Args](...)`.)"""

    name: str
    description: str
    args_model: type[ArgsT]
    func: Callable[[ArgsT, ToolContext], Awaitable[ToolResult]]
    guard: EnrichmentKind | None = None
    loop: LoopPolicy = "next_pass"

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        if not isinstance(args, self.args_model):
            raise TypeError(f"{self.name}: arguments are {type(args).__name__}")
        return await self.func(args, ctx)


def schema_of(tool: Tool) -> dict[str, Any]:
    """The provider-neutral declaration of a tool: name, description, JSON schema."""
    return {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.args_model.model_json_schema(),
    }


class ToolRegistry:
    """The tools of a bot and their availability per turn. It keeps no results: the model
    sees them in the turn's history, and a bulky one is in the stash (R3)."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        schema = schema_of(tool)
        self._tools[tool.name] = tool
        self._schemas[tool.name] = schema

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def available(self, flags: TurnFlags) -> list[Tool]:
        """The tools offered to the model this pass: guarded enrichments drop out once used."""
        return [
            tool
            for tool in self._tools.values()
            if tool.guard is None or not flags.is_disabled(tool.guard)
        ]

    def schemas(self, flags: TurnFlags) -> list[dict[str, Any]]:
        """The declarations of the tools `available` offers, built once at registration (a
        pydantic JSON schema per tool per pass was a fifth of a typical turn, BENCHMARKS.md
        F1). They are shared by every turn: read them, never change them."""
        return [self._schemas[tool.name] for tool in self.available(flags)]

    def refusal(self, name: str, flags: TurnFlags) -> str | None:
        """Why a call cannot run now, or None when it may (execution-time guard, R8)."""
        tool = self._tools.get(name)
        if tool is None:
            return "unknown tool"
        if tool.guard is not None and flags.is_disabled(tool.guard):
            return f"{name} is {NOT_AVAILABLE}"
        return None

    def parse_args(self, tool: Tool, arguments: Any) -> BaseModel | str:
        """Validated arguments, or a message the model can act on."""
        if not isinstance(arguments, dict):
            return f"invalid arguments for {tool.name}: expected an object"
        try:
            return tool.args_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                for err in exc.errors()
            )
            return f"invalid arguments for {tool.name}: {problems}"
