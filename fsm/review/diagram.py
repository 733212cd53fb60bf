"""The turn machine drawn from its table, and recorded turns drawn on it (`python -m fsm diagram`).

The picture is built with graphviz directly from `fsm.engine.table.TABLE`, not from transitions'
`GraphMachine`: GraphMachine merges every trigger between two states into one edge (so a
timer, a kill and a worker event between the same pair cannot be styled apart, and no edge
can be named by its (trigger, source, dest)), paints the model's current state as active,
and cannot draw an edge from a group of states. A review diagram needs all three; the cross
check against GraphMachine's edge set lives in tests/test_diagrams.py.

Every (trigger, source, dest) of the table is drawn exactly once, and the DOT says which
drawn element carries it: a `// key TRIGGER SOURCE -> DEST` comment precedes the element, and
an edge that carries a single key has the id `TRIGGER:SOURCE:DEST`. Output is deterministic
(table order, no timestamps) so the committed DOT and markdown can be checked for drift.

A journal is untrusted input (V2): its events must be triggers of the table and its states
states of the table, so they can name elements; any other string of it (the turn's name, its
status) enters the DOT only inside an escaped label, printable and cut to `MAX_TEXT_CHARS`. A
drawing's size is bounded whatever the journal holds: at most `MAX_UNDECLARED` transitions the
table does not declare are drawn, and an edge lists at most `MAX_STEPS_SHOWN` of its steps.
"""

from __future__ import annotations

import argparse
import html
import math
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import graphviz

from ..engine.table import (
    NON_TERMINAL,
    STATES,
    STREAM_STATES,
    TABLE,
    TERMINAL,
    Edge,
    EdgeKind,
    State,
)
from ..journal import ScenarioError
from .inspect import (
    EdgeKey,
    Journal,
    displayable,
    load_journal,
    outcome_of,
    summarize,
    time_in_states,
)

REFRESH_COMMAND = "python -m fsm diagram"
MACHINE_PREFIX = Path("diagrams/turn")
JOURNAL_PREFIX = Path("diagrams/journal")
MARKDOWN_PATH = Path("docs/transitions.md")

FONT = "Helvetica"
NEWLINE = "\\n"
"""A line break inside a DOT label, written as DOT's escape so every statement stays on one
line of the committed file (readable diffs, greppable keys)."""
KIND_STYLE: dict[EdgeKind, dict[str, str]] = {
    "flow": {"color": "#37474f", "fontcolor": "#37474f", "style": "solid", "penwidth": "1.2"},
    "worker": {"color": "#1565c0", "fontcolor": "#1565c0", "style": "solid", "penwidth": "1.2"},
    "timer": {"color": "#e08a00", "fontcolor": "#b36b00", "style": "dashed", "penwidth": "1.6"},
    "kill": {"color": "#d32f2f", "fontcolor": "#d32f2f", "style": "bold", "penwidth": "2.4"},
    "error": {"color": "#7b1fa2", "fontcolor": "#7b1fa2", "style": "dotted", "penwidth": "1.8"},
}
KIND_MEANING: dict[EdgeKind, str] = {
    "flow": "the driver's own step",
    "worker": "an event a stream or tool worker posted",
    "timer": "a deadline fired",
    "kill": "/kill, honoured in every running state",
    "error": "an unexpected exception",
}
RUNNING_FILL = "#eef3f8"
TERMINAL_FILL: dict[str, str] = {"Done": "#c8e6c9", "TimedOut": "#ffe0b2", "Stopped": "#ffcdd2"}
OTHER_TERMINAL_FILL = "#cfd8dc"
FADED = "#d5d5d5"
FADED_TEXT = "#a0a0a0"
FADED_WIDTH = "0.8"
FADED_FONT_SIZE = "9"
TAKEN_FONT_SIZE = "13"
"""Under an overlay the edges a turn took carry large labels and the rest step back (V10)."""
OUTCOME_FILL: dict[str, str] = {"ok": "#a5d6a7", "failed": "#ef9a9a", "timeout": "#ffcc80",
                                "stopped": "#cfd8dc", "other": "#b3e5fc", "unknown": "#eeeeee"}
