"""`python -m fsm run-scenario` and `replay` as docs/scenarios.md describes them, and the main
job's embedded default. These run the real CLI in a subprocess (virtual clock inside)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine_support import EXAMPLE_SCENARIOS, ROOT

E03 = EXAMPLE_SCENARIOS / "e03_idle_timeout_after_text.json"
OWN = ROOT / "tests" / "scenarios"


def _fsm(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsm", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_run_scenario_prints_transitions_then_result() -> None:
    # covers S10, S12 via the CLI; docs/scenarios.md "Commands"
    source = E03 if E03.exists() else OWN / "s10_send_on_the_wire_lands_while_settling.json"
    proc = _fsm("run-scenario", str(source))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    *transitions, last = lines
    assert all(set(line) == {"t", "event", "from", "to"} for line in transitions)
    assert set(last) == {"result"} and last["result"]["state"] == "TimedOut"


@pytest.mark.parametrize("content, needle", [
    ("{not json", "invalid JSON at line 1"),
    ('{"passes": [[{"at": 1, "txt": "x"}]]}', "passes[0][0]"),
    ('{"passes": [[{"at": -1, "text": "x"}]]}', "passes[0][0].at"),
    ('{"config": {"idle_timeout_s": "soon"}}', "config.idle_timeout_s"),
    ('{"tools": {"t": [{"after": 1}]}}', "tools.t"),
    ('{"events": [{"at": 1}]}', "events[0]"),
    ("[1, 2]", "a scenario is a JSON object"),
])
def test_malformed_scenario_exits_2_with_one_line(tmp_path: Path, content: str,
                                                  needle: str) -> None:
    # covers the scenario format's bad-input rule: exit 2, one line naming file and field
    path = tmp_path / "bad.json"
    path.write_text(content)
    proc = _fsm("run-scenario", str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1
    assert str(path) in proc.stderr and needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_file_exits_2(tmp_path: Path) -> None:
    # covers the same rule for an unreadable file
    proc = _fsm("run-scenario", str(tmp_path / "nope.json"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr


def test_unknown_fields_are_ignored(tmp_path: Path) -> None:
    # covers docs/scenarios.md: a scenario written for a later version still runs
    path = tmp_path / "future.json"
    path.write_text(json.dumps({"name": "f", "future_field": 1, "config": {"warp": 9},
                                "passes": [[{"at": 1, "text": "x", "colour": "red"},
                                            {"at": 2, "end": "completed"}]]}))
    proc = _fsm("run-scenario", str(path))
    assert proc.returncode == 0, proc.stderr


def test_replay_accepts_untouched_and_rejects_tampered(tmp_path: Path) -> None:
    # covers docs/scenarios.md `replay`: exit 0 on a match, exit 1 with the first difference
    journal = tmp_path / "j.json"
    source = OWN / "r09_restart_resets_error_counters.json"
    assert _fsm("run-scenario", str(source), "--journal", str(journal)).returncode == 0
    ok = _fsm("replay", str(journal))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    document = json.loads(journal.read_text())
    document["journal"][2]["t"] = 1.5
    tampered = tmp_path / "t.json"
    tampered.write_text(json.dumps(document))
    bad = _fsm("replay", str(tampered))
    assert bad.returncode == 1 and "journal[2].t" in bad.stdout
    document = json.loads(journal.read_text())
    document["result"]["consecutive_tool_errors"] = 3
    tampered.write_text(json.dumps(document))
    bad = _fsm("replay", str(tampered))
    assert bad.returncode == 1 and "result.consecutive_tool_errors" in bad.stdout


def test_replay_accepts_json_lines_with_a_scenario_line(tmp_path: Path) -> None:
    # covers docs/scenarios.md: a recorded journal carries the scenario fields that reproduce it
    source = OWN / "t01_iteration_cap.json"
    proc = _fsm("run-scenario", str(source))
    scenario = json.loads(source.read_text())
    path = tmp_path / "j.jsonl"
    path.write_text(json.dumps({"scenario": scenario}) + "\n" + proc.stdout)
    assert _fsm("replay", str(path)).returncode == 0


def test_replay_of_a_malformed_journal_exits_2(tmp_path: Path) -> None:
    # covers the bad-input rule for journals
    path = tmp_path / "j.json"
    path.write_text(json.dumps({"passes": []}))
    proc = _fsm("replay", str(path))
    assert proc.returncode == 2 and "journal" in proc.stderr


def test_main_job_plays_built_in_turns_and_leaves_replayable_journals(tmp_path: Path) -> None:
    # covers S7, S10, R3 end to end through the embedded default
    proc = _fsm("demo", "--journals", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    for word in ("Done", "TimedOut", "Stopped", "ContextRestart", "ToolCall"):
        assert word in proc.stdout
    journals = sorted(tmp_path.glob("*.json"))
    assert len(journals) == 5
    for journal in journals:
        replayed = _fsm("replay", str(journal))
        assert replayed.returncode == 0, replayed.stdout
