"""Shared machinery of the reliability suite (RELIABILITY.md).

One scenario generator serves both Hypothesis (shrinkable draws) and the soak (a seeded
`random.Random`), so the soak plays the same kind of turns the model-based tests check. The
oracle `check_played` states, for any played scenario, everything docs/spec.md lets us predict
without knowing the answer in advance: one terminal state, a walk over declared edges,
status matching the terminal state, timers firing at exactly their budget, the kill and the
follow-up honoured at once, delivered text kept, the stash within bounds, nothing left running.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import os
import random
import time
import tracemalloc
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from fsm.engine.config import TurnConfig
from fsm.engine.details import details_suffix
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.result import TurnResult
from fsm.engine.stash import ContextStash
from fsm.engine.table import TERMINAL, edge_keys
from fsm.engine.turn import Turn, shared_machine
from fsm.journal import jsonable
from fsm.review.replay import replay_difference
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import Played, play, run_virtual
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider, ScriptedTools, history_items
from providers.replay_server import ReplayServer

from engine_support import check_invariants

T = TypeVar("T")

PROFILE = os.environ.get("RELIABILITY_PROFILE", "ci")
NIGHTLY = PROFILE == "nightly"
EPS = 2e-6
"""Float equality for virtual times: looptime's clock ticks in whole microseconds (a time off
that grid happens on the next tick) and the journal rounds to 6 decimals; not a timing
margin."""

TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)
EDGES = edge_keys()


def reliability_settings(ci_examples: int, nightly_factor: int = 20, **extra: Any) -> settings:
    """CI: a fixed, derandomized budget so every run checks the same cases. Nightly
    (`RELIABILITY_PROFILE=nightly`): many more random cases, failures kept in the database."""
    checks = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    if NIGHTLY:
        return settings(max_examples=ci_examples * nightly_factor, deadline=None,
                        suppress_health_check=checks, **extra)
    return settings(max_examples=ci_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=checks, print_blob=True, **extra)


# ---------------------------------------------------------------------------------- draws


class Rand(Protocol):
    """The few kinds of choice the generator makes; backed by Hypothesis or by `random`."""

    def integer(self, lo: int, hi: int) -> int: ...
    def choice(self, options: Sequence[T]) -> T: ...
    def chance(self, percent: int) -> bool: ...


@functools.cache
def _integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    """One strategy per range, built once: a scenario makes some hundred draws, and building
    a strategy per draw (`st.sampled_from` of a fresh tuple cannot be cached by Hypothesis)
    was most of the cost of drawing one."""
    return st.integers(lo, hi)


class HypothesisRand:
    """Draws from a Hypothesis `data` object, so failing scenarios shrink. Every choice is an
    integer draw (a choice is its index, which shrinks to the first option as
    `sampled_from` does), from strategies built once."""

    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self._draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return int(self._draw(_integers(lo, hi)))

    def choice(self, options: Sequence[T]) -> T:
        return options[int(self._draw(_integers(0, len(options) - 1)))]

    def chance(self, percent: int) -> bool:
        # shrinks towards 0, i.e. towards "no": fewer optional features in a minimal case
        return bool(self._draw(_integers(0, 99)) >= 100 - percent)


class SeededRand:
    """Draws from `random.Random(seed)`, for the soak and its command."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, hi)

    def choice(self, options: Sequence[T]) -> T:
        return self._rng.choice(list(options))

    def chance(self, percent: int) -> bool:
        return self._rng.randrange(100) < percent


# ----------------------------------------------------------------------------- generator

ENRICHING_TOOLS: dict[str, str] = {
    "peek_profile_picture": "image",
    "process_gif": "gif",
    "summarize_youtube": "youtube",
    "reveal_message_metadata": "message_metadata",
}
PLAIN_TOOLS = ("search", "calculator")
CALLABLE_NAMES = (*PLAIN_TOOLS, *ENRICHING_TOOLS, "not_listed", "")
TEXTS = ("Hi", " there", "\n\n", "ünïcødé ✓ ", "```py\nx = 1\n```", "x" * 40, "")
STASH_NAMES = ("avatar", "frames", "junk")
VALID_ITEM = {"role": "user", "parts": [{"type": "text", "text": "<media>"}]}


@dataclass(frozen=True, slots=True)
class Budgets:
    """The effective budgets of a generated config (after the engine's clamping)."""

    first_token: float
    idle: float
    settle: float
    tool: float

    @classmethod
    def of(cls, config: dict[str, Any]) -> Budgets:
        cfg = TurnConfig.model_validate(config)
        return cls(cfg.first_token_timeout_s, cfg.idle_timeout_s, cfg.settle_timeout_s,
                   cfg.tool_timeout_s)

    def gaps(self) -> tuple[float, ...]:
        """Step gaps that land before, on and after each budget: ties are where bugs hide."""
        return (0.0, 0.5, 1.0, 2.5, self.idle - 0.5, self.idle, self.idle + 0.5,
                self.first_token - 0.5, self.first_token)