"""The state one drawn turn ended in, filled by how it ended: a failed turn's Done is red."""
VISITED = "#00897b"
VISITED_FILL = "#b2dfdb"
HEAT = ("#f4a259", "#ee8434", "#e4572e", "#c7302a", "#9e1b1b", "#6b0f0f")
"""Heat-map colours from taken once to taken most often (log scale)."""
TRIGGERS = frozenset(edge.trigger for edge in TABLE)
MAX_TEXT_CHARS = 120
MAX_UNDECLARED = 12
MAX_STEPS_SHOWN = 8
_AS_SPACE = frozenset({"Cc", "Zl", "Zp", "Zs"})

_CLUSTERS: dict[str, tuple[str, str, tuple[State, ...]]] = {
    "cluster_running": ("running states", "every running state", NON_TERMINAL),
    "cluster_stream": ("stream pass", "the stream pass", STREAM_STATES),
}
"""Groups an edge from several states is drawn from, as one arrow leaving the group."""

_LANES: dict[str, str] = {
    "Preparing": "main", "AwaitingFirstToken": "main", "Streaming": "main", "Done": "main",
    "Settling": "timeout", "TimedOut": "timeout",
}
"""Layout hints, by state name so a renamed state only loses its hint: states of one lane
are lined up straight (graphviz `group`), the happy path along the bottom and the timeout
path along the top. Found by looking at the rendered picture."""
_TERMINAL_ORDER = ("Stopped", "TimedOut", "Done")
"""Top to bottom in the terminal column: Stopped under the stop edges that arc over the
top, Done at the end of the happy path."""
_STACKED = (("Settling", "ToolCall"),)
"""Pairs of states kept in one column, the first above the second, so the timeout lane
stays above the tool loop."""


@dataclass(frozen=True, slots=True)
class Row:
    """One table edge from one of its sources: the unit the diagram and the docs list."""

    edge: Edge
    source: State
    earlier: tuple[Edge, ...]
    """Rows of the same trigger from the same source tried before this one (guards only)."""

    @property
    def dest(self) -> State:
        return self.edge.dest if self.edge.dest is not None else self.source

    @property
    def internal(self) -> bool:
        return self.edge.dest is None

    @property
    def key(self) -> EdgeKey:
        return (self.edge.trigger, self.source.value, self.dest.value)

    @property
    def callback(self) -> str:
        return self.edge.callback

    @property
    def guard(self) -> str:
        """The guard as the diagram shows it: own conditions, or `else` for a fallback row."""
        own = [*self.edge.guards, *(f"not {u}" for u in self.edge.unless)]
        if own:
            return ", ".join(own)
        return "else" if self.earlier else ""

    @property
    def condition(self) -> str:
        """The full condition under which the machine takes this row, for the docs."""
        parts = [*self.edge.guards, *(f"not {u}" for u in self.edge.unless)]
        for edge in self.earlier:
            conds = [*edge.guards, *(f"not {u}" for u in edge.unless)]
            parts.append(f"not {conds[0]}" if len(conds) == 1
                         else f"not ({' and '.join(conds)})")
        return " and ".join(parts)

    @property
    def label(self) -> str:
        """`trigger [guard]`, what an arrow or a state's "stays on" list shows."""
        return self.edge.trigger + (f" [{self.guard}]" if self.guard else "")


def table_rows() -> list[Row]:
    """Every table edge expanded per source, in table order."""
    rows: list[Row] = []
    for index, edge in enumerate(TABLE):
        for source in edge.sources:
            earlier = tuple(
                e for e in TABLE[:index]
                if e.trigger == edge.trigger and source in e.sources and (e.guards or e.unless)
            )
            rows.append(Row(edge, source, earlier))
    return rows


@dataclass(slots=True)
class Overlay:
    """Recorded turns drawn on the machine: which keys were taken, when, how often."""

    title: str
    taken: dict[EdgeKey, list[tuple[int, float]]] = field(default_factory=dict)
    counts: Counter[EdgeKey] = field(default_factory=Counter)
    entered: Counter[str] = field(default_factory=Counter)
    ended: Counter[str] = field(default_factory=Counter)
    spent: dict[str, float] = field(default_factory=dict)
    journals: int = 0
    status: str | None = None
    """One journal's status (its ended state is filled by it)."""

    @property
    def heat(self) -> bool:
        """Several journals are drawn as counts; one as its ordered, timed steps."""
        return self.journals > 1


