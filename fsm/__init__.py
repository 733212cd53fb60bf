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
- What those contracts name is here too: the exceptions a channel raises
  (`DestinationUnavailable`, `DeliveryCapReached`) and a stash (`StashFull`), the literal kinds
  (`NoticeKind`, `ErrorKind`, `FailureKind`, `EnrichmentKind`, `LoopPolicy`), the opaque
  `ReasoningState` a provider carries, `TurnFlags`, `KillHandle`, and what a recorder is handed
  (`PassRun`, `TextSink`, `DetailsFilter`). `quoted_name`, `dialogue_text` and `framed_prompt`
  put users' words and names in front of a model safely (A3); `schema_of`, `LOOP_POLICIES` and
  `NOT_AVAILABLE` help write tools.

The layers below it: `fsm.engine` (the machine and the driver), `fsm.journal` (the journal
format), `fsm.scenarios` (scripted stand-ins and scenario files), `fsm.review` (replay,
diagrams, inspection, the review page). The project's own adapters import the engine only
from here (tests/test_public_surface.py).
"""

from .engine.channel import (
    DeliveryCapReached,
    DestinationUnavailable,
    Notice,
    NoticeKind,
    TurnChannel,
)
from .engine.config import TurnConfig
from .engine.details import DetailsFilter
from .engine.failures import FailureKind
from .engine.flags import EnrichmentKind, TurnFlags
from .engine.generation import Attempt, GenerationResult, run_generation_turn
from .engine.locks import ChannelLock, ChannelLockRegistry, KillHandle
from .engine.pass_run import PassRun, TextSink
from .engine.prefill import TurnRequest
from .engine.provider import (
    AbortSignal,
    ErrorKind,
    Finish,
    HistoryEntry,
    KeepAlive,
    PassRequest,
    Provider,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    ReasoningState,
    TextDelta,
    ToolCallRequest,
    Usage,
)
from .engine.recording import InputRecorder
from .engine.result import PassResult, TurnResult, TurnStatus
from .engine.stash import ContextStash, StashFull
from .engine.table import State
from .engine.tools import (
    LOOP_POLICIES,
    NOT_AVAILABLE,
    FunctionTool,
    LoopPolicy,
    Tool,
    ToolContext,
    ToolRegistry,
    ToolResult,
    schema_of,
)
from .engine.turn import Turn, TurnObserver
from .engine.user_text import dialogue_text, framed_prompt, quoted_name

__all__ = [
    "LOOP_POLICIES",
    "NOT_AVAILABLE",
    "AbortSignal",
    "Attempt",
    "ChannelLock",
    "ChannelLockRegistry",
    "ContextStash",
    "DeliveryCapReached",
    "DestinationUnavailable",
    "DetailsFilter",
    "EnrichmentKind",
    "ErrorKind",
    "FailureKind",
    "Finish",
    "FunctionTool",
    "GenerationResult",
    "HistoryEntry",
    "InputRecorder",
    "KeepAlive",
    "KillHandle",
    "LoopPolicy",
    "Notice",
    "NoticeKind",
    "PassRequest",
    "PassResult",
    "PassRun",
    "Provider",
    "ProviderError",
    "ProviderEvent",
    "ReasoningDelta",
    "ReasoningState",
    "StashFull",
    "State",
    "TextDelta",
    "TextSink",
    "Tool",
    "ToolCallRequest",
    "ToolContext",
    "ToolRegistry",
    "ToolResult",
    "Turn",
    "TurnChannel",
    "TurnConfig",
    "TurnFlags",
    "TurnObserver",
    "TurnRequest",
    "TurnResult",
    "TurnStatus",
    "Usage",
    "dialogue_text",
    "framed_prompt",
    "quoted_name",
    "run_generation_turn",
    "schema_of",
]