def gen_config(r: Rand) -> dict[str, Any]:
    """Any valid configuration, with small caps so loops and caps are reached."""
    cfg: dict[str, Any] = {}
    options: dict[str, Sequence[Any]] = {
        "first_token_timeout_s": (5.0, 20.0, 45.0, 300.0),
        "idle_timeout_s": (5.0, 10.0, 15.0, 120.0),
        "settle_timeout_s": (0.0, 0.5, 2.0, 5.0),
        "tool_timeout_s": (1.0, 7.5, 30.0),
        "max_iterations": (1, 2, 3, 5, 8),
        "soft_warn_iteration": (1, 2, 3, 20),
        "max_consecutive_tool_errors": (2, 1, 3, 5),
        "stash_ttl_s": (1.0, 30.0, 300.0),
        "stash_max_items": (1, 2, 16),
        "stash_max_bytes": (64, 4096, 64 * 1024 * 1024),
        "drafting": (False, True),
        "surface_user_errors": (True, False),
        "fallback_pending": (False, True),
        "max_follow_up_interrupts": (0, 1, 3),
    }
    for key, values in options.items():
        if r.chance(70):
            cfg[key] = r.choice(values)
    return cfg


def _time(r: Rand, b: Budgets, previous: float) -> float:
    """Mostly short gaps, so turns get far; sometimes a gap right around a budget; and times
    off the virtual clock's grid, as recorded journals have them."""
    gap = r.choice(b.gaps()) if r.chance(15) else r.choice((0.0, 0.5, 1.0, 2.5))
    if r.chance(20):
        gap += r.choice((0.1, 1e-6, 0.333333, 5.660298))
    return previous + gap


def gen_step_end(r: Rand, at: float, stash_refs: Sequence[str]) -> dict[str, Any] | None:
    if r.chance(50):
        return {"at": at, "tool_call": _call(r)}
    kind = r.choice(("none", "completed", "empty", "stall", "tool_calls", "error", "raise",
                     "stall", "tool_call"))
    if kind == "none":
        return None
    if kind in ("completed", "empty"):
        return {"at": at, "end": kind}
    if kind == "tool_call":
        return {"at": at, "tool_call": _call(r)}
    if kind == "tool_calls":
        return {"at": at, "tool_calls": [_call(r) for _ in range(r.integer(0, 3))]}
    if kind == "error":
        return {"at": at, "error": "overloaded"}
    if kind == "raise":
        return {"at": at, "raise": "connection reset"}
    stall: dict[str, Any] = {"at": at, "stall": True,
                             "settles_after": r.choice((0.0, 0.5, 2.0, 5.0, 9.0))}
    if r.chance(50):
        stall["lands"] = r.choice(TEXTS[:-1])
    return stall


def _call(r: Rand) -> dict[str, Any]:
    call: dict[str, Any] = {"name": r.choice(CALLABLE_NAMES) if r.chance(85) else "search",
                            "args": r.choice(({}, {"q": "cats"}, {"n": 3}, [1, 2], "text"))}
    if r.chance(10):
        call["truncated"] = True
    if r.chance(30):
        call["id"] = f"call_{r.integer(1, 9)}"
    return call