def overlay_of(journals: Sequence[Journal]) -> Overlay:
    """The overlay of one journal (order and time per edge) or several (a heat map)."""
    if not journals:
        raise ScenarioError("no journal to draw")
    known = {s.value for s in STATES}
    overlay = Overlay(title="", journals=len(journals))
    for journal in journals:
        start = journal.transitions[0].source if journal.transitions else State.PREPARING.value
        overlay.entered[start] += 1
        for index, tr in enumerate(journal.transitions):
            for name in (tr.source, tr.dest):
                if name not in known:
                    raise ScenarioError(f"{journal.source}: journal[{index}]: "
                                        f"{dot_text(name, 40)!r} is not a state of fsm/table.py")
            if tr.event not in TRIGGERS:
                raise ScenarioError(f"{journal.source}: journal[{index}].event: "
                                    f"{dot_text(tr.event, 40)!r} is not a trigger of "
                                    "fsm/table.py")
            overlay.counts[tr.key] += 1
            overlay.taken.setdefault(tr.key, []).append((index + 1, tr.t))
            if tr.dest != tr.source:
                overlay.entered[tr.dest] += 1
        overlay.ended[journal.final_state] += 1
    if len(journals) == 1:
        only = journals[0]
        overlay.spent = time_in_states(only)[0]
        status = only.result.get("status", "?")
        overlay.status = status if isinstance(status, str) else None
        overlay.title = (f"{dot_text(only.name)}: {len(only.transitions)} transitions, ended "
                         f"{dot_text(only.final_state, 40)} ({dot_text(status, 40)}) at "
                         f"{_secs(only.duration)}")
    else:
        overlay.title = (f"{len(journals)} journals, {sum(overlay.counts.values())} transitions: "
                         + ", ".join(f"{n}× {dot_text(s, 40)}"
                                     for s, n in sorted(overlay.ended.items())))
    return overlay


def dot_text(value: object, limit: int = MAX_TEXT_CHARS) -> str:
    """A journal string as a drawing may show it: printable (line breaks and other controls
    become spaces; format, private and unassigned characters U+FFFD), at most `limit`
    characters."""
    text = displayable(value if isinstance(value, str) else str(value))
    shown = "".join(c if c.isprintable() else " " if unicodedata.category(c) in _AS_SPACE
                    else "\ufffd" for c in text[:limit + 1])
    return shown if len(shown) <= limit else shown[:limit - 1] + "…"


def _secs(t: float) -> str:
    """Seconds without float noise: 0.6 not 0.6000000001, 2 not 2.0."""
    return f"{t:.3f}".rstrip("0").rstrip(".") + "s"


@dataclass(slots=True)
class _Arrow:
    """One drawn edge standing for one or more keys."""

    tail: str
    head: str
    kind: EdgeKind
    ltail: str | None
    members: list[tuple[EdgeKey, str]] = field(default_factory=list)
    note: str = ""
    tooltips: list[str] = field(default_factory=list)

    def label(self) -> str:
        lines = list(dict.fromkeys(text for _, text in self.members))
        if self.note:
            lines.append(self.note)
        return NEWLINE.join(lines)


def _group_of(edge: Edge) -> tuple[str | None, str]:
    """The cluster an edge from several states is drawn from, and a note for the states of
    that cluster it does not leave."""
    if len(edge.sources) < 2:
        return None, ""
    wanted = set(edge.sources)
    fitting = [(len(states), name, every, states)
               for name, (_, every, states) in _CLUSTERS.items() if wanted <= set(states)]
    if not fitting:
        return None, ""
    _, name, every, states = min(fitting)
    missing = [s.value for s in states if s not in wanted]
    return name, f"(from {every}" + (f" but {', '.join(missing)})" if missing else ")")


def _tooltip(row: Row) -> str:
    """What the SVG shows on hover: the edge, what its callbacks do and their name."""
    return f"{row.edge.trigger}: {row.source.value} → {row.dest.value}. {row.edge.does}" + (
        f" [{row.callback}]" if row.callback else "")


