"""SIGTERM and Ctrl-C (SIGINT) stop the bot process gracefully with a reply streaming
(O8; S7, D3): exit status 0, no traceback, the reply Stopped and its journal
written, on uvloop (the bot's loop, D55) and on asyncio's. A real process, real signals,
real time (no timed asserts)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from engine_support import ROOT


@pytest.mark.asyncio
@pytest.mark.parametrize(("sig", "loop"), [(signal.SIGTERM, "uvloop"), (signal.SIGINT, "uvloop"),
                                           (signal.SIGTERM, "asyncio")],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-asyncio"])
async def test_a_signal_stops_the_bot_cleanly_with_a_reply_streaming(
        tmp_path: Path, sig: signal.Signals, loop: str) -> None:
    # covers S7 and D3 at shutdown: the running reply ends Stopped, its journal is flushed;
    # and D55: on uvloop, the bot's loop, as on asyncio's
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "tests" / "operator_process.py"), str(tmp_path), loop,
        cwd=tmp_path, env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line == b"STREAMING\n", (await proc.stderr.read()).decode()
    proc.send_signal(sig)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    log = err.decode()
    assert proc.returncode == 0, log
    assert "Traceback" not in log and f"{sig.name} received: stopping" in log
    assert f"INFO turn_engine.event_loop: event loop: {loop}" in log
    [journal] = tmp_path.glob("*.json")
    assert json.loads(journal.read_text())["result"]["status"] == "stopped_by_user"


def test_ctrl_c_while_the_main_job_starts_is_quiet(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # covers O8: Ctrl-C before the job installs its own handling (settings loading, Discord
    # logging in, the chat starting) ends the command with exit 0 and one line, no traceback
    import turn_engine.__main__ as main_job

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(main_job, "load_settings", interrupted)
    assert main_job.main("auto") == 0
    assert capsys.readouterr().err == "stopped (Ctrl-C)\n"
