"""Reading recorded turn journals and summarising them for a reviewer (`python -m fsm inspect`).

A journal (docs/scenarios.md) is a turn's transitions plus its result, and in its recorded form the
scenario fields that reproduce it. Reviewers mostly want the story of one turn: how many
passes, which tools, whether it restarted, where the time went and why it ended. The raw JSON
answers that only after some arithmetic; this module does the arithmetic.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from ..engine.table import TABLE, TERMINAL, Edge, State
from ..journal import ScenarioError, read_journal

EdgeKey = tuple[str, str, str]
"""(trigger, source, dest) as `fsm.engine.table.edge_keys()` spells it."""

_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)
_PASS_STATES = frozenset({State.AWAITING_FIRST_TOKEN.value, State.STREAMING.value,
                          State.SETTLING.value})


@dataclass(frozen=True, slots=True)
class Transition:
    """One journal line."""

    t: float
    event: str
    source: str
    dest: str

    @property
    def key(self) -> EdgeKey:
        return (self.event, self.source, self.dest)


@dataclass(slots=True)
class Journal:
    """A parsed journal: where it came from, its transitions, result and scenario fields."""

    source: str
    name: str
    transitions: list[Transition]
    result: dict[str, Any]
    scenario: dict[str, Any] = field(default_factory=dict)

    @property
    def final_state(self) -> str:
        """The state the last transition entered (the result's, for an empty journal)."""
        if self.transitions:
            return self.transitions[-1].dest
        state = self.result.get("state")
        return state if isinstance(state, str) else State.PREPARING.value

    @property
    def duration(self) -> float:
        return self.transitions[-1].t if self.transitions else 0.0


def _from_lines(lines: list[Any], source: str) -> dict[str, Any]:
    """The document form of a JSON Lines journal."""
    document: dict[str, Any] = {}
    transitions: list[Any] = []
    for number, line in enumerate(lines, 1):
        if not isinstance(line, dict):
            raise ScenarioError(f"{source}: line {number}: a journal line is a JSON object, "
                                f"not {type(line).__name__}")
        if "scenario" in line:
            scenario = line["scenario"]
            if not isinstance(scenario, dict):
                raise ScenarioError(f"{source}: line {number}: scenario: not an object")
            document.update(scenario)
        elif "result" in line:
            document["result"] = line["result"]
        else:
            transitions.append(line)
    document["journal"] = transitions
    return document


def _transition(line: Any, where: str) -> Transition:
    if not isinstance(line, dict):
        raise ScenarioError(f"{where}: a transition is a JSON object, not {type(line).__name__}")
    t = line.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise ScenarioError(f"{where}.t: missing or not a number")
    names: dict[str, str] = {}
    for name in ("event", "from", "to"):
        value = line.get(name)
        if not isinstance(value, str) or not value:
            raise ScenarioError(f"{where}.{name}: missing or not a string")
        names[name] = value
    return Transition(float(t), names["event"], names["from"], names["to"])


def displayable(value: Any) -> Any:
    """`value` with every lone surrogate (half of a cut emoji, or a crafted journal) shown as
    U+FFFD, so a summary or a drawing can always be printed and written as UTF-8."""
    if isinstance(value, str):
        if value.isascii():
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {displayable(k): displayable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [displayable(v) for v in value]
    return value


def parse_journal(data: Any, source: str) -> Journal:
    """Validate a decoded journal; a problem raises ScenarioError naming file and field."""
    data = displayable(data)
    source = displayable(source)
    if isinstance(data, list):
        data = _from_lines(data, source)
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a journal is a JSON object, not {type(data).__name__}")
    lines = data.get("journal")
    if not isinstance(lines, list):
        raise ScenarioError(f"{source}: journal: missing or not a list of transitions")
    transitions = [_transition(line, f"{source}: journal[{i}]") for i, line in enumerate(lines)]
    for i, (before, after) in enumerate(pairwise(transitions), 1):
        if after.t < before.t:
            raise ScenarioError(f"{source}: journal[{i}].t: {after.t:g} is earlier than the "
                                f"transition before it ({before.t:g})")
    result = data.get("result")
    if not isinstance(result, dict):
        raise ScenarioError(f"{source}: result: missing or not an object")
    status = result.get("status")
    if status is not None and not isinstance(status, str):
        raise ScenarioError(f"{source}: result.status: not a string")
    scenario = {k: v for k, v in data.items() if k not in ("journal", "result")}
    name = scenario.get("name")
    return Journal(source=source, name=name if isinstance(name, str) else Path(source).stem,
                   transitions=transitions, result=result, scenario=scenario)


def load_journal(path: Path) -> Journal:
    """A journal file: the document `write_journal` writes, or `run-scenario`'s JSON Lines."""
    return parse_journal(read_journal(path), str(path))


def table_edge(key: EdgeKey) -> Edge | None:
    """The table row a journaled transition took (the first that matches, as the machine
    tries them), or None for a transition the table does not declare."""
    trigger, source, dest = key
    for edge in TABLE:
        if edge.trigger != trigger:
            continue
        if any(s.value == source for s in edge.sources) and \
                (edge.dest.value if edge.dest is not None else source) == dest:
            return edge
    return None


def time_in_states(journal: Journal) -> tuple[dict[str, float], Counter[str]]:
    """Seconds spent in each state and how often it was entered, in order of first entry."""
    spent: dict[str, float] = {}
    entries: Counter[str] = Counter()
    current = journal.transitions[0].source if journal.transitions else State.PREPARING.value
    since = 0.0
    spent[current] = 0.0
    entries[current] += 1
    for tr in journal.transitions:
        spent[current] = spent.get(current, 0.0) + (tr.t - since)
        if tr.dest != tr.source:
            entries[tr.dest] += 1
        current, since = tr.dest, tr.t
        spent.setdefault(current, 0.0)
    return spent, entries


def _secs(t: float) -> str:
    """Seconds without float noise."""
    return f"{t:.3f}".rstrip("0").rstrip(".") + " s"


def _preview(text: Any, limit: int = 48) -> str:
    """A short quoted excerpt of a pass's text."""
    if not isinstance(text, str) or not text:
        return "(no text)"
    shown = text if len(text) <= limit else text[:limit - 1] + "…"
    return json.dumps(shown, ensure_ascii=False)


def _names(value: Any) -> list[str]:
    """A JSON list as strings; anything else as no names."""
    return [str(v) for v in value] if isinstance(value, list) else []


def _pass_tool_names(journal: Journal, index: int) -> list[str]:
    """Tool calls that ended pass `index` (0-based): from the result, else the script."""
    results = journal.result.get("pass_results")
    if isinstance(results, list) and index < len(results) and isinstance(results[index], dict):
        names = _names(results[index].get("tool_calls"))
        if names:
            return names
    passes = journal.scenario.get("passes")
    if isinstance(passes, list) and index < len(passes) and isinstance(passes[index], list):
        for step in passes[index]:
            if not isinstance(step, dict):
                continue
            if isinstance(step.get("tool_call"), dict):
                return [str(step["tool_call"].get("name") or "(nameless)")]
            if isinstance(step.get("tool_calls"), list):
                return [str(c.get("name") or "(nameless)") if isinstance(c, dict) else "?"
                        for c in step["tool_calls"]]
    return []


@dataclass(slots=True)
class _Pass:
    start: float
    end: float | None = None
    end_event: str = ""
    tool_chain_end: Transition | None = None


def _passes(journal: Journal) -> list[_Pass]:
    """Each provider pass from its `begin` to the transition that left the pass states, and
    for a pass that asked for tools, the transition that left ToolCall."""
    passes: list[_Pass] = []
    current: _Pass | None = None
    in_tools: _Pass | None = None
    for tr in journal.transitions:
        if tr.event == "begin":
            current = _Pass(start=tr.t)
            passes.append(current)
        elif current is not None and tr.source in _PASS_STATES and tr.dest not in _PASS_STATES:
            current.end, current.end_event = tr.t, tr.event
            in_tools = current if tr.dest == State.TOOL_CALL.value else None
            current = None
        elif in_tools is not None and tr.source == State.TOOL_CALL.value \
                and tr.dest != tr.source:
            in_tools.tool_chain_end = tr
            in_tools = None
    return passes


def _outcome(record: Any) -> str:
    """One tool outcome of the scenario fields, in words."""
    if not isinstance(record, dict):
        return "?"
    after = record.get("after")
    took = f" after {_secs(float(after))}" if isinstance(after, (int, float)) else ""
    if record.get("hang"):
        return "hangs (never returns)"
    if record.get("raise") is not None:
        return f"raises {record['raise']!r}{took}"
    if record.get("refused") is not None:
        return "refused without running"
    if record.get("success") is True:
        data = record.get("data")
        kind = data.get("type") if isinstance(data, dict) else None
        return f"success{took}" + (f" (data.type {kind})" if kind else "")
    if record.get("success") is False:
        return f"failure{took}: {record.get('error')!r}"
    return "?"


def _scripted_outcomes(journal: Journal) -> list[str]:
    """Per tool, the outcomes its successive calls get (the journal's inputs)."""
    tools = journal.scenario.get("tools")
    if not isinstance(tools, dict):
        return []
    lines = []
    for name, spec in tools.items():
        outcomes = spec.get("outcomes") if isinstance(spec, dict) else spec
        guard = f" [guard {spec.get('guard')}]" if isinstance(spec, dict) else ""
        if isinstance(outcomes, list):
            lines.append(f"{name}{guard}: " + "; ".join(_outcome(o) for o in outcomes))
    return lines


def _chain_end(tr: Transition | None) -> str:
    """How a pass's tool calls ended: the transition out of ToolCall and what it does."""
    if tr is None:
        return "still running"
    edge = table_edge(tr.key)
    does = edge.does if edge is not None else "not a transition of fsm/table.py"
    return f"{tr.event} to {tr.dest} at {_secs(tr.t)}: {does}"


def _ending(journal: Journal) -> list[str]:
    """Where the turn ended, by which edge and what that edge does, and what it posted."""
    result = journal.result
    final = journal.final_state
    terminal = "terminal" if final in _TERMINAL_NAMES else "NOT terminal"
    out = [f"ended      {final} ({terminal}) at {_secs(journal.duration)}: "
           f"status {result.get('status', '?')}"]
    if journal.transitions:
        last = journal.transitions[-1]
        edge = table_edge(last.key)
        why = edge.does if edge is not None else "not a transition of fsm/table.py"
        out.append(f"why        {last.event} from {last.source}: {why}")
    notices = _names(result.get("notices"))
    deferred = result.get("deferred_notice")
    reply = reply_of(journal)
    posted = [n for n in _names(reply.get("notices")) if n not in notices] if reply else []
    shown = ", ".join(notices) if notices else ("" if posted else "none")
    if posted:
        shown += ("; " if shown else "") + f"{', '.join(posted)} (the reply's, after its " \
            "last attempt)"
    out.append(f"notices    {shown}" + (f"; deferred: {deferred}" if deferred else ""))
    out.append(f"error      {result.get('error') or 'none'}")
    metrics = result.get("metrics")
    if isinstance(metrics, list) and metrics:
        out.append("metrics    " + ", ".join(
            " ".join(str(v) for v in m.values()) if isinstance(m, dict) else str(m)
            for m in metrics))
    if result.get("follow_up_queued"):
        out.append("follow-up  queued for after this turn")
    return out


def _passes_and_tools(journal: Journal) -> list[str]:
    """Each pass with its outcome and text, then the tool calls that ended passes."""
    result = journal.result
    passes = _passes(journal)
    results = result.get("pass_results")
    pass_results = results if isinstance(results, list) else []
    out = [f"passes     {result.get('passes', len(passes))}"]
    tool_lines: list[str] = []
    calls = 0
    for index, p in enumerate(passes):
        info = pass_results[index] if index < len(pass_results) else {}
        info = info if isinstance(info, dict) else {}
        end = _secs(p.end) if p.end is not None else "…"
        ended = info.get("status") or p.end_event or "unfinished"
        tools = _pass_tool_names(journal, index) if p.end_event == "tool_call" else []
        line = f"  #{index + 1}  {_secs(p.start)} → {end}  {ended}  {_preview(info.get('text'))}"
        out.append(line + (f"  → tools: {', '.join(tools)}" if tools else ""))
        if tools:
            calls += len(tools)
            tool_lines.append(f"  pass {index + 1}: {', '.join(tools)} from "
                              f"{_secs(p.end or 0.0)} → {_chain_end(p.tool_chain_end)}")
    history = _names(result.get("function_history"))
    out.append(f"tools      {calls} call{'s' if calls != 1 else ''}"
               + (f"; history: {', '.join(history)}" if history else ""))
    out.extend(tool_lines)
    inputs = _scripted_outcomes(journal)
    if inputs:
        out.append("  inputs per tool (each call's scripted or recorded outcome, in order):")
        out.extend(f"    {line}" for line in inputs)
    errors = result.get("consecutive_tool_errors")
    if isinstance(errors, int) and errors:
        out.append(f"  consecutive tool errors at the end: {errors}")
    return out


def _restarts(journal: Journal) -> list[str]:
    """Context restarts (R1-R9) and the flags and context they left behind."""
    result = journal.result
    restarts = [tr for tr in journal.transitions if tr.event == "restart"]
    out = [f"restarts   {len(restarts)}"]
    out.extend(f"  at {_secs(tr.t)}: {tr.source} → {tr.dest}" for tr in restarts)
    flags = result.get("flags")
    raised = [k for k, v in flags.items() if v is True] if isinstance(flags, dict) else []
    if restarts or raised:
        out.append(f"  flags set: {', '.join(raised) if raised else 'none'}; context items "
                   f"added: {result.get('context_items_added', '?')}; stash left: "
                   f"{result.get('stash_items', '?')}")
    return out


def _states(journal: Journal) -> list[str]:
    """Time spent per state, the path, and transitions the table does not declare."""
    spent, entries = time_in_states(journal)
    out = ["time in state"]
    width = max(len(s) for s in spent)
    for state, seconds in spent.items():
        shown = "(terminal)" if state in _TERMINAL_NAMES and state == journal.final_state \
            else _secs(seconds)
        out.append(f"  {state:<{width}}  {shown:>10}  entered {entries[state]}×")
    start = journal.transitions[0].source if journal.transitions else State.PREPARING.value
    out.append("path       " + " → ".join(
        [start] + [tr.dest for tr in journal.transitions if tr.dest != tr.source]))
    out.extend(f"warning    {tr.event} {tr.source} → {tr.dest} at {_secs(tr.t)} is not in "
               "fsm/table.py" for tr in journal.transitions if table_edge(tr.key) is None)
    return out


def _origin(journal: Journal) -> list[str]:
    """Where the turn ran, when the journal says (the bot records it; with Redis the worker
    and its fencing token tell a stale owner's turn from the one that took over)."""
    origin = journal.scenario.get("origin")
    if not isinstance(origin, dict):
        return []
    names = ("channel_id", "message_id", "worker", "fence")
    parts = [f"{name.removesuffix('_id')} {origin[name]}" for name in names if name in origin]
    return [f"origin     {', '.join(parts)}"] if parts else []


OUTCOMES: dict[str, str] = {
    "completed": "ok", "error": "failed", "empty_response": "failed",
    "delivery_cap": "failed", "timeout": "timeout", "stopped_by_user": "stopped",
    "follow_up_interrupt": "other", "function_call": "other",
}
"""How a status reads at a glance (the review page's badges, the colour of the state a drawn
turn ended in): a turn that ended Done may have failed (V10)."""


def outcome_of(status: Any) -> str:
    """`ok`, `failed`, `timeout`, `stopped`, `other` or `unknown`."""
    return OUTCOMES.get(status, "unknown") if isinstance(status, str) else "unknown"


def reply_of(journal: Journal) -> dict[str, Any]:
    """The reply's outcome the journal carries (V9), or {} for a journal without one."""
    reply = journal.scenario.get("reply")
    return reply if isinstance(reply, dict) else {}


def reply_attempts(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The attempts of a reply, each an object (anything else is left out)."""
    attempts = reply.get("attempts")
    return [a for a in attempts if isinstance(a, dict)] if isinstance(attempts, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reply(journal: Journal) -> list[str]:
    """Which reply the attempt belongs to, how the reply ended and its other journals."""
    reply = reply_of(journal)
    if not reply:
        return []
    attempts = reply_attempts(reply)
    n, answered = _int(reply.get("attempt")), _int(reply.get("answered_by"))
    line = f"reply      {reply.get('id', '?')}: attempt {n or '?'} of {len(attempts) or '?'}"
    label = next((a.get("label") for a in attempts if _int(a.get("attempt")) == answered),
                 None) if answered is not None else None
    if answered is not None:
        line += f"; answered by attempt {answered}" + (f" ({label})" if label else "")
    else:
        line += f"; no attempt answered (status {reply.get('status', '?')})"
    out = [line]
    for attempt in attempts:
        mark = "  ← this journal" if _int(attempt.get("attempt")) == n else ""
        out.append(f"  attempt {attempt.get('attempt', '?')}  {attempt.get('label', '?')}  "
                   f"{attempt.get('status', '?')}  {attempt.get('journal', '?')}{mark}")
    return out


def summarize(journal: Journal) -> str:
    """A readable account of one journal: the reply it is an attempt of, how it ended and
    why, passes, tools, restarts, time per state."""
    out = [f"{journal.name}  ({journal.source})"]
    for section in (_origin, _reply, _ending, _passes_and_tools, _restarts, _states):
        out.extend(section(journal))
    return "\n".join(out) + "\n"
