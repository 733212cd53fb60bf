"""The turn's state machine, declared once as data.

The runtime machine, the diagrams and the path tests are all built from this table. A row is
one edge: its trigger, the states it leaves, the state it enters (None: an internal
transition that stays put), the driver's callback it runs after the transition, what that
does, and the guards that must hold. Rows of one trigger are tried in order; the first whose
guards hold is taken. The machine checks every callback and guard name when it is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class State(StrEnum):
    PREPARING = "Preparing"
    AWAITING_FIRST_TOKEN = "AwaitingFirstToken"
    STREAMING = "Streaming"
    SETTLING = "Settling"
    TOOL_CALL = "ToolCall"
    CONTEXT_RESTART = "ContextRestart"
    DONE = "Done"
    TIMED_OUT = "TimedOut"
    STOPPED = "Stopped"


STATES: tuple[State, ...] = tuple(State)
TERMINAL: frozenset[State] = frozenset({State.DONE, State.TIMED_OUT, State.STOPPED})
NON_TERMINAL: tuple[State, ...] = tuple(s for s in STATES if s not in TERMINAL)
STREAM_STATES: tuple[State, ...] = (State.AWAITING_FIRST_TOKEN, State.STREAMING)

EdgeKind = Literal["flow", "timer", "kill", "worker", "error"]


@dataclass(frozen=True, slots=True)
class Edge:
    trigger: str
    sources: tuple[State, ...]
    dest: State | None
    kind: EdgeKind
    callback: str
    """The driver's method the edge runs after its transition: short and synchronous."""
    does: str
    guards: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()


def _edge(
    trigger: str,
    sources: State | tuple[State, ...],
    dest: State | None,
    kind: EdgeKind,
    callback: str,
    does: str,
    guards: tuple[str, ...] = (),
    unless: tuple[str, ...] = (),
) -> Edge:
    srcs = sources if isinstance(sources, tuple) else (sources,)
    return Edge(trigger, srcs, dest, kind, callback, does, guards, unless)


P, A, S, ST = State.PREPARING, State.AWAITING_FIRST_TOKEN, State.STREAMING, State.SETTLING
TC, CR = State.TOOL_CALL, State.CONTEXT_RESTART
DONE, TIMED_OUT, STOPPED = State.DONE, State.TIMED_OUT, State.STOPPED

TABLE: tuple[Edge, ...] = (
    _edge("iteration_cap", P, DONE, "flow", "on_iteration_cap",
          "post the max_iterations notice; status timeout (T1)"),
    _edge("begin", P, A, "flow", "on_begin",
          "fold the prefill, set the reply target, fresh abort and kill handle, arm the "
          "first-token deadline, start the stream worker (S1-S4, S7)"),
    _edge("first_token", A, S, "worker", "on_first_token",
          "switch the deadline to the rolling idle budget (S5)"),
    _edge("first_token_timeout", A, STOPPED, "timer", "on_stream_timeout",
          "a stop is pending: stop at once, no settle wait (S9)", guards=("stop_pending",)),
    _edge("first_token_timeout", A, ST, "timer", "on_stream_timeout",
          "abort the stream; wait for it to settle (S10)"),
    _edge("idle_timeout", S, STOPPED, "timer", "on_stream_timeout",
          "a stop is pending: stop at once, no settle wait (S9)", guards=("stop_pending",)),
    _edge("idle_timeout", S, ST, "timer", "on_stream_timeout",
          "abort the stream; wait for it to settle (S10)"),
    _edge("settled", ST, TIMED_OUT, "worker", "on_settled",
          "keep the landed text; metric and phase-aware notice or deferral (S10-S13)"),
    _edge("settle_timeout", ST, TIMED_OUT, "timer", "on_settle_timeout",
          "give up on the abandoned call; metric and notice or deferral (S10-S13)"),
    _edge("completed", S, DONE, "worker", "on_stream_end", "status completed"),
    _edge("empty_after_text", A, DONE, "worker", "on_empty_after_text",
          "status completed: the pass after a tool is empty, but this turn already delivered "
          "text and the tool did not require a follow-up (T10)",
          guards=("delivered_text_stands",)),
    _edge("empty", A, DONE, "worker", "on_stream_end",
          "status empty_response: the stream ended with no text"),
    _edge("delivery_cap", S, DONE, "worker", "on_delivery_cap",
          "the reply reached its delivery bound: the stream is cut there; post the "
          "delivery_cap notice; status delivery_cap (D5)"),
    _edge("provider_error", (A, S), DONE, "worker", "on_stream_end", "status error (S8)"),
    _edge("tool_call", (A, S), TC, "worker", "on_tool_call",
          "keep the pre-tool text for the history entry (T7); queue the calls"),
    _edge("follow_up", (A, S), DONE, "flow", "on_follow_up",
          "a follow-up interrupts the stream: status follow_up_interrupt (S17)",
          guards=("follow_up_may_interrupt",)),
    _edge("follow_up", (A, S, ST, TC, CR), None, "flow", "on_follow_up",
          "keep the follow-up queued for after this turn (T3)"),
    _edge("nameless_call", TC, DONE, "flow", "on_nameless_call", "status error (T2)"),
    _edge("tool_result", TC, DONE, "worker", "on_tool_outcome",
          "post the tool_error_loop notice; status error (T6)", guards=("error_cap_reached",)),
    _edge("tool_result", TC, None, "worker", "on_tool_outcome",
          "record the outcome; run the next queued call", guards=("calls_pending",)),
    _edge("tool_ended_turn", TC, DONE, "worker", "on_tool_outcome",
          "record the outcome; the batch's last call is done and a tool's loop policy ends "
          "the turn (it delivered the reply itself, or visible text came before it): status "
          "completed (T9)", guards=("tool_policy_ends_turn",)),
    _edge("tool_result", TC, P, "worker", "on_tool_outcome", "record the outcome; next pass"),
    _edge("tool_timeout", TC, DONE, "timer", "on_tool_outcome",
          "post the tool_error_loop notice; status error (T6)", guards=("error_cap_reached",)),
    _edge("tool_timeout", TC, None, "timer", "on_tool_outcome",
          "a failed result the model sees; run the next queued call (T5)",
          guards=("calls_pending",)),
    _edge("tool_timeout", TC, P, "timer", "on_tool_outcome",
          "a failed result the model sees; next pass (T5)"),
    _edge("restart_requested", TC, CR, "worker", "on_restart_requested",
          "no ordinary history entry for the call (R1, R10)"),
    _edge("restart", CR, P, "flow", "on_restart",
          "apply the enrichment, set its disable flag, reset the tool-error counters, "
          "advance the iteration (R2-R9)"),
    _edge("kill", NON_TERMINAL, STOPPED, "kill", "on_kill",
          "abort the pass and the tool; status stopped_by_user (S7, S16, T5)"),
    _edge("crash", NON_TERMINAL, DONE, "error", "on_crash",
          "an unexpected exception: status error, cleanup still runs (S15)"),
)

CRASH_SOURCES: frozenset[str] = frozenset(
    src.value for edge in TABLE if edge.trigger == "crash" for src in edge.sources
)
TRIGGERS: tuple[str, ...] = tuple(dict.fromkeys(edge.trigger for edge in TABLE))


def edge_keys() -> set[tuple[str, str, str]]:
    """Every (trigger, source, dest) edge of the table; internal edges have dest == source."""
    return {
        (edge.trigger, src.value, (edge.dest or src).value)
        for edge in TABLE
        for src in edge.sources
    }
