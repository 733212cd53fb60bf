"""The state diagram drawn from fsm/table.py, the journal overlays and the generated docs
(`python -m fsm diagram`): coverage of every edge, styling, drift of the committed files,
highlighting and heat maps."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from transitions.extensions.diagrams import GraphMachine

from fsm.engine.machine import transition_specs
from fsm.engine.table import STATES, TABLE, TERMINAL, edge_keys
from fsm.review.diagram import (
    FADED,
    KIND_STYLE,
    REFRESH_COMMAND,
    RUNNING_FILL,
    TERMINAL_FILL,
    build_graph,
    journal_dot,
    machine_dot,
    overlay_of,
    transitions_markdown,
)
from fsm.review.inspect import Journal, parse_journal
from fsm.scenarios.format import load_scenario
from fsm.scenarios.runner import play_virtual

from engine_support import ROOT, load_raw, scenario_files

Key = tuple[str, str, str]
KEY_COMMENT = re.compile(r"^\s*// key (\S+) (\S+) -> (\S+)$", re.M)
EDGE_LINE = re.compile(r"^\s*(\S+) -> (\S+) \[(.*)\]$", re.M)
NODE_LINE = re.compile(r"^\s*(\w+) \[(.*)\]$", re.M)


def _scenario(stem: str) -> Path:
    return next(p for p in scenario_files() if p.stem == stem)


def _journal(stem: str) -> Journal:
    """A journal produced by running a scenario on the real engine, as `--journal` writes."""
    path = _scenario(stem)
    played = play_virtual(load_scenario(path))
    return parse_journal(played.journal(load_raw(path)), stem)


def _attr(attrs: str, name: str) -> str | None:
    match = re.search(rf'(?:^|\s){name}=("(?:[^"\\]|\\.)*"|<.*>|\S+)', attrs, re.S)
    if match is None:
        return None
    value = match.group(1)
    return value[1:-1] if value.startswith('"') else value


def _edges(dot: str) -> list[tuple[str, str, str]]:
    """(tail, head, attributes) of every edge statement in a DOT text."""
    return [(m.group(1), m.group(2), m.group(3)) for m in EDGE_LINE.finditer(dot)]


def _nodes(dot: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in NODE_LINE.finditer(dot)
            if m.group(1) not in ("graph", "node", "edge")}


def _taken(dot: str) -> dict[str, str]:
    """id -> label of the edges an overlay marks as taken."""
    return {_attr(a, "id") or "": _attr(a, "label") or "" for _, _, a in _edges(dot)
            if _attr(a, "class") == "taken"}


def _key_id(key: Key) -> str:
    return ":".join(key)


def test_committed_dot_matches_the_table() -> None:
    # covers issue item 5 (drift check): diagrams/turn.dot is what the table draws today
    committed = ROOT / "diagrams" / "turn.dot"
    assert committed.exists(), f"diagrams/turn.dot is missing: run `{REFRESH_COMMAND}`"
    assert committed.read_text(encoding="utf-8") == machine_dot(), (
        f"diagrams/turn.dot is out of date with fsm/table.py: run `{REFRESH_COMMAND}` and "
        "commit diagrams/ and docs/transitions.md")


def test_committed_markdown_matches_the_table() -> None:
    # covers issue items 4 and 5: docs/transitions.md is generated and checked for drift
    committed = ROOT / "docs" / "transitions.md"
    assert committed.exists(), f"docs/transitions.md is missing: run `{REFRESH_COMMAND}`"
    assert committed.read_text(encoding="utf-8") == transitions_markdown(), (
        f"docs/transitions.md is out of date with fsm/table.py: run `{REFRESH_COMMAND}` and "
        "commit docs/transitions.md and diagrams/")


def test_rendering_is_deterministic_across_processes() -> None:
    # covers issue item 5: same table, same bytes (no timestamps, no hash-order dependence)
    script = ("import sys; from fsm.review.diagram import machine_dot, transitions_markdown; "
              "sys.stdout.write(machine_dot() + transitions_markdown())")
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        outputs.add(proc.stdout)
    assert outputs == {machine_dot() + transitions_markdown()}


def _carriers(dot: str) -> list[tuple[str, list[Key]]]:
    """Each DOT statement preceded by `// key` comments, with the keys it carries."""
    out: list[tuple[str, list[Key]]] = []
    pending: list[Key] = []
    for line in dot.splitlines():
        comment = KEY_COMMENT.match(line)
        if comment:
            pending.append((comment.group(1), comment.group(2), comment.group(3)))
        elif pending:
            out.append((line.strip(), pending))
            pending = []
    return out


def test_every_table_edge_appears_once_in_the_dot() -> None:
    # covers issue item 1: every (trigger, source, dest) of the table is in the DOT, checkably
    dot = machine_dot()
    carried = [key for _, keys in _carriers(dot) for key in keys]
    assert sorted(carried) == sorted(edge_keys())
    assert len(carried) == len(set(carried))
    for statement, keys in _carriers(dot):
        edge = EDGE_LINE.match(statement)
        if edge is None:  # a state listing its internal transitions
            assert all(k[1] == k[2] == statement.split(" ")[0] for k in keys), statement
            continue
        assert all(k[2] == edge.group(2) for k in keys), statement
        if len(keys) == 1:
            assert _attr(edge.group(3), "id") == _key_id(keys[0]), statement
        else:  # one arrow for several sources leaves their cluster
            assert _attr(edge.group(3), "ltail") is not None or \
                len({k[1] for k in keys}) == 1, statement


def test_every_state_appears_and_each_edge_names_its_trigger() -> None:
    # covers issue item 1: every state and every transition, labelled with trigger and guard
    dot = machine_dot()
    nodes = _nodes(dot)
    assert {s.value for s in STATES} <= set(nodes)
    labels = " ".join(_attr(a, "label") or "" for _, _, a in _edges(dot))
    labels += " ".join(nodes.values())
    for edge in TABLE:
        assert edge.trigger in labels
        for guard in (*edge.guards, *edge.unless):
            assert f"[{guard}]" in labels or f"[not {guard}]" in labels, guard


def test_dot_agrees_with_transitions_graph_machine() -> None:
    # covers issue item 1: the hand-built diagram draws what transitions' own GraphMachine
    # sees in the runtime specs (same (trigger, source, dest) set), so it cannot drift from it
    class Model:
        pass

    model = Model()
    GraphMachine(model=model, states=[s.value for s in STATES], transitions=transition_specs(),
                 initial=STATES[0].value, auto_transitions=False, graph_engine="graphviz",
                 show_conditions=True)
    source = model.get_graph().source  # type: ignore[attr-defined]
    seen: set[Key] = set()
    for tail, head, attrs in _edges(source):
        for part in (_attr(attrs, "label") or "").split(" | "):
            seen.add((part.split(" ")[0], tail, head))
    assert seen == edge_keys()
    dot = machine_dot()
    assert {(m.group(1), m.group(2), m.group(3)) for m in KEY_COMMENT.finditer(dot)} == seen


def test_terminal_states_look_terminal() -> None:
    # covers issue item 1: terminal states are double circles with their own fill
    nodes = _nodes(machine_dot())
    for state in STATES:
        attrs = nodes[state.value]
        if state in TERMINAL:
            assert _attr(attrs, "shape") == "doublecircle"
            assert _attr(attrs, "fillcolor") == TERMINAL_FILL[state.value] != RUNNING_FILL
        else:
            assert _attr(attrs, "shape") is None  # the default rounded box
            assert _attr(attrs, "fillcolor") == RUNNING_FILL


def test_timer_and_kill_edges_are_told_apart_with_a_legend() -> None:
    # covers issue item 1: timer (dashed amber) and kill (bold red) edges, and the legend
    dot = machine_dot()
    kinds = {e.trigger: e.kind for e in TABLE}
    assert KIND_STYLE["timer"]["style"] != KIND_STYLE["kill"]["style"]
    assert KIND_STYLE["timer"]["color"] != KIND_STYLE["kill"]["color"]
    styled: Counter[str] = Counter()
    for _, _, attrs in _edges(dot):
        arrow_id = _attr(attrs, "id") or ""
        trigger = arrow_id.split(":")[0]
        if trigger in kinds and _attr(attrs, "style") != "invis":
            kind = kinds[trigger]
            assert _attr(attrs, "style") == KIND_STYLE[kind]["style"], arrow_id
            assert _attr(attrs, "color") == KIND_STYLE[kind]["color"], arrow_id
            styled[kind] += 1
    assert styled["timer"] >= 2 and styled["kill"] == 1
    graph_label = re.search(r"graph \[.*label=(<.*>) labeljust", dot)
    assert graph_label is not None
    for kind in ("flow", "worker", "timer", "kill", "error"):
        assert f"{kind}</font>:" in graph_label.group(1)


def test_kill_and_crash_are_drawn_once_from_the_running_cluster() -> None:
    # covers issue item 1 (compact kill/crash) and S16 (kill from every running state)
    dot = machine_dot()
    from_cluster = {_attr(a, "id"): a for _, _, a in _edges(dot)
                    if _attr(a, "ltail") == "cluster_running"}
    assert set(from_cluster) == {"kill:cluster_running:Stopped", "crash:cluster_running:Done"}
    assert "every running state" in (_attr(from_cluster["kill:cluster_running:Stopped"],
                                           "label") or "")
    crash_sources = {s.value for e in TABLE if e.trigger == "crash" for s in e.sources}
    missing = {s.value for s in STATES if s not in TERMINAL} - crash_sources
    crash_label = _attr(from_cluster["crash:cluster_running:Done"], "label") or ""
    assert all(name in crash_label for name in missing)


def test_internal_transitions_are_listed_in_their_state() -> None:
    # covers issue item 1: dest None (stays put) is listed in the state's label, T3 follow-up
    nodes = _nodes(machine_dot())
    for edge in TABLE:
        if edge.dest is None:
            for source in edge.sources:
                label = _attr(nodes[source.value], "label") or ""
                assert "stays on" in label and edge.trigger in label, (edge.trigger, source)


def test_markdown_lists_every_row_with_guard_target_and_callback() -> None:
    # covers issue item 4: state, trigger, guard, target, what the callbacks do, callback name
    md = transitions_markdown()
    rows = [line for line in md.splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) == len(edge_keys())
    for edge in TABLE:
        for source in edge.sources:
            dest = (edge.dest or source).value
            assert any(row.startswith(f"| {source.value} | `{edge.trigger}` |")
                       and f"| {dest}" in row and edge.does in row
                       and f"`{edge.callback}`" in row for row in rows), \
                (edge.trigger, source)
    assert "../diagrams/turn.svg" in md and REFRESH_COMMAND in md


def test_journal_highlight_marks_exactly_the_visited_edges() -> None:
    # covers issue item 2 on e05 (tool call, context restart R1/R9, second pass)
    journal = _journal("e05_gif_restart_from_stash")
    dot = journal_dot([journal])
    visited = {tr.key for tr in journal.transitions}
    taken = _taken(dot)
    assert set(taken) == {_key_id(k) for k in visited}
    for order, tr in enumerate(journal.transitions, 1):
        assert f"#{order} @" in taken[_key_id(tr.key)], tr
    assert "#1 @0s, #6 @2s" in taken["begin:Preparing:AwaitingFirstToken"]
    keys = [(m.group(1), m.group(2), m.group(3)) for m in KEY_COMMENT.finditer(dot)]
    assert sorted(keys) == sorted(edge_keys())  # each key drawn once, taken or faded
    nodes = _nodes(dot)
    states_on_path = {journal.transitions[0].source} | {tr.dest for tr in journal.transitions}
    for state in STATES:
        label = _attr(nodes[state.value], "label") or ""
        if state.value == journal.final_state:
            assert "ended here" in label and _attr(nodes[state.value], "penwidth") == "3.5"
        elif state.value in states_on_path:
            assert "entered" in label
        else:
            assert _attr(nodes[state.value], "fontcolor") is not None  # faded


def test_journal_edges_not_taken_are_faded() -> None:
    # covers issue item 2: the rest of the machine is faded
    dot = journal_dot([_journal("e04_kill_while_streaming")])
    for _, _, attrs in _edges(dot):
        arrow_id = _attr(attrs, "id") or ""
        if _attr(attrs, "class") == "taken" or arrow_id.startswith("start") \
                or _attr(attrs, "style") == "invis":
            continue
        assert _attr(attrs, "color") == FADED and _attr(attrs, "class") == "untaken", arrow_id
    assert "kill:Streaming:Stopped" in _taken(dot)


def test_heat_map_counts_how_often_each_edge_was_taken() -> None:
    # covers issue item 2 (several journals give a heat map)
    journals = [_journal("e05_gif_restart_from_stash"), _journal("e01_plain_reply"),
                _journal("e05_gif_restart_from_stash")]
    expected = Counter(tr.key for j in journals for tr in j.transitions)
    taken = _taken(journal_dot(journals))
    assert set(taken) == {_key_id(k) for k in expected}
    for key, count in expected.items():
        assert taken[_key_id(key)].endswith(f"×{count}"), key
    assert expected[("begin", "Preparing", "AwaitingFirstToken")] == 5
    overlay = overlay_of(journals)
    assert overlay.heat and overlay.ended["Done"] == 3


def test_overlay_graph_renders(tmp_path: Path) -> None:
    # covers issue item 2: the overlay DOT is valid for graphviz (renders to SVG)
    graph = build_graph(overlay_of([_journal("e03_idle_timeout_after_text")]))
    svg = graph.pipe(format="svg").decode()
    assert 'class="edge taken"' in svg and "idle_timeout:Streaming:Settling" in svg


def _fsm(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "fsm", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    if "invalid choice" in proc.stderr:
        pytest.fail("fsm/cli.py does not offer the diagram commands yet: add "
                    "`add_diagram_commands(sub)` (from fsm.review.diagram) to build_parser()")
    return proc


def test_diagram_command_writes_dot_svg_png_and_markdown(tmp_path: Path) -> None:
    # covers issue items 1 and 4 through `python -m fsm diagram`
    proc = _fsm("diagram", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in ("turn.dot", "turn.svg", "turn.png"):
        assert (tmp_path / "diagrams" / name).stat().st_size > 0, name
    assert (tmp_path / "diagrams" / "turn.dot").read_text(encoding="utf-8") == machine_dot()
    assert (tmp_path / "docs" / "transitions.md").read_text(encoding="utf-8") \
        == transitions_markdown()
    assert (tmp_path / "diagrams" / "turn.png").read_bytes().startswith(b"\x89PNG")


def test_diagram_command_draws_journals_at_the_out_prefix(tmp_path: Path) -> None:
    # covers issue item 2 through the CLI: --journal (repeatable) and --out PREFIX
    first = tmp_path / "e01.json"
    second = tmp_path / "e04.json"
    for stem, target in (("e01_plain_reply", first), ("e04_kill_while_streaming", second)):
        proc = _fsm("run-scenario", str(_scenario(stem)), "--journal", str(target))
        assert proc.returncode == 0, proc.stderr
    proc = _fsm("diagram", "--journal", str(first), "--journal", str(second),
                "--out", str(tmp_path / "out" / "heat"))
    assert proc.returncode == 0, proc.stderr
    dot = (tmp_path / "out" / "heat.dot").read_text(encoding="utf-8")
    assert _taken(dot)["begin:Preparing:AwaitingFirstToken"].endswith("×2")
    assert (tmp_path / "out" / "heat.svg").exists() and (tmp_path / "out" / "heat.png").exists()
    assert not (tmp_path / "docs").exists()
