"""`python -m fsm inspect`: a readable summary of a recorded journal, and the bad-input rule
(exit 2, one line naming the file and field) for journals given to `inspect` and `diagram`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fsm.journal import jsonable, write_journal
from fsm.review.inspect import Journal, load_journal, parse_journal, summarize, time_in_states
from fsm.scenarios.format import ScenarioError, load_scenario
from fsm.scenarios.runner import play_virtual

from engine_support import ROOT, load_raw, scenario_files


def _scenario(stem: str) -> Path:
    return next(p for p in scenario_files() if p.stem == stem)


def _document(stem: str) -> dict[str, Any]:
    """The journal `run-scenario --journal` writes for a scenario."""
    path = _scenario(stem)
    played = play_virtual(load_scenario(path))
    document: dict[str, Any] = jsonable(played.journal(load_raw(path)))
    return document


def _journal(stem: str) -> Journal:
    return parse_journal(_document(stem), stem)


def _fsm(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "fsm", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    if "invalid choice" in proc.stderr:
        pytest.fail("fsm/cli.py does not offer the diagram commands yet: add "
                    "`add_diagram_commands(sub)` (from fsm.review.diagram) to build_parser()")
    return proc


def test_e05_summary_names_the_tool_the_restart_and_the_end() -> None:
    # covers issue item 3 on e05 (R1 restart request, R3 stash, R8 flag, R9 next pass)
    text = summarize(_journal("e05_gif_restart_from_stash"))
    assert "process_gif" in text
    assert "restart_requested" in text and "restarts   1" in text
    assert "disable_gif_processing" in text
    assert "Done (terminal)" in text and "status completed" in text
    assert "passes     2" in text
    assert "ContextRestart" in text and "time in state" in text


def test_summary_names_where_a_bot_turn_ran() -> None:
    # covers D4: a bot journal's origin (channel, message, Redis worker and fencing token)
    document = _document("e05_gif_restart_from_stash")
    assert "origin" not in summarize(parse_journal(document, "e05"))
    document["origin"] = {"channel_id": "7", "message_id": "9", "worker": "B", "fence": 3}
    text = summarize(parse_journal(document, "e05"))
    assert "origin     channel 7, message 9, worker B, fence 3" in text


def test_summary_explains_a_kill_and_a_timeout() -> None:
    # covers issue item 3 (how it ended and why): S16 kill, S11/S12 timeout notice and metric
    killed = summarize(_journal("e04_kill_while_streaming"))
    assert "Stopped (terminal)" in killed and "stopped_by_user" in killed
    assert "kill from Streaming" in killed
    timed_out = summarize(_journal("e03_idle_timeout_after_text"))
    assert "TimedOut (terminal)" in timed_out and "timeout_idle" in timed_out
    assert "stream_sdk_timeout" in timed_out


def test_summary_reports_a_failed_tool_and_its_outcome() -> None:
    # covers issue item 3 (tools) on e06: T5/T6 a failed result the model sees
    text = summarize(_journal("e06_tool_failure_then_answer"))
    assert "weather" in text and "failure" in text
    assert "tool_result" in text and "consecutive tool errors at the end: 1" in text


def test_time_in_states_adds_up_to_the_turn() -> None:
    # covers issue item 3 (time spent in each state)
    journal = _journal("e05_gif_restart_from_stash")
    spent, entered = time_in_states(journal)
    assert sum(spent.values()) == pytest.approx(journal.duration)
    assert spent["ToolCall"] == pytest.approx(1.4) and entered["Preparing"] == 2
    assert spent["Done"] == 0.0 and entered["Done"] == 1


def test_json_lines_journal_is_accepted(tmp_path: Path) -> None:
    # covers docs/scenarios.md journal lines: run-scenario's JSON Lines output inspects like a file
    document = _document("e04_kill_while_streaming")
    lines = [json.dumps(line) for line in document["journal"]]
    lines.append(json.dumps({"result": document["result"]}))
    path = tmp_path / "e04.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    journal = load_journal(path)
    assert journal.final_state == "Stopped" and len(journal.transitions) == 3


def test_inspect_command_prints_the_summary(tmp_path: Path) -> None:
    # covers issue item 3 through `python -m fsm inspect FILE`
    path = tmp_path / "e05.json"
    write_journal(path, _document("e05_gif_restart_from_stash"))
    proc = _fsm("inspect", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "process_gif" in proc.stdout and "restarts   1" in proc.stdout
    assert "Done (terminal)" in proc.stdout


@pytest.mark.parametrize("content, needle", [
    ("{not json", "invalid JSON at line 1"),
    ("[1, 2]", "line 1: a journal line is a JSON object"),
    ('{"journal": {}, "result": {}}', "journal: missing or not a list"),
    ('{"journal": [], "result": 3}', "result: missing or not an object"),
    ('{"journal": [{"event": "begin", "from": "Preparing", "to": "Streaming"}], '
     '"result": {}}', "journal[0].t: missing or not a number"),
    ('{"journal": [{"t": 0, "event": "begin", "from": "Preparing"}], "result": {}}',
     "journal[0].to: missing or not a string"),
    ('{"journal": [{"t": 2, "event": "begin", "from": "Preparing", "to": "Streaming"}, '
     '{"t": 1, "event": "completed", "from": "Streaming", "to": "Done"}], "result": {}}',
     "journal[1].t: 1 is earlier"),
    ('{"journal": [], "result": {"status": 7}}', "result.status: not a string"),
    ("", "empty file"),
])
def test_malformed_journal_raises_scenario_error(tmp_path: Path, content: str,
                                                 needle: str) -> None:
    # covers the bad-input rule for journals: ScenarioError, one line naming file and field
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_journal(path)
    message = str(caught.value)
    assert str(path) in message and needle in message and "\n" not in message


@pytest.mark.parametrize("command", [["inspect"], ["diagram", "--journal"]])
def test_malformed_journal_exits_2_with_one_line(tmp_path: Path, command: list[str]) -> None:
    # covers the bad-input rule through the CLI: exit 2, one line on stderr, no traceback
    path = tmp_path / "bad.json"
    path.write_text('{"journal": [{"t": "soon"}], "result": {}}', encoding="utf-8")
    proc = _fsm(*command, str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert str(path) in proc.stderr and "journal[0].t" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_diagram_rejects_a_state_the_table_does_not_know(tmp_path: Path) -> None:
    # covers the bad-input rule for `diagram --journal`: a journal that cannot be drawn
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"journal": [
        {"t": 0, "event": "begin", "from": "Preparing", "to": "Thinking"}],
        "result": {"status": "completed"}}), encoding="utf-8")
    proc = _fsm("diagram", "--journal", str(path), "--out", str(tmp_path / "odd"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "'Thinking' is not a state" in proc.stderr
    assert not (tmp_path / "odd.dot").exists()


def test_missing_journal_file_exits_2(tmp_path: Path) -> None:
    # covers the bad-input rule for an unreadable file
    proc = _fsm("inspect", str(tmp_path / "nope.json"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr
