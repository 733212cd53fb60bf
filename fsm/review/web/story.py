"""One journal told as the review page steps through it: each transition, the passes with the
chunks that arrived in them, tool calls and restarts, what the model was given, and the reply
the turn is an attempt of.

The journal holds the passes' content chunks with their times (seconds after the pass's
`begin`), so the text at any transition can be rebuilt: the kept text of every pass that has
ended, plus the chunks of the running pass that had arrived. A pass that ended keeps what its
result says it kept (a pass cut short drops what it never sent), so the last step shows what
the user saw. The story sends each chunk once, with its time, and the page rebuilds the text
of the step it shows (`PassWindow.text_at` is the same rule): the answer grows with the
journal, never with steps × text (V6).

The model's input is sent once as the journal holds it (the system prompt, the dialogue, the
prefill, the calls replayed from an earlier attempt, the context restarts added) and each pass
says how much of it it had seen: how many of the turn's tool calls had been fed back and which
stashed context had been added by then (V10).

Every field is type-checked as it is read: a journal of the wrong shape tells a shorter story,
never a failed one, and what the page receives has the types it expects (V5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...engine.table import TERMINAL, State
from ..inspect import Journal, outcome_of, reply_attempts, reply_of, summarize, table_edge

_PASS_STATES = frozenset({State.AWAITING_FIRST_TOKEN.value, State.STREAMING.value,
                          State.SETTLING.value})
_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _usage(value: Any) -> dict[str, int] | None:
    if not isinstance(value, dict):
        return None
    counts = {str(k): v for k, v in value.items()
              if isinstance(v, int) and not isinstance(v, bool)}
    return counts or None


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
            window.kept = _string(window.info.get("text"))
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
    return [{"name": n} for n in _strings(window.info.get("tool_calls"))]


def tool_calls(journal: Journal, windows: list[PassWindow]) -> list[dict[str, Any]]:
    """Every tool call with its arguments and its recorded outcome."""
    outcomes = _outcomes(journal)
    used: dict[str, int] = {}
    calls: list[dict[str, Any]] = []
    for window in windows:
        if window.ended_by != "tool_call":
            continue
        for call in _calls_of(journal, window):
            name = _string(call.get("name")) or ""
            nth = used.get(name, 0)
            used[name] = nth + 1
            recorded = outcomes.get(name, [])
            calls.append({"pass": window.index, "at": window.end, "name": name or "(nameless)",
                          "args": call.get("args", call.get("arguments")),
                          "outcome": recorded[nth] if nth < len(recorded) else None})
    return calls


def _steps(journal: Journal, windows: list[PassWindow]) -> list[dict[str, Any]]:
    """Each transition with the edge it took and the pass it belongs to (one walk: the
    windows are in order of their start, as the transitions are)."""
    steps: list[dict[str, Any]] = []
    latest = -1
    for index, tr in enumerate(journal.transitions):
        while latest + 1 < len(windows) and windows[latest + 1].start <= tr.t:
            latest += 1
        edge = table_edge(tr.key)
        in_pass = tr.event == "begin" or tr.source in _PASS_STATES
        window = windows[latest] if latest >= 0 else None
        running = window.index if in_pass and window is not None and (
            window.end is None or tr.t <= window.end) else None
        steps.append({"index": index + 1, "t": tr.t, "event": tr.event, "source": tr.source,
                      "dest": tr.dest, "kind": edge.kind if edge is not None else "unknown",
                      "does": edge.does if edge is not None else "not a transition of the table",
                      "pass": running, "terminal": tr.dest in _TERMINAL_NAMES})
    return steps


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dialogue(value: Any) -> list[dict[str, str]]:
    """The history the turn read, as the journal holds it (scenario form)."""
    items = value if isinstance(value, list) else []
    return [{"author": _text(item.get("author")), "content": _text(item.get("content")),
             "at": _text(item.get("at")), "id": str(item.get("id") or "")}
            for item in items if isinstance(item, dict)]


def _replayed(value: Any) -> list[dict[str, Any]]:
    """Calls of an earlier attempt replayed into this one's history (G1)."""
    entries = value if isinstance(value, list) else []
    return [{"name": _text(e.get("tool_name")), "args": e.get("arguments"),
             "result": e.get("result"), "success": e.get("success") is not False}
            for e in entries if isinstance(e, dict)]