def gen_pass(r: Rand, b: Budgets, stash_refs: Sequence[str]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    at = 0.0
    for _ in range(r.integer(0, 4)):
        at = _time(r, b, at)
        kind = r.choice(("text", "text", "text", "keepalive", "empty"))
        if kind == "keepalive":
            steps.append({"at": at, "keepalive": True})
        else:
            steps.append({"at": at, "text": "" if kind == "empty" else r.choice(TEXTS[:-1])})
    end = gen_step_end(r, _time(r, b, at), stash_refs)
    if end is not None:
        steps.append(end)
    return steps


def _restart_data(r: Rand, kind: str, stash_refs: Sequence[str]) -> dict[str, Any]:
    if kind == "message_metadata":
        return {"type": "context_restart_message_metadata"}
    transport = r.choice(("stash", "stash", "inline", "bad_inline", "bad_key", "none"))
    data: dict[str, Any] = {"type": f"context_restart_{kind}"}
    if transport == "stash":
        data["pending_context_key"] = f"$stash:{r.choice(stash_refs)}"
    elif transport == "inline":
        data["enhanced_context_item"] = {"role": "user", "content": f"<{kind} summary>"}
    elif transport == "bad_inline":
        data["enhanced_context_item"] = {"no_role": True}
    elif transport == "bad_key":
        data["pending_context_key"] = 42
    return data


def gen_outcome(r: Rand, b: Budgets, tool: str, stash_refs: Sequence[str]) -> dict[str, Any]:
    after = r.choice((0.0, 0.5, 2.0, b.tool - 0.5, b.tool, b.tool + 1.0))
    kind = r.choice(("success", "failure", "success", "hang", "success", "raise", "success"))
    if kind == "hang":
        return {"hang": True}
    if kind == "raise":
        return {"after": after, "raise": "tool exploded"}
    if kind == "failure":
        return {"after": after, "success": False, "error": "not found"}
    enrichment = ENRICHING_TOOLS.get(tool)
    if enrichment is not None and r.chance(80):
        data = _restart_data(r, enrichment, stash_refs)
    else:
        ordinary: tuple[Any, ...] = ({"answer": 42}, {"type": "ordinary"}, {"type": 7}, None,
                                     {"type": "context_restart_unknown_kind"})
        data = r.choice(ordinary)
    return {"after": after, "success": True, "data": data}


def gen_scenario(r: Rand, name: str = "generated") -> dict[str, Any]:
    """A scenario in the docs/scenarios.md format exercising every step, outcome and event kind."""
    config = gen_config(r)
    b = Budgets.of(config)
    stash: dict[str, Any] = {}
    for stash_name in STASH_NAMES[: r.integer(0, len(STASH_NAMES))]:
        item: dict[str, Any] = dict(VALID_ITEM) if stash_name != "junk" else {"not": "an item"}
        if r.chance(30):
            item["stash_at"] = r.choice((1.0, b.idle, b.first_token + 1.0))
        stash[stash_name] = item
    stash_refs = (*stash, "never_stashed")
    tools: dict[str, Any] = {}
    for tool in (*PLAIN_TOOLS, *ENRICHING_TOOLS):
        if not r.chance(70):
            continue
        outcomes = [gen_outcome(r, b, tool, stash_refs) for _ in range(r.integer(0, 4))]
        guard = ENRICHING_TOOLS.get(tool)
        tools[tool] = {"guard": guard, "outcomes": outcomes} if guard and r.chance(70) \
            else outcomes
    history = [{"id": f"m{i}", "author": r.choice(("ana", "bo")), "content": "hello",
                "at": "2026-11-30T12:00:00Z",
                "reactions": [{"emoji": "👍", "users": ["bo", "cy"][: r.integer(0, 2)]}]}
               for i in range(r.integer(0, 2))]
    events: list[dict[str, Any]] = []
    for _ in range(r.integer(0, 3) if r.chance(50) else 0):
        at = r.choice((0.5 * r.integer(0, 8), b.idle, b.idle + 1.0, b.first_token,
                       b.first_token + b.settle, b.tool, 2.5 * r.integer(1, 200)))
        events.append({"at": at, "kill": True} if r.chance(40) else {"at": at, "follow_up": True})
    return {"name": name, "config": config,
            "passes": [gen_pass(r, b, stash_refs)
                       for _ in range(r.integer(1, 6) if r.chance(90) else 0)],
            "tools": tools, "stash": stash, "history": history, "events": events}


@st.composite
def scenarios(draw: st.DrawFn, name: str = "generated") -> dict[str, Any]:
    """Hypothesis strategy of generated scenarios."""
    return gen_scenario(HypothesisRand(draw), name)


# -------------------------------------------------------------------------------- oracle


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= EPS


def _pass_schedule(steps: Sequence[Any], begin: float) -> list[tuple[float, Any]]:
    """When each scripted step happens: a step whose time already passed runs at once."""
    out: list[tuple[float, Any]] = []
    now = begin
    for step in steps:
        now = max(now, begin + step.at)
        out.append((now, step))
    return out


def _content_times(schedule: list[tuple[float, Any]]) -> list[float]:
    return [t for t, step in schedule if step.kind == "text" and step.text]


def _state_at(transitions: list[dict[str, Any]], t: float) -> str | None:
    """The state strictly around time t, or None when a transition happens exactly then."""
    state = "Preparing"
    for line in transitions:
        if _close(line["t"], t):
            return None
        if line["t"] > t:
            break
        state = line["to"]
    return state


STATUS_BY_LAST_EVENT: dict[str, str] = {
    "completed": "completed", "empty": "empty_response", "provider_error": "error",
    "follow_up": "follow_up_interrupt", "iteration_cap": "timeout", "nameless_call": "error",
    "tool_result": "error", "tool_timeout": "error", "crash": "error",
    "empty_after_text": "completed", "tool_ended_turn": "completed",
    "delivery_cap": "delivery_cap",
}


def check_played(
    played: Played,
    raw: dict[str, Any],
    *,
    channel_keeps_record: bool = False,
    delivery_may_fail: bool = False,
) -> None:
    """Every invariant a played scenario must satisfy (module docstring); raises on the first
    violation with the scenario in the message.

    For turns played outside `play` (the attempts of a generation turn):
    `channel_keeps_record` is for a channel that buffers and reports what it really sent (a
    Discord channel): the turn's delivered text is then the channel's record, not the passes'
    texts, and the caller checks it; `delivery_may_fail` is for a channel whose sends may fail:
    the pass then crashes at the chunk (or the pass end) whose send raised, not at the end of
    its script."""
    try:
        _check_played(played, raw, channel_keeps_record, delivery_may_fail)
    except AssertionError as exc:
        exc.add_note(f"scenario: {json.dumps(raw, ensure_ascii=False)}")
        exc.add_note(f"journal: {played.transitions}")
        raise


def _check_played(
    played: Played, raw: dict[str, Any], channel_keeps_record: bool, delivery_may_fail: bool
) -> None:
    scenario = parse_scenario(raw)
    cfg = scenario.turn_config()
    turn = played.turn
    result = played.result
    lines = played.transitions

    # S14, D4: one terminal state, nothing left, lock and handles clear (engine_support)
    check_invariants(played)
    assert lines, "a turn always takes at least one transition"
    terminal_at = [i for i, line in enumerate(lines) if line["to"] in TERMINAL_NAMES]
    assert terminal_at == [len(lines) - 1], "exactly one terminal state, the last line"
    last = lines[-1]
    assert result.state == last["to"] == turn.state
    end_t = last["t"]

    # the path is a walk over declared edges, in time order
    state, t_prev = "Preparing", 0.0
    for line in lines:
        assert line["from"] == state, f"{line} does not leave {state}"
        assert line["from"] != line["to"], f"{line}: internal transitions are not path lines"
        assert (line["event"], line["from"], line["to"]) in EDGES, f"undeclared edge {line}"
        assert line["t"] >= t_prev - EPS, f"time goes back at {line}"
        state, t_prev = line["to"], line["t"]
    for internal in turn.internal_transitions:
        key = (internal["event"], internal["state"], internal["state"])
        assert key in EDGES, f"undeclared internal edge {internal}"
        assert -EPS <= internal["t"] <= end_t + EPS

    # status matches the terminal state (S9, S13, S15, S16, S17, T1, T2, T6)
    status = result.status
    if last["to"] == "Stopped":
        assert status == "stopped_by_user"
        assert last["event"] in ("kill", "first_token_timeout", "idle_timeout")
    elif last["to"] == "TimedOut":
        assert status == "timeout" and last["event"] in ("settled", "settle_timeout")
        assert len(lines) >= 2 and lines[-2]["to"] == "Settling"
    else:
        assert status == STATUS_BY_LAST_EVENT[last["event"]], (status, last)

    # passes: one provider call per `begin`, within the iteration cap (T1)
    begins = [line for line in lines if line["event"] == "begin"]
    assert len(result.passes) == len(begins) == played.provider.calls
    assert len(begins) <= cfg.max_iterations
    if last["event"] == "iteration_cap":
        assert len(begins) == cfg.max_iterations
    assert [p.index for p in result.passes] == list(range(1, len(begins) + 1))
    assert all(p.status != "function_call" for p in result.passes[-1:]) or \
        last["from"] in ("ToolCall", "ContextRestart", "Preparing")

    # delivered text is kept: the channel received exactly the passes' texts, in order (S13)
    if not channel_keeps_record:
        assert result.delivered_text == "".join(p.text for p in result.passes)
        # text that landed after the abort (S10) stays visible but is in the result only when
        # the pass settled in time; it can only be the end of the last pass
        assert played.channel.text == result.delivered_text + landed_out_of(played), \
            "the channel and the result disagree on the delivered text"
    if last["event"] == "empty_after_text":  # T10: the turn is what it already delivered
        assert result.text == result.delivered_text and result.delivered_text.strip()
    else:
        assert result.text == (result.passes[-1].text if result.passes else "") + \
            details_suffix([p.details for p in result.passes])

    # notices and metrics (S11, S12, S16, T1, T6)
    expected_notices: list[str] = []
    loud = cfg.surface_user_errors  # off: no user-facing error notice of any kind (G2)
    if len(begins) > cfg.soft_warn_iteration and loud:  # before the 21st call (T1)
        expected_notices.append("still_working")
    timeout_kind: str | None = None
    if last["to"] == "TimedOut":
        phase = "first_token" if lines[-2]["event"] == "first_token_timeout" else "idle"
        assert result.metrics == [{"name": "stream_sdk_timeout", "phase": phase}]
        timeout_kind = f"timeout_{phase}"
    else:
        assert result.metrics == []
    if timeout_kind and cfg.surface_user_errors and not cfg.fallback_pending:
        expected_notices.append(timeout_kind)
    if last["event"] == "iteration_cap" and loud:
        expected_notices.append("max_iterations")
    if last["event"] in ("tool_result", "tool_timeout") and loud:
        expected_notices.append("tool_error_loop")
    if last["event"] == "delivery_cap" and loud:
        expected_notices.append("delivery_cap")
    assert result.notices == expected_notices, (result.notices, expected_notices)
    assert [n.kind for n in played.channel.notices] == expected_notices
    deferred = timeout_kind if timeout_kind and cfg.surface_user_errors \
        and cfg.fallback_pending else None
    assert result.deferred_notice == deferred

    # the tool-error count (T6, R9)
    if last["event"] in ("tool_result", "tool_timeout"):
        assert result.consecutive_tool_errors == cfg.max_consecutive_tool_errors
    else:
        assert result.consecutive_tool_errors < cfg.max_consecutive_tool_errors

    # the stash stays within its bounds (R3)
    assert result.stash_items == len(played.stash) <= cfg.stash_max_items
    assert 0 <= played.stash.total_bytes <= cfg.stash_max_bytes

    _check_timers(played, scenario, cfg, delivery_may_fail)
    _check_events(played, scenario, cfg)


def landed_out_of(played: Played) -> str:
    """Text that landed after the last pass was aborted and is not in the result: visible in
    the channel, not in the delivered text a fallback continues from (S10)."""
    run = played.turn._passes.run
    transitions = played.transitions
    if run is None or (transitions and transitions[-1]["event"] == "settled"):
        return ""
    return "".join(run.landed)


def _check_timers(
    played: Played, scenario: Any, cfg: TurnConfig, delivery_may_fail: bool = False
) -> None:
    """Every timer fired exactly at its budget after the event that armed it (S4, S5, S10,
    T5); every worker event at the time its script says."""
    lines = played.transitions
    begin_times = [line["t"] for line in lines if line["event"] == "begin"]
    pass_no = 0
    schedule: list[tuple[float, Any]] = []
    tool_starts: list[float] = []
    content: list[float] = []
    begin_t = 0.0
    timeout_at: float | None = None
    for line in lines:
        event, t = line["event"], line["t"]
        if event == "begin":
            begin = begin_times[pass_no]
            steps = scenario.passes[pass_no] if pass_no < len(scenario.passes) else []
            schedule = _pass_schedule(steps, begin)
            pass_no += 1
            content = _content_times(schedule)
            begin_t = begin
        elif event == "first_token":
            assert content and _close(t, content[0]), f"first token at {t}, script {content}"
        elif event == "first_token_timeout":
            assert _close(t, begin_t + cfg.first_token_timeout_s), f"first-token timer at {t}"
            assert not [c for c in content if c < t - EPS], "a token came before the timeout"
            timeout_at = t
        elif event == "idle_timeout":
            armed = t - cfg.idle_timeout_s
            assert any(_close(c, armed) for c in content), f"idle timer at {t}, script {content}"
            assert not [c for c in content if armed + EPS < c < t - EPS], "idle timer not re-armed"
            timeout_at = t
        elif event in ("settled", "settle_timeout"):
            assert timeout_at is not None
            delays = _settle_delays(schedule, timeout_at)
            if event == "settle_timeout":
                assert _close(t, timeout_at + cfg.settle_timeout_s), f"settle timer at {t}"
                assert any(d >= cfg.settle_timeout_s - EPS for d in delays), (delays, line)
            else:
                assert any(_close(t, timeout_at + d) for d in delays), (delays, line)
                assert any(d <= cfg.settle_timeout_s + EPS for d in delays)
        elif event in ("completed", "empty", "empty_after_text", "provider_error",
                       "tool_call") or \
                (event == "crash" and line["from"] in ("AwaitingFirstToken", "Streaming")):
            ending = [st_t for st_t, step in schedule if step.kind in
                      ("end", "error", "raise", "tool_call", "tool_calls")]
            if delivery_may_fail and event == "crash":
                # a send that failed crashes the pass at a chunk or at the pass's end
                assert any(_close(t, c) for c in (*content, *ending[:1])), \
                    f"crash at {t}, chunks at {content}, script ends at {ending}"
            else:
                assert ending and _close(t, ending[0]), \
                    f"{event} at {t}, script ends at {ending}"
        if line["to"] == "ToolCall":
            tool_starts = [t]
        if event == "tool_timeout":
            armed = t - cfg.tool_timeout_s
            starts = tool_starts + [i["t"] for i in played.turn.internal_transitions
                                    if i["state"] == "ToolCall" and
                                    i["event"] in ("tool_result", "tool_timeout")
                                    and tool_starts and i["t"] >= tool_starts[0] - EPS]
            assert any(_close(s, armed) for s in starts), f"tool timer at {t}, starts {starts}"
            assert not [s for s in starts if armed + EPS < s < t - EPS]


def _settle_delays(schedule: list[tuple[float, Any]], aborted_at: float) -> set[float]:
    """How long after the abort the scripted stream may settle: a stall settles after its
    `settles_after`; a stream sleeping towards its next step (or out of script) at once. A
    step due exactly at the abort may go either way."""
    delays: set[float] = set()
    for t, step in schedule:
        if t > aborted_at + EPS:
            return delays | {0.0}
        if step.kind == "stall":
            delays.add(step.settles_after)
            if not _close(t, aborted_at):
                return delays
        elif _close(t, aborted_at):
            delays.add(0.0)
    return delays | {0.0}


def _check_events(played: Played, scenario: Any, cfg: TurnConfig) -> None:
    """A kill ends the turn Stopped at once (S7, S16); a follow-up while streaming ends it
    Done at once (S17) and otherwise stays queued (T3)."""
    lines = played.transitions
    end_t = lines[-1]["t"]
    kills = sorted(e.at for e in scenario.events if e.kill)
    if kills:
        assert end_t <= kills[0] + EPS, f"turn outlived the kill at {kills[0]}"
    if lines[-1]["to"] == "Stopped":
        assert kills and _close(end_t, kills[0]), "Stopped without a kill at that time"
    follow_ups = sorted(e.at for e in scenario.events if e.follow_up)
    if played.result.status == "follow_up_interrupt":
        assert cfg.max_follow_up_interrupts > 0
        assert any(_close(end_t, f) for f in follow_ups)
    queued_seen = False
    for f in follow_ups:
        if f > end_t - EPS:
            continue
        state = _state_at(lines, f)
        if state is None:
            continue
        if state in ("AwaitingFirstToken", "Streaming") and cfg.max_follow_up_interrupts > 0:
            raise AssertionError(f"follow-up at {f} in {state} did not interrupt the turn")
        queued_seen = True
    if queued_seen:
        assert played.result.follow_up_queued
    if played.result.follow_up_queued:
        assert any(f <= end_t + EPS for f in follow_ups)


# ------------------------------------------------------------------------------- running


async def play_in_loop(raw: dict[str, Any]) -> Played:
    """Play `raw` on the running loop and check that no task outlives the turn."""
    played = await play(parse_scenario(raw, "generated"))
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current]
    assert not left, f"tasks outlived the turn: {[t.get_name() for t in left]}"
    return played