def _arrows(rows: Iterable[Row], skip: set[EdgeKey]) -> list[_Arrow]:
    """The static drawing: multi-source edges leave their cluster once, edges of one kind
    between the same ends share an arrow; keys in `skip` are drawn elsewhere."""
    arrows: dict[tuple[str, str, str, EdgeKind], _Arrow] = {}
    for row in rows:
        if row.internal or row.key in skip:
            continue
        cluster, note = _group_of(row.edge)
        tail = (row.edge.sources[-1] if cluster else row.source).value
        slot = (cluster or tail, row.dest.value, note, row.edge.kind)
        arrow = arrows.get(slot)
        if arrow is None:
            arrow = arrows[slot] = _Arrow(tail, row.dest.value, row.edge.kind, cluster,
                                          note=note)
        arrow.members.append((row.key, row.label))
        arrow.tooltips.append(_tooltip(row))
    return list(arrows.values())


def _key_comments(graph: graphviz.Digraph, keys: Iterable[EdgeKey]) -> None:
    """Name the keys the next DOT statement stands for, so tests and reviewers can check
    that every table edge is drawn even when one arrow stands for several."""
    for trigger, source, dest in keys:
        graph.body.append(f"\t// key {trigger} {source} -> {dest}\n")


def _heat(count: int, top: int) -> float:
    """0 for an edge taken once, 1 for the most taken: log scale, so rare edges stay visible
    next to ones every turn takes."""
    return math.log(count) / math.log(top) if top > 1 else 1.0


def _node_label(state: State, internal: list[Row], extra: str) -> str:
    """The state's name, the internal transitions it stays on, and overlay facts."""
    parts = [f"<b>{html.escape(state.value)}</b>"]
    if internal:
        stays = "<br/>".join(html.escape(r.label) for r in internal)
        parts.append(f'<font point-size="9" color="#607d8b">stays on:<br/>{stays}</font>')
    if extra:
        parts.append(f'<font point-size="9">{html.escape(extra)}</font>')
    return "<" + "<br/>".join(parts) + ">"


_SAMPLE: dict[EdgeKind, str] = {
    "flow": "─────▶",
    "worker": "─────▶",
    "timer": "╴ ╴ ╴ ╴▶",
    "kill": "━━━━━▶",
    "error": "·······▶",
}


def _title(title: str, legend: bool, note: str = "") -> str:
    """The graph's label: its title and, on the machine diagram, the key to edge kinds (a
    label takes no part in the layout, unlike a legend drawn with nodes and edges)."""
    rows = [f'<tr><td align="left" colspan="2"><font point-size="16">{html.escape(title)}'
            '</font></td></tr>']
    if note:
        rows.append(f'<tr><td align="left" colspan="2">{html.escape(note)}</td></tr>')
    if legend:
        for kind, meaning in KIND_MEANING.items():
            colour = KIND_STYLE[kind]["color"]
            rows.append(f'<tr><td align="left"><font color="{colour}">{_SAMPLE[kind]}</font>'
                        f'</td><td align="left"><font color="{colour}">{kind}</font>: '
                        f'{html.escape(meaning)}</td></tr>')
    return '<<table border="0" cellspacing="0" cellpadding="2">' + "".join(rows) + "</table>>"


def _new_graph(title: str, legend: bool, note: str = "") -> graphviz.Digraph:
    """Left to right, as a turn reads; compound so an arrow can leave a cluster."""
    return graphviz.Digraph(
        "turn",
        graph_attr={"rankdir": "LR", "compound": "true", "newrank": "true", "nodesep": "0.3",
                    "ranksep": "0.5", "fontname": FONT, "fontsize": "12",
                    "label": _title(title, legend, note), "labelloc": "t", "labeljust": "l",
                    "pad": "0.3", "bgcolor": "white"},
        node_attr={"fontname": FONT, "fontsize": "12", "style": "rounded,filled",
                   "shape": "box", "margin": "0.15,0.07"},
        edge_attr={"fontname": FONT, "fontsize": "10", "arrowsize": "0.8"},
    )


