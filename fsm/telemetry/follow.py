"""Turns followed through the engine's observer hook, told as the facts telemetry needs: a
turn began, a state was left, a provider pass ended (with its usage and finish reason), the
tool calls of a ToolCall visit, the turn ended (and how long a kill took).

The engine calls its observer on every transition between states, with the turn; everything
else is read from the turn's public record at that moment. Tool calls run one after another
inside ToolCall and their boundaries are internal transitions (`turn.internal_transitions`,
which the observer is not called for), so a visit's calls are rebuilt when it leaves ToolCall:
its n-th call ends at the n-th internal `tool_result`/`tool_timeout`, the last one at the
transition out, and each next call starts where the one before it ended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..engine.result import PassResult
from ..engine.table import TERMINAL, State

if TYPE_CHECKING:
    from ..engine.turn import Turn

PASS_STATES = frozenset({State.AWAITING_FIRST_TOKEN.value, State.STREAMING.value,
                         State.SETTLING.value})
TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)
TOOL_CALL = State.TOOL_CALL.value
log = logging.getLogger(__name__)
_CALL_BOUNDARIES = frozenset({"tool_result", "tool_timeout"})

ToolOutcome = Literal["ok", "error", "timeout", "restart", "killed", "nameless", "crashed"]
TIMEOUT_PHASE_BY_EVENT = {"first_token_timeout": "first_token", "idle_timeout": "idle",
                          "settle_timeout": "settle", "tool_timeout": "tool"}
"""The timer edges and the phase a timeout metric names them by."""
GEN_AI_PROVIDER_NAMES = {"openai": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini"}
"""The project's provider kinds and the `gen_ai.provider.name` values the conventions use."""


def provider_and_model(provider_name: str) -> tuple[str, str | None]:
    """`openai:gpt-4o-mini` (the HTTP adapters' name) as (provider, model); a name without a
    model (a scripted provider) is the provider alone."""
    kind, _, model = provider_name.partition(":")
    return GEN_AI_PROVIDER_NAMES.get(kind, kind), model or None


@dataclass(frozen=True, slots=True)
class ToolCallFacts:
    """One tool call of a ToolCall visit, in seconds from the turn's start."""

    name: str
    call_id: str | None
    start: float
    end: float
    outcome: ToolOutcome
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StateVisit:
    """A stay in one state, from the transition that entered it to the one that left it."""

    state: str
    entered: float
    left: float
    left_by: str
    tool_calls: tuple[ToolCallFacts, ...] = ()


@dataclass(frozen=True, slots=True)
class PassFacts:
    """One provider call: from `begin` to the transition that left the pass states."""

    index: int
    start: float
    end: float
    ended_by: str
    result: PassResult | None


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """How the turn ended; `kill_latency` is the seconds from the stop request to the moment
    the turn reached Stopped (by the clock, not the transition's input-arrival time)."""

    state: str
    status: str
    at: float
    ended_by: str
    passes: int
    error: str | None
    kill_latency: float | None


class TurnListener(Protocol):
    """What the tracer and the metrics implement; every time is seconds from the turn's
    start on the engine's clock."""

    def turn_started(self, turn: Turn) -> None: ...
    def state_left(self, turn: Turn, visit: StateVisit) -> None: ...
    def pass_started(self, turn: Turn, index: int, at: float) -> None: ...
    def pass_ended(self, turn: Turn, facts: PassFacts) -> None: ...
    def timed_out(self, turn: Turn, phase: str, at: float) -> None: ...
    def turn_ended(self, turn: Turn, end: TurnEnd) -> None: ...


@dataclass(slots=True)
class _Followed:
    state: str
    entered: float = 0.0
    pass_index: int = 0
    pass_start: float = 0.0
    tool_names: list[str] = field(default_factory=list)
    history_mark: int = 0
    internal_mark: int = 0


def _error_of(result: dict[str, Any]) -> str | None:
    error = result.get("error")
    return str(error) if error else None