HTTP_TURN_CONFIG = {"first_token_timeout_s": 60, "idle_timeout_s": 30, "settle_timeout_s": 5}
"""The budgets of the fault cells that stream over loopback HTTP."""


async def no_task_left() -> None:
    """Every task but the caller's has ended (in 5 s at most: a loopback server may still be
    tearing down a connection)."""
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current]
    if left:
        await asyncio.wait(left, timeout=5)
    assert all(t.done() for t in left), [t.get_name() for t in left if not t.done()]


async def server_saw_the_client_leave(server: ReplayServer) -> None:
    await asyncio.wait_for(server.client_gone.wait(), 5)


def play_and_check(raw: dict[str, Any], replay: bool = True) -> Played:
    """Play on a fresh virtual-time loop, check every invariant, and (by default) check that
    the journal replays to the same transitions and result."""
    played = run_virtual(lambda: play_in_loop(raw))
    check_played(played, raw)
    if replay:
        document = json.loads(json.dumps(jsonable(played.journal(raw)), ensure_ascii=False))
        difference = replay_difference(document, "generated")
        assert difference is None, f"replay differs: {difference}\nscenario: {json.dumps(raw)}"
    return played


# ------------------------------------------------------------------------ hand-built turns


CHANNEL = "reliability-channel"