def _add_node(graph: graphviz.Digraph, state: State, rows: list[Row],
              overlay: Overlay | None) -> None:
    """A state: internal transitions not taken by the overlay are listed in its label."""
    taken = overlay.counts if overlay is not None else Counter()
    internal = [r for r in rows if r.internal and r.source == state and r.key not in taken]
    _key_comments(graph, (r.key for r in internal))
    attrs: dict[str, str] = {"id": state.value, "tooltip": state.value}
    if state.value in _LANES:
        attrs["group"] = _LANES[state.value]
    if state in TERMINAL:
        fill = TERMINAL_FILL.get(state.value, OTHER_TERMINAL_FILL)
        attrs.update(shape="doublecircle", fillcolor=fill, color="#455a64", width="1.1")
    else:
        attrs.update(fillcolor=RUNNING_FILL, color="#78909c")
    extra = ""
    classes: dict[str, str] = {}
    if overlay is not None:
        entered = overlay.entered[state.value]
        ended = overlay.ended[state.value]
        if not entered:
            attrs.update(color=FADED, fontcolor=FADED_TEXT, fillcolor="#f7f7f7")
        elif ended:
            attrs.update(color="black", penwidth="3.5")
            extra = f"ended here {ended}×" if overlay.heat else "ended here"
            if not overlay.heat:
                outcome = outcome_of(overlay.status)
                attrs["fillcolor"] = OUTCOME_FILL[outcome]
                classes["class"] = f"ended outcome-{outcome}"
                extra += f": {dot_text(overlay.status or '?', 40)}"
        else:
            attrs.update(color=VISITED, penwidth="2.2", fillcolor=VISITED_FILL)
            spent = overlay.spent.get(state.value)
            extra = f"entered {entered}×" + (f", {_secs(spent)}" if spent is not None else "")
    graph.node(state.value, _node_label(state, internal, extra), _attributes=classes or None,
               **attrs)


def _add_states(graph: graphviz.Digraph, rows: list[Row], overlay: Overlay | None) -> None:
    """The initial marker, the running states in their clusters, the terminal column."""
    graph.node("__start__", "", shape="circle", style="filled", fillcolor="black",
               width="0.2", fixedsize="true", id="start", tooltip="the turn starts here")
    graph.edge("__start__", State.PREPARING.value, id="start:" + State.PREPARING.value,
               color="black")
    with graph.subgraph(name="cluster_running") as running:
        running.attr(label=_CLUSTERS["cluster_running"][0], style="rounded,dashed",
                     color="#b0bec5", fontcolor="#78909c", fontsize="11", margin="14")
        for state in NON_TERMINAL:
            if state not in STREAM_STATES:
                _add_node(running, state, rows, overlay)
        with running.subgraph(name="cluster_stream") as stream:
            stream.attr(label=_CLUSTERS["cluster_stream"][0], style="rounded,dashed",
                        color="#90a4ae", fontcolor="#78909c", fontsize="11", margin="10")
            for state in STREAM_STATES:
                _add_node(stream, state, rows, overlay)
        names = {s.value for s in NON_TERMINAL}
        for upper, lower in _STACKED:
            if upper in names and lower in names:
                with running.subgraph() as column:
                    column.attr(rank="same")
                    column.edge(upper, lower, style="invis")
    with graph.subgraph(name="terminals") as terminals:
        terminals.attr(rank="max")
        ordered = sorted(TERMINAL, key=lambda s: (
            _TERMINAL_ORDER.index(s.value) if s.value in _TERMINAL_ORDER else len(STATES),
            STATES.index(s)))
        for state in ordered:
            _add_node(terminals, state, rows, overlay)
        for upper, lower in pairwise(ordered):
            terminals.edge(upper.value, lower.value, style="invis")


def _add_table_edges(graph: graphviz.Digraph, rows: list[Row], overlay: Overlay | None) -> None:
    """The table's edges as the static picture draws them (faded under an overlay)."""
    taken = set(overlay.counts) if overlay is not None else set()
    for arrow in _arrows(rows, taken):
        keys = [key for key, _ in arrow.members]
        _key_comments(graph, keys)
        style = dict(KIND_STYLE[arrow.kind])
        extra: dict[str, str] = {}
        if overlay is not None:
            style.update(color=FADED, fontcolor=FADED_TEXT, penwidth=FADED_WIDTH,
                         fontsize=FADED_FONT_SIZE)
            extra = {"class": "untaken"}
        arrow_id = (":".join(keys[0]) if len(keys) == 1
                    else f"{keys[0][0]}:{arrow.ltail or arrow.tail}:{arrow.head}")
        attrs = {**style, "label": arrow.label(), "tooltip": " | ".join(arrow.tooltips),
                 "id": arrow_id}
        if arrow.ltail:
            attrs["ltail"] = arrow.ltail
        graph.edge(arrow.tail, arrow.head, _attributes=extra or None, **attrs)


