"""Crafted journals meet one-line errors, never tracebacks (issue 12): `inspect`,
`diagram --journal` and `replay` on huge integers, non-finite numbers, lone surrogates,
and a graphviz that fails. Run as a user runs them: `python -m fsm` in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_support import OWN_SCENARIOS, ROOT

COMMANDS = (("inspect",), ("diagram", "--journal"), ("replay",))


def _fsm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fsm", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env, encoding="utf-8",
                          errors="backslashreplace")


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("j") / "ok.json"
    source = OWN_SCENARIOS / "r09_restart_resets_error_counters.json"
    assert _fsm("run-scenario", str(source), "--journal", str(path)).returncode == 0
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _one_line_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("where", ["transition time", "step time", "result count"])
def test_a_400_digit_integer_is_a_one_line_error(tmp_path: Path, journal: dict[str, Any],
                                                  command: tuple[str, ...], where: str) -> None:
    # covers the bad-input rule for journals: no OverflowError traceback
    text = json.dumps(journal)
    huge = "9" * 400
    if where == "transition time":
        text = text.replace('"t": 0.0', f'"t": {huge}', 1)
    elif where == "step time":
        text = text.replace('"at": ', f'"at": {huge}, "was": ', 1)
    else:
        text = text.replace('"reactor_lookups": 0', f'"reactor_lookups": {huge}', 1)
    assert huge in text
    path = tmp_path / "huge.json"
    path.write_text(text, encoding="utf-8")
    out = ["--out", str(tmp_path / "drawn")] if command[0] == "diagram" else []
    _one_line_error(_fsm(*command, str(path), *out), str(path), "400 digits")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_number_out_of_range_is_a_one_line_error(tmp_path: Path, journal: dict[str, Any],
                                                   command: tuple[str, ...]) -> None:
    # covers the bad-input rule: 1e999 reads as infinity in Python; refused where it is read
    path = tmp_path / "inf.json"
    path.write_text(json.dumps(journal).replace('"t": 0.0', '"t": 1e999', 1), encoding="utf-8")
    out = ["--out", str(tmp_path / "drawn")] if command[0] == "diagram" else []
    _one_line_error(_fsm(*command, str(path), *out), "out of range")


def test_lone_surrogates_are_shown_not_fatal(tmp_path: Path, journal: dict[str, Any]) -> None:
    # covers the bad-input rule: half an emoji in a name or a text prints escaped or as
    # U+FFFD; replay compares it like any other text
    crafted = dict(journal, name="bad \ud83d name")
    crafted["result"] = dict(journal["result"], text="cut \udc00")
    path = tmp_path / "surrogate.json"
    path.write_text(json.dumps(crafted), encoding="utf-8")  # \ud83d escapes: valid JSON
    shown = _fsm("inspect", str(path))
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert "bad \ufffd name" in shown.stdout
    drawn = _fsm("diagram", "--journal", str(path), "--out", str(tmp_path / "drawn"))
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "drawn.dot").read_text(encoding="utf-8")
    replayed = _fsm("replay", str(path))
    assert replayed.returncode == 1 and "Traceback" not in replayed.stderr, replayed.stderr
    assert "result.text" in replayed.stdout and "\\udc00" in replayed.stdout


def test_a_failing_graphviz_is_a_one_line_error(tmp_path: Path, journal: dict[str, Any]) -> None:
    # covers the bad-input rule: `dot` exiting with an error is named, the .dot is kept
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(journal), encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_dot = bin_dir / "dot"
    fake_dot.write_text("#!/bin/sh\necho 'Error: syntax error in line 1' >&2\nexit 3\n")
    fake_dot.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = _fsm("diagram", "--journal", str(path), "--out", str(tmp_path / "drawn"), env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    line, = proc.stderr.strip().splitlines()
    assert line.startswith("error: graphviz's `dot` failed (exit 3): Error: syntax error")
    assert (tmp_path / "drawn.dot").exists()


def test_an_unwritable_output_is_a_one_line_error(tmp_path: Path,
                                                  journal: dict[str, Any]) -> None:
    # covers the bad-input rule: a drawing into a path that cannot be a folder
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(journal), encoding="utf-8")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = _fsm("diagram", "--journal", str(path), "--out", str(blocker / "sub" / "drawn"))
    _one_line_error(proc)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**40, 10**40)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["t", "at", "event", "from", "to", "journal", "result",
                                       "passes", "text", "name", "status", "tools", "events",
                                       "x"]), children, max_size=5),
    max_leaves=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=JSON)
def test_any_json_is_read_or_refused_in_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                 data: Any) -> None:
    # covers the bad-input rule for journals, fuzzed: reading, summarising and replaying a
    # document of any shape is a result or a ScenarioError, never another exception
    from fsm.journal import ScenarioError, read_journal
    from fsm.review.inspect import parse_journal, summarize
    from fsm.review.replay import replay_difference

    path = tmp_path_factory.mktemp("fuzz") / "j.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    try:
        loaded = read_journal(path)
    except ScenarioError as exc:
        assert "\n" not in str(exc)
        return
    for step in (lambda: summarize(parse_journal(loaded, "fuzz")),
                 lambda: replay_difference(loaded, "fuzz")):
        try:
            step()
        except ScenarioError as exc:
            assert "\n" not in str(exc)