def build_turn(
    raw: dict[str, Any],
    *,
    provider: Any = None,
    channel: Any = None,
    registry: Any = None,
    stash: Any = None,
    observer: Any = None,
    locks: Any = None,
) -> Turn:
    """A turn from a scenario's parts, with any of its collaborators replaced by a faulty
    one. Must be called on the loop that will run it (the stash and locks read its clock)."""
    scenario = parse_scenario(raw)
    cfg = scenario.turn_config()
    stash = stash if stash is not None else ContextStash(
        ttl_s=cfg.stash_ttl_s, max_items=cfg.stash_max_items, max_bytes=cfg.stash_max_bytes)
    keys = {name: stash.put({k: v for k, v in item.items() if k != "stash_at"})
            for name, item in scenario.stash.items()}
    locks = locks if locks is not None else ChannelLockRegistry(
        stale_age_s=cfg.stale_lock_age_s, max_follow_up_interrupts=cfg.max_follow_up_interrupts)
    lock = locks.try_acquire(CHANNEL, owner="reliability")
    assert lock is not None, "the channel is busy"
    return Turn(
        provider=provider if provider is not None else ScriptedProvider(scenario.passes),
        channel=channel if channel is not None else InMemoryChannel(scenario.history),
        locks=locks, lock=lock, request=TurnRequest(context_items=history_items(scenario.history)),
        tools=registry if registry is not None else ScriptedTools(scenario.tools, stash,
                                                                  keys).registry,
        stash=stash, config=cfg, observer=observer, turn_id=scenario.name)