class TurnFollower:
    """A TurnObserver that tells its listeners what happened, turn by turn (several turns may
    run at once, each with its own record)."""

    def __init__(self, *listeners: TurnListener) -> None:
        self.listeners = listeners
        self._turns: dict[int, _Followed] = {}

    @property
    def following(self) -> int:
        """Turns seen begin and not yet ended."""
        return len(self._turns)

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        try:
            self._follow(turn, t, event, source, dest)
        except Exception:
            log.exception("telemetry could not follow %s %s -> %s", event, source, dest)
            if dest in TERMINAL_NAMES:
                self._turns.pop(id(turn), None)

    def _follow(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        followed = self._turns.get(id(turn))
        if followed is None:
            followed = self._turns[id(turn)] = _Followed(state=source)
            self._tell(lambda each: each.turn_started(turn))
        if event in TIMEOUT_PHASE_BY_EVENT and dest != State.STOPPED.value:
            self._timed_out(turn, TIMEOUT_PHASE_BY_EVENT[event], t)
        if source == TOOL_CALL:
            self._timed_out_between_calls(turn, followed)
        visit = StateVisit(source, followed.entered, t, event,
                           self._tool_calls(turn, followed, t, event)
                           if source == TOOL_CALL else ())
        self._tell(lambda each: each.state_left(turn, visit))
        if source in PASS_STATES and dest not in PASS_STATES:
            passes = turn.pass_results
            last = passes[-1] if passes else None
            facts = PassFacts(followed.pass_index, followed.pass_start, t, event, last)
            followed.tool_names = list(last.tool_calls) if last is not None else []
            self._tell(lambda each: each.pass_ended(turn, facts))
        if event == "begin":
            followed.pass_index += 1
            followed.pass_start = t
            self._tell(lambda each: each.pass_started(turn, followed.pass_index, t))
        if dest == TOOL_CALL:
            followed.history_mark = len(turn.function_history)
            followed.internal_mark = len(turn.internal_transitions)
        followed.state, followed.entered = dest, t
        if dest in TERMINAL_NAMES:
            del self._turns[id(turn)]
            # The transition's time is when its input arrived (the kill's, for replay), so
            # the latency is read from the clock now, as the turn reaches Stopped.
            asked = turn.stop_requested_at
            latency = max(0.0, turn.elapsed - asked) if asked is not None and \
                dest == State.STOPPED.value else None
            end = TurnEnd(dest, turn.status or "error", t, event, len(turn.pass_results),
                          turn.error, latency)
            self._tell(lambda each: each.turn_ended(turn, end))

    def _tell(self, call: Callable[[TurnListener], None]) -> None:
        """Telemetry never ends a turn: a listener that raises is logged and skipped."""
        for listener in self.listeners:
            try:
                call(listener)
            except Exception:
                log.exception("telemetry listener %s failed", type(listener).__name__)

    def _timed_out(self, turn: Turn, phase: str, at: float) -> None:
        self._tell(lambda each: each.timed_out(turn, phase, at))

    def _boundaries(self, turn: Turn, followed: _Followed) -> list[dict[str, Any]]:
        return [tr for tr in turn.internal_transitions[followed.internal_mark:]
                if tr.get("state") == TOOL_CALL and tr.get("event") in _CALL_BOUNDARIES]

    def _timed_out_between_calls(self, turn: Turn, followed: _Followed) -> None:
        """A call that timed out with more queued is an internal transition: counted here."""
        for tr in self._boundaries(turn, followed):
            if tr["event"] == "tool_timeout":
                self._timed_out(turn, "tool", float(tr["t"]))

    def _tool_calls(self, turn: Turn, followed: _Followed, t: float,
                    event: str) -> tuple[ToolCallFacts, ...]:
        """The calls of the ToolCall visit that ends at `t` by `event`."""
        ends = [(float(tr["t"]), str(tr["event"])) for tr in self._boundaries(turn, followed)]
        ends.append((t, event))
        entries = turn.function_history[followed.history_mark:]
        names = followed.tool_names
        calls: list[ToolCallFacts] = []
        start = followed.entered
        for n, (end, how) in enumerate(ends):
            entry = entries[n] if n < len(entries) else None
            name = entry.tool_name if entry is not None else (names[n] if n < len(names) else "")
            outcome: ToolOutcome
            error = None
            if how == "tool_timeout":
                outcome = "timeout"
            elif entry is not None:
                outcome = "ok" if entry.success else "error"
                error = None if entry.success else _error_of(entry.result)
            elif how == "restart_requested":
                outcome = "restart"
            elif how == "kill":
                outcome = "killed"
            elif how == "nameless_call":
                outcome = "nameless"
            else:
                outcome = "crashed"
            if entry is not None and how == "tool_timeout":
                error = _error_of(entry.result)
            calls.append(ToolCallFacts(name or "(nameless)", entry.call_id if entry else None,
                                       start, end, outcome, error))
            start = end
        return tuple(calls)
