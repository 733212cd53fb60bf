"""One journal told as the review page steps through it: each transition with the text the
turn had delivered at that moment, its passes, tool calls and restarts.

The journal holds the passes' content chunks with their times (seconds after the pass's
`begin`), so the text at any transition can be rebuilt: the kept text of every pass that has
ended, plus the chunks of the running pass that had arrived. A pass that ended keeps what its
result says it kept (a pass cut short drops what it never sent), so the last step shows what
the user saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...engine.table import TERMINAL, State
from ..inspect import Journal, summarize, table_edge

_PASS_STATES = frozenset({State.AWAITING_FIRST_TOKEN.value, State.STREAMING.value,
                          State.SETTLING.value})
_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)


@dataclass(slots=True)
class PassWindow:
    """One provider pass: when it began and ended, what arrived and what it kept."""

    index: int
    start: float
    end: float | None = None
    ended_by: str = ""
    chunks: list[tuple[float, str]] = field(default_factory=list)
    kept: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def text_at(self, t: float) -> str:
        if self.end is not None and t >= self.end and self.kept is not None:
            return self.kept
        return "".join(text for at, text in self.chunks if at <= t)


def _steps_of(journal: Journal, index: int) -> list[dict[str, Any]]:
    passes = journal.scenario.get("passes")
    if isinstance(passes, list) and index < len(passes) and isinstance(passes[index], list):
        return [s for s in passes[index] if isinstance(s, dict)]
    return []


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def pass_windows(journal: Journal) -> list[PassWindow]:
    """Each pass from its `begin` to the transition that left the pass states."""
    results = journal.result.get("pass_results")
    infos = [r if isinstance(r, dict) else {} for r in results] if isinstance(results, list) \
        else []
    windows: list[PassWindow] = []
    current: PassWindow | None = None
    for tr in journal.transitions:
        if tr.event == "begin":
            current = PassWindow(index=len(windows) + 1, start=tr.t)
            windows.append(current)
        elif current is not None and tr.source in _PASS_STATES and tr.dest not in _PASS_STATES:
            current.end, current.ended_by = tr.t, tr.event
            current = None
    for window in windows:
        for step in _steps_of(journal, window.index - 1):
            at, text = _number(step.get("at")), step.get("text")
            if at is not None and isinstance(text, str):
                window.chunks.append((window.start + at, text))
        if window.index - 1 < len(infos):
            window.info = infos[window.index - 1]
            kept = window.info.get("text")
            window.kept = kept if isinstance(kept, str) else None
    return windows


def _outcomes(journal: Journal) -> dict[str, list[dict[str, Any]]]:
    """Per tool, the recorded outcomes of its calls in order."""
    tools = journal.scenario.get("tools")
    out: dict[str, list[dict[str, Any]]] = {}
    if not isinstance(tools, dict):
        return out
    for name, spec in tools.items():
        outcomes = spec.get("outcomes") if isinstance(spec, dict) else spec
        if isinstance(outcomes, list):
            out[str(name)] = [o if isinstance(o, dict) else {"value": o} for o in outcomes]
    return out


def _calls_of(journal: Journal, window: PassWindow) -> list[dict[str, Any]]:
    """The tool calls that ended a pass, from its last recorded step, else its result."""
    for step in reversed(_steps_of(journal, window.index - 1)):
        if isinstance(step.get("tool_call"), dict):
            return [step["tool_call"]]
        if isinstance(step.get("tool_calls"), list):
            return [c for c in step["tool_calls"] if isinstance(c, dict)]
    names = window.info.get("tool_calls")
    return [{"name": str(n)} for n in names] if isinstance(names, list) else []


def tool_calls(journal: Journal, windows: list[PassWindow]) -> list[dict[str, Any]]:
    """Every tool call with its arguments and its recorded outcome."""
    outcomes = _outcomes(journal)
    used: dict[str, int] = {}
    calls: list[dict[str, Any]] = []
    for window in windows:
        if window.ended_by != "tool_call":
            continue
        for call in _calls_of(journal, window):
            name = str(call.get("name") or "")
            nth = used.get(name, 0)
            used[name] = nth + 1
            recorded = outcomes.get(name, [])
            calls.append({"pass": window.index, "at": window.end, "name": name or "(nameless)",
                          "args": call.get("args", call.get("arguments")),
                          "outcome": recorded[nth] if nth < len(recorded) else None})
    return calls


def _step(journal: Journal, windows: list[PassWindow], index: int) -> dict[str, Any]:
    tr = journal.transitions[index]
    edge = table_edge(tr.key)
    in_pass = tr.event == "begin" or tr.source in _PASS_STATES
    running = next((w.index for w in reversed(windows)
                    if in_pass and w.start <= tr.t and (w.end is None or tr.t <= w.end)), None)
    text = "".join(w.text_at(tr.t) for w in windows if w.start <= tr.t)
    return {"index": index + 1, "t": tr.t, "event": tr.event, "source": tr.source,
            "dest": tr.dest, "kind": edge.kind if edge is not None else "unknown",
            "does": edge.does if edge is not None else "not a transition of the table",
            "pass": running, "text": text, "terminal": tr.dest in _TERMINAL_NAMES}


def story(journal: Journal) -> dict[str, Any]:
    """Everything the page shows of one turn, as JSON."""
    windows = pass_windows(journal)
    result = journal.result
    flags = result.get("flags")
    return {
        "name": journal.name,
        "final_state": journal.final_state,
        "status": result.get("status"),
        "duration": journal.duration,
        "error": result.get("error"),
        "notices": result.get("notices") or [],
        "delivered_text": result.get("delivered_text") or result.get("text") or "",
        "steps": [_step(journal, windows, i) for i in range(len(journal.transitions))],
        "passes": [{"index": w.index, "start": w.start, "end": w.end, "ended_by": w.ended_by,
                    "status": w.info.get("status"), "text": w.kept,
                    "finish_reason": w.info.get("finish_reason"),
                    "usage": w.info.get("usage"), "error": w.info.get("error"),
                    "tool_calls": w.info.get("tool_calls") or []} for w in windows],
        "tools": tool_calls(journal, windows),
        "restarts": [{"t": tr.t, "event": tr.event, "source": tr.source, "dest": tr.dest}
                     for tr in journal.transitions
                     if tr.event in ("restart_requested", "restart")],
        "flags": [k for k, v in flags.items() if v is True] if isinstance(flags, dict) else [],
        "context_items_added": result.get("context_items_added"),
        "summary": summarize(journal),
    }