def check_walk(turn: Turn) -> None:
    """The journal is a walk over declared edges in time order ending in its only terminal."""
    state, t_prev = "Preparing", 0.0
    for line in turn.transitions:
        assert line["from"] == state and line["from"] != line["to"], line
        assert (line["event"], line["from"], line["to"]) in EDGES, f"undeclared edge {line}"
        assert line["t"] >= t_prev - EPS, f"time goes back at {line}"
        state, t_prev = line["to"], line["t"]
    assert state == turn.state and state in TERMINAL_NAMES
    assert [line["to"] in TERMINAL_NAMES for line in turn.transitions].count(True) == 1
    for internal in turn.internal_transitions:
        assert (internal["event"], internal["state"], internal["state"]) in EDGES, internal


async def finish(turn: Turn, task: asyncio.Task[TurnResult] | None = None,
                 allow_left: int = 0, engine_tasks_only: bool = False) -> TurnResult:
    """Await the turn, release its lock as its owner would, and check that it ended in one
    terminal state with no worker, timer, kill handle or progress callback left (S14, D4).
    `allow_left` is for cells where a misbehaving collaborator ignores cancellation;
    `engine_tasks_only` for cells whose servers and Discord client run tasks of their own."""
    try:
        result = await (task if task is not None else turn.run())
    finally:
        turn.locks.release(turn.lock)
    check_walk(turn)
    if allow_left:
        check_handles_cleared(turn)
    else:
        check_invariants(SimpleNamespace(turn=turn, transitions=turn.transitions,
                                         locks=turn.locks))
    assert result.state == turn.state
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    if engine_tasks_only:
        left = [t for t in left if t.get_name().startswith(f"{turn.turn_id}-")]
    assert len(left) <= allow_left, f"tasks outlived the turn: {[t.get_name() for t in left]}"
    return result


