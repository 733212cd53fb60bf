"""The turn engine's public API: what an existing discord.py bot (or any other caller) needs to
run turns of its own. These names are stable; anything imported from a submodule is not.

- `Turn` drives one reply to exactly one terminal state; `run_generation_turn` runs a chain
  of `Attempt`s (primary, then fallbacks) around it.
- `TurnRequest` is what a turn answers; `TurnConfig` its budgets and caps; `TurnResult` /
  `PassResult` what it reports.
- `Provider` is the streaming model contract (events `TextDelta`, `ReasoningDelta`,
  `KeepAlive`, `ToolCallRequest`, `Usage`, `Finish`, `ProviderError`; `AbortSignal`);
  `TurnChannel` the place a turn replies in; `FunctionTool`, `ToolResult`, `ToolContext`,
  `ToolRegistry` the tools; `ChannelLockRegistry` one turn per channel; `ContextStash` the
  restart media stash; `TurnObserver` and `InputRecorder` watch and record a turn.

The layers below it: `fsm.engine` (the machine and the driver), `fsm.scenarios` (scripted
stand-ins and scenario files), `fsm.review` (journals, replay, diagrams, inspection).
"""

from .engine.channel import Notice, TurnChannel
from .engine.config import TurnConfig
from .engine.generation import Attempt, GenerationResult, run_generation_turn
from .engine.locks import ChannelLock, ChannelLockRegistry
from .engine.prefill import TurnRequest
from .engine.provider import (
    AbortSignal,
    Finish,
    HistoryEntry,
    KeepAlive,
    PassRequest,
    Provider,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    Usage,
)
from .engine.recording import InputRecorder
from .engine.result import PassResult, TurnResult, TurnStatus
from .engine.stash import ContextStash
from .engine.table import State
from .engine.tools import FunctionTool, Tool, ToolContext, ToolRegistry, ToolResult
from .engine.turn import Turn, TurnObserver

__all__ = [
    "AbortSignal",
    "Attempt",
    "ChannelLock",
    "ChannelLockRegistry",
    "ContextStash",
    "Finish",
    "FunctionTool",
    "GenerationResult",
    "HistoryEntry",
    "InputRecorder",
    "KeepAlive",
    "Notice",
    "PassRequest",
    "PassResult",
    "Provider",
    "ProviderError",
    "ProviderEvent",
    "ReasoningDelta",
    "State",
    "TextDelta",
    "Tool",
    "ToolCallRequest",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "Turn",
    "TurnChannel",
    "TurnConfig",
    "TurnObserver",
    "TurnRequest",
    "TurnResult",
    "TurnStatus",
    "Usage",
    "run_generation_turn",
]