def _add_taken_edges(graph: graphviz.Digraph, rows: list[Row], overlay: Overlay) -> None:
    """Each edge the journals took, from its real source, labelled with its order and time
    (one journal) or how often it was taken (several)."""
    by_key = {row.key: row for row in rows}
    top = max(overlay.counts.values(), default=1)
    undeclared = 0
    for key, count in overlay.counts.items():
        row = by_key.get(key)
        if row is None:
            undeclared += 1
            if undeclared > MAX_UNDECLARED:
                continue
        _key_comments(graph, [key])
        style = dict(KIND_STYLE[row.edge.kind if row is not None else "error"])
        name = row.label if row is not None else key[0]
        if overlay.heat:
            heat = _heat(count, top)
            colour = HEAT[round(heat * (len(HEAT) - 1))]
            label = f"{name} ×{count}"
            width = f"{1.5 + 4 * heat:.2f}"
        else:
            colour = VISITED
            taken = overlay.taken[key]
            steps = ", ".join(f"#{n} @{_secs(t)}" for n, t in taken[:MAX_STEPS_SHOWN])
            if len(taken) > MAX_STEPS_SHOWN:
                steps += f" and {len(taken) - MAX_STEPS_SHOWN} more"
            label = name + NEWLINE + steps
            width = "3"
        if row is None:
            label += NEWLINE + "(not in fsm/table.py)"
        style.update(color=colour, fontcolor="black", penwidth=width, fontsize=TAKEN_FONT_SIZE)
        graph.edge(key[1], key[2], label=label, id=":".join(key),
                   tooltip=_tooltip(row) if row is not None else "not in fsm/table.py",
                   _attributes={"class": "taken"}, **style)


def build_graph(overlay: Overlay | None = None) -> graphviz.Digraph:
    """The machine as a graphviz graph; with an overlay, the recorded turns drawn on it."""
    rows = table_rows()
    title = ("turn: states and transitions of fsm/table.py" if overlay is None
             else overlay.title)
    note = ""
    if overlay is not None:
        note = ("edge colour and width: how often the journals took it; grey: never taken"
                if overlay.heat else
                "teal: taken (#order @time from the start of the turn); grey: not taken")
    if overlay is not None:
        declared = {row.key for row in rows}
        hidden = sum(1 for key in overlay.counts if key not in declared) - MAX_UNDECLARED
        if hidden > 0:
            note += f"; {hidden} more transitions not in fsm/table.py are not drawn"
    graph = _new_graph(title, legend=overlay is None, note=note)
    _add_states(graph, rows, overlay)
    _add_table_edges(graph, rows, overlay)
    if overlay is not None:
        _add_taken_edges(graph, rows, overlay)
    return graph


def machine_dot() -> str:
    """The DOT of the machine, as committed in diagrams/turn.dot."""
    return str(build_graph().source)


def journal_dot(journals: Sequence[Journal]) -> str:
    """The DOT of the journals drawn on the machine."""
    return str(build_graph(overlay_of(journals)).source)