def check_handles_cleared(turn: Turn) -> None:
    """S14, D4 for a turn whose worker ignored cancellation and was abandoned: everything the
    engine owns is still cleared and the lock released."""
    run = turn._passes.run
    if run is not None:
        assert run.abort.fired and run.deadline is None and run.kill_handle is None
    assert turn._tools.deadline is None
    assert turn.lock.stream_kill is None and turn.lock.turn_kill is None
    assert turn.lock.released and len(turn.locks) == 0


def path(turn: Turn) -> list[str]:
    return ["Preparing"] + [line["to"] for line in turn.transitions]


def times(turn: Turn) -> list[float]:
    return [0.0] + [line["t"] for line in turn.transitions]


# ----------------------------------------------------------------------------------- soak


@dataclass
class SoakReport:
    """What a soak run measured; `problems` is empty when everything returned to baseline.

    Memory is measured twice: after a first round of `turns` concurrent turns (caches and
    hash tables grow to their working size) and after a second, equal round, whose growth
    must stay within a small allowance: a leak of even 64 bytes per turn shows up there."""

    turns: int
    seed: int
    virtual_s: float = 0.0
    wall_s: float = 0.0
    peak_concurrent: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    tasks_before: int = 0
    tasks_after: int = 0
    models_before: int = 0
    models_after: int = 0
    turns_alive_after: int = 0
    traced_round1: int = 0
    traced_round2: int = 0
    traced_peak: int = 0
    rss_before_kib: int = 0
    rss_after_kib: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def steady_growth(self) -> int:
        return self.traced_round2 - self.traced_round1

    @property
    def allowance(self) -> int:
        return max(64 * 1024, 64 * self.turns)

    @property
    def problems(self) -> list[str]:
        found = list(self.violations)
        if self.tasks_after != self.tasks_before:
            found.append(f"tasks {self.tasks_before} -> {self.tasks_after}")
        if self.models_after != self.models_before:
            found.append(f"machine entries {self.models_before} -> {self.models_after}")
        if self.turns_alive_after:
            found.append(f"{self.turns_alive_after} turns still referenced after the soak")
        if self.steady_growth > self.allowance:
            found.append(f"memory grew {self.steady_growth} B over the second round "
                         f"(allowance {self.allowance} B)")
        return found

    def lines(self) -> list[str]:
        half = max(1, self.turns)
        return [
            f"2 rounds of {self.turns} turns (seed {self.seed}), peak {self.peak_concurrent} "
            "concurrent, "
            f"{self.virtual_s:.0f} s of virtual time in {self.wall_s:.1f} s of wall time",
            "outcomes " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())),
            f"tasks {self.tasks_before} -> {self.tasks_after}; machine entries "
            f"{self.models_before} -> {self.models_after}; turns alive after gc "
            f"{self.turns_alive_after}",
            f"traced memory after round 1 {self.traced_round1 / 1024:.0f} KiB, after round 2 "
            f"{self.traced_round2 / 1024:.0f} KiB: steady growth "
            f"{self.steady_growth / 1024:+.1f} KiB ({self.steady_growth / half:+.0f} B/turn, "
            f"allowance {self.allowance / 1024:.0f} KiB); peak {self.traced_peak / 1024:.0f} KiB",
            f"RSS {self.rss_before_kib} KiB -> {self.rss_after_kib} KiB",
            f"invariant violations {len(self.violations)}",
        ]


