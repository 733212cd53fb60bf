"""`python -m providers stream-file` as a real subprocess: one JSON object on stdout, exit 2
with one line on stderr for bad input. Only pause-free fixtures here (no virtual time in a
subprocess); the stall case uses a 0.3 s idle timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from providers_support import EXPECTED, FIXTURES, assert_matches_expected

PROJECT = Path(__file__).resolve().parent.parent


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "providers", *args],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("kind", "case"),
    [
        ("openai", "text_then_tool_call"),
        ("anthropic", "parallel_tool_calls"),
        ("gemini", "plain_text"),
    ],
)
def test_stream_file_prints_the_normalized_result(kind: str, case: str) -> None:
    """covers S3, T4: one fixture per format end to end through the command line."""
    done = run_cli("stream-file", "--format", kind, str(FIXTURES / kind / f"{case}.sse"))
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    result = json.loads(line)
    assert set(result) == {"text", "reasoning", "tool_calls", "finish_reason", "usage", "error"}
    assert_matches_expected(result, EXPECTED[kind][case])


def test_stream_file_reports_a_stall() -> None:
    """covers S5: the idle timeout aborts a hanging stream and keeps the text so far."""
    done = run_cli(
        "stream-file",
        "--format",
        "gemini",
        "--idle-timeout",
        "0.3",
        str(FIXTURES / "gemini" / "stall.sse"),
    )
    assert done.returncode == 0, done.stderr
    assert_matches_expected(json.loads(done.stdout), EXPECTED["gemini"]["stall"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["stream-file", "--format", "openai", "/no/such/file.sse"], "no such file"),
        (["stream-file", "--format", "cohere", "x.sse"], "invalid choice"),
        (["stream-file", "--format", "openai", "--idle-timeout", "0", "x.sse"], "must be positive"),
        (["stream-file", "--format", "openai"], "required"),
        ([], "required"),
    ],
)
def test_bad_invocations_exit_2_with_one_line(args: list[str], message: str) -> None:
    """covers S15: usage errors are reported plainly, not as tracebacks."""
    done = run_cli(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert message in line


def test_bad_directive_exits_2(tmp_path: Path) -> None:
    """covers S15: a recording with an unknown directive names the line."""
    bad = tmp_path / "bad.sse"
    bad.write_bytes(b"data: {}\n\n:@explode\n")
    done = run_cli("stream-file", "--format", "openai", str(bad))
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "line 3: unknown replay directive ':@explode'" in line