def _md(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|")


def transitions_markdown() -> str:
    """The transition table as docs/transitions.md shows it."""
    rows = table_rows()
    out = [
        "# Turn transitions",
        "",
        f"<!-- Generated from fsm/table.py by `{REFRESH_COMMAND}`: edit the table, "
        "not this file. -->",
        "",
        "![The turn's state machine](../diagrams/turn.svg)",
        "",
        f"States: {', '.join(s.value for s in NON_TERMINAL)} (running; the turn starts in "
        f"{State.PREPARING.value}); terminal: "
        f"{', '.join(s.value for s in STATES if s in TERMINAL)}.",
        "",
        "Rows of one trigger from one state are tried in table order and the first whose "
        "guard holds is taken, so a row's full guard includes \"not\" of the rows tried "
        "before it. A target marked *(stays)* is an internal transition: no exit or entry, "
        "the callback still runs.",
        "",
        "Edge kinds: " + "; ".join(f"**{k}** {m}" for k, m in KIND_MEANING.items()) + ".",
        "",
        "| state | trigger | guard | target | kind | what the callbacks do | callback |",
        "|---|---|---|---|---|---|---|",
    ]
    for state in STATES:
        for row in rows:
            if row.source != state:
                continue
            target = f"{row.dest.value} *(stays)*" if row.internal else row.dest.value
            guard = f"`{_md(row.condition)}`" if row.condition else ""
            callback = f"`{row.callback}`" if row.callback else ""
            out.append(f"| {state.value} | `{row.edge.trigger}` | {guard} | {target} | "
                       f"{row.edge.kind} | {_md(row.edge.does)} | {callback} |")
    terminals = ", ".join(s.value for s in STATES if s in TERMINAL)
    out += [
        "",
        f"{terminals} have no outgoing transitions.",
        "",
        "## Reviewing recorded turns",
        "",
        f"- `{REFRESH_COMMAND}` redraws `diagrams/turn.{{dot,svg,png}}` and this page from the "
        "table; a test fails while the committed copies are stale.",
        f"- `{REFRESH_COMMAND} --journal FILE` draws one recorded turn on the machine: the "
        "edges it took in teal with their order and time, the state it ended in outlined, the "
        f"rest greyed. Repeat `--journal` for a heat map of several turns. Output goes to "
        f"`--out PREFIX` (default `{JOURNAL_PREFIX}`).",
        "- `python -m fsm inspect FILE` prints a turn's passes, tool calls, restarts, time in "
        "each state, and how it ended and why.",
        "",
    ]
    return "\n".join(out)


def write_graph(dot: str, prefix: Path) -> list[Path]:
    """`prefix`.dot, .svg and .png; the images need graphviz's `dot` on the PATH."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    written = [prefix.with_name(prefix.name + ".dot")]
    written[0].write_text(dot, encoding="utf-8")
    for fmt in ("svg", "png"):
        target = prefix.with_name(f"{prefix.name}.{fmt}")
        target.write_bytes(graphviz.pipe("dot", fmt, dot.encode("utf-8"), quiet=True))
        written.append(target)
    return written


def cmd_diagram(args: argparse.Namespace) -> int:
    """Draw the machine (and its markdown table), or the given journals on it."""
    journals = [load_journal(Path(p)) for p in args.journal or []]
    if journals:
        dot = journal_dot(journals)
        prefix = Path(args.out) if args.out else JOURNAL_PREFIX
    else:
        dot = machine_dot()
        prefix = Path(args.out) if args.out else MACHINE_PREFIX
        markdown = Path(args.markdown)
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(transitions_markdown(), encoding="utf-8")
        print(f"wrote {markdown}")
    try:
        written = write_graph(dot, prefix)
    except graphviz.ExecutableNotFound:
        print(f"error: graphviz's `dot` is not installed (Debian package graphviz); only "
              f"{prefix}.dot was written", file=sys.stderr)
        return 1
    except graphviz.CalledProcessError as exc:
        print(f"error: graphviz's `dot` failed (exit {exc.returncode}): "
              f"{_first_line(exc.stderr)}; only {prefix}.dot was written", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


def _first_line(stderr: object) -> str:
    """The first line `dot` wrote to stderr, readable whatever its encoding."""
    if isinstance(stderr, bytes):
        stderr = stderr.decode("utf-8", "replace")
    lines = str(stderr or "").strip().splitlines()
    return lines[0][:200] if lines else "no message"


def cmd_inspect(args: argparse.Namespace) -> int:
    """Print a readable summary of each journal."""
    summaries = [summarize(load_journal(Path(p))) for p in args.file]
    sys.stdout.write("\n".join(summaries))
    return 0


def add_diagram_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `diagram` and `inspect` to the `python -m fsm` subcommands."""
    p = sub.add_parser("diagram", help="draw the turn machine, or recorded journals on it")
    p.add_argument("--journal", action="append", metavar="FILE",
                   help="a recorded journal to draw (repeat for a heat map of several)")
    p.add_argument("--out", metavar="PREFIX",
                   help=f"output prefix for .dot/.svg/.png (default {MACHINE_PREFIX}, "
                        f"with --journal {JOURNAL_PREFIX})")
    p.add_argument("--markdown", default=str(MARKDOWN_PATH), metavar="FILE",
                   help=f"where the transition table goes (default {MARKDOWN_PATH})")
    p.set_defaults(func=cmd_diagram)
    p = sub.add_parser("inspect", help="summarise a recorded journal: passes, tools, "
                                       "restarts, time per state, how it ended")
    p.add_argument("file", nargs="+")
    p.set_defaults(func=cmd_inspect)