def _context(journal: Journal) -> list[dict[str, Any]]:
    """What tools put in the stash for a restart to add (R2), with when it was stashed."""
    stash = journal.scenario.get("stash")
    items = stash.items() if isinstance(stash, dict) else []
    out = []
    for name, item in items:
        if isinstance(item, dict):
            shown = {k: v for k, v in item.items() if k != "stash_at"}
            out.append({"name": str(name), "at": _number(item.get("stash_at")),
                        "item": shown})
    return out


def model_input(journal: Journal) -> dict[str, Any]:
    """The model's input, once: what every pass was given besides the tool results."""
    request = journal.scenario.get("request")
    request = request if isinstance(request, dict) else {}
    return {"system_prompt": _text(request.get("system_prompt")),
            "prefill": _text(request.get("prefill")),
            "request_notices": _strings(request.get("request_notices")),
            "history": _dialogue(journal.scenario.get("history")),
            "replayed": _replayed(request.get("function_history")),
            "context": _context(journal)}


def reply(journal: Journal) -> dict[str, Any] | None:
    """The reply the turn is an attempt of (V9), type-checked."""
    record = reply_of(journal)
    if not record:
        return None

    def whole(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return {"id": _text(record.get("id")), "attempt": whole(record.get("attempt")),
            "answered_by": whole(record.get("answered_by")),
            "status": _string(record.get("status")), "notices": _strings(record.get("notices")),
            "final_notice": _string(record.get("final_notice")),
            "attempts": [{"attempt": whole(a.get("attempt")), "label": _text(a.get("label")),
                          "journal": _text(a.get("journal")), "status": _string(a.get("status")),
                          "state": _string(a.get("state")), "id": None}
                         for a in reply_attempts(record)]}


def _pass(window: PassWindow) -> dict[str, Any]:
    info = window.info
    return {"index": window.index, "start": window.start, "end": window.end,
            "ended_by": window.ended_by, "status": _string(info.get("status")),
            "text": window.kept, "chunks": [[at, text] for at, text in window.chunks],
            "finish_reason": _string(info.get("finish_reason")),
            "usage": _usage(info.get("usage")),
            "error": info.get("error") if isinstance(info.get("error"), (dict, str)) else None,
            "tool_calls": _strings(info.get("tool_calls"))}


def story(journal: Journal) -> dict[str, Any]:
    """Everything the page shows of one turn, as JSON."""
    windows = pass_windows(journal)
    result = journal.result
    flags = result.get("flags")
    notices = _strings(result.get("notices"))
    added = result.get("context_items_added")
    calls = tool_calls(journal, windows)
    passes = [_pass(w) for w in windows]
    fed = 0
    for told in passes:
        while fed < len(calls) and calls[fed]["pass"] < told["index"]:
            fed += 1
        told["fed_back"] = fed
    return {
        "name": journal.name,
        "final_state": journal.final_state,
        "status": _string(result.get("status")),
        "outcome": outcome_of(result.get("status")),
        "terminal": journal.final_state in _TERMINAL_NAMES,
        "duration": journal.duration,
        "error": _string(result.get("error")),
        "notices": notices,
        "delivered_text": _string(result.get("delivered_text")) or _string(result.get("text"))
        or "",
        "steps": _steps(journal, windows),
        "passes": passes,
        "tools": calls,
        "input": model_input(journal),
        "reply": reply(journal),
        "restarts": [{"t": tr.t, "event": tr.event, "source": tr.source, "dest": tr.dest}
                     for tr in journal.transitions
                     if tr.event in ("restart_requested", "restart")],
        "flags": [str(k) for k, v in flags.items() if v is True] if isinstance(flags, dict)
        else [],
        "context_items_added": added if isinstance(added, int) and not isinstance(added, bool)
        else None,
        "summary": summarize(journal),
    }
