"""What workers and the outside world post to a turn's driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from .provider import ProviderError
from .tools import ToolResult


@dataclass(frozen=True, slots=True)
class FirstToken:
    pass_no: int


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The pass's stream finished on its own: `outcome` names the trigger to fire."""

    pass_no: int
    outcome: str
    error: ProviderError | None = None


@dataclass(frozen=True, slots=True)
class StreamCrashed:
    pass_no: int
    error: BaseException


@dataclass(frozen=True, slots=True)
class StreamSettled:
    """The aborted stream's worker has finished: whatever was on the wire has landed."""

    pass_no: int


@dataclass(frozen=True, slots=True)
class ToolFinished:
    call_no: int
    result: ToolResult


@dataclass(frozen=True, slots=True)
class RestartReady:
    """The enrichment of a restart is resolved and can be applied."""

    restart_no: int
    payload: Any


@dataclass(frozen=True, slots=True)
class WorkerCrashed:
    """A tool-side or restart-side worker failed in a way that is not a tool result."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Kill:
    """A stop: the user's `/kill`, a stop already asked for on the channel, or the stale-lock
    sweeper's; who asked is told to the workers' abort signals, not carried here."""


@dataclass(frozen=True, slots=True)
class FollowUp:
    pass


TurnEvent: TypeAlias = (
    FirstToken | StreamEnded | StreamCrashed | StreamSettled | ToolFinished | RestartReady
    | WorkerCrashed | Kill | FollowUp
)