def _rss_kib() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def _settle_loop() -> None:
    """Let the loop drop its last handle (it pins the last gather), then collect."""
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()


def _machine_entries(machine: Any) -> int:
    """What the shared machine holds per turn: models added to it (turns are not) and its
    per-model task records (`async_tasks`, keyed by the turn's id while a trigger runs)."""
    return len(machine.models) + len(machine.async_tasks)


async def soak(
    turns: int, seed: int, spread_s: float = 1.0, warmup: int | None = None
) -> SoakReport:
    """Play two rounds of `turns` generated scenarios each (random faults: stalls, kills,
    follow-ups, raising providers, hanging and failing tools, stash misses), the turns of a
    round running concurrently on the running loop and starting within `spread_s` of virtual
    time, each checked by the oracle; then check that tasks, machine entries, turn objects and
    memory return to their baseline. A warm-up round (by default as large as a round) first
    brings caches and hash tables to their working size."""
    rng = random.Random(seed)
    report = SoakReport(turns=turns, seed=seed)
    loop = asyncio.get_running_loop()
    machine = shared_machine()
    active = 0

    async def one(raw: dict[str, Any], delay: float, live: weakref.WeakSet[Turn]) -> None:
        nonlocal active
        await asyncio.sleep(delay)
        active += 1
        report.peak_concurrent = max(report.peak_concurrent, active)
        try:
            played = await play(parse_scenario(raw))
            check_played(played, raw)
        except Exception as exc:
            report.violations.append(f"{raw['name']}: {type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0] if str(exc) else ''}")
            return
        finally:
            active -= 1
        live.add(played.turn)
        key = f"{played.result.state}/{played.result.status}"
        report.outcomes[key] = report.outcomes.get(key, 0) + 1

    async def batch(count: int, name: str, live: weakref.WeakSet[Turn]) -> None:
        raws = [gen_scenario(SeededRand(rng), f"{name}-{i}") for i in range(count)]
        await asyncio.gather(*(one(raw, rng.uniform(0.0, spread_s), live) for raw in raws))

    live: weakref.WeakSet[Turn] = weakref.WeakSet()
    await batch(turns if warmup is None else warmup, "warmup", live)
    report.outcomes.clear()
    await _settle_loop()
    report.tasks_before = len(asyncio.all_tasks())
    report.models_before = _machine_entries(machine)
    report.rss_before_kib = _rss_kib()
    wall = time.perf_counter()
    start = loop.time()
    tracemalloc.start()
    try:
        await batch(turns, "soak-a", live)
        await _settle_loop()
        report.traced_round1 = tracemalloc.get_traced_memory()[0]
        await batch(turns, "soak-b", live)
        await _settle_loop()
        report.traced_round2, report.traced_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    report.virtual_s = loop.time() - start
    report.wall_s = time.perf_counter() - wall
    report.tasks_after = len(asyncio.all_tasks())
    report.models_after = _machine_entries(machine)
    report.turns_alive_after = len(live)
    report.rss_after_kib = _rss_kib()
    return report
