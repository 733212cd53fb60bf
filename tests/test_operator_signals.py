"""SIGTERM and Ctrl-C (SIGINT) stop the bot process gracefully with a reply streaming
(O8; S7, D3): exit status 0, no traceback, the reply Stopped and its journal
written. A real process, real signals, real time (no timed asserts)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from engine_support import ROOT


@pytest.mark.asyncio
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_stops_the_bot_cleanly_with_a_reply_streaming(
        tmp_path: Path, sig: signal.Signals) -> None:
    # covers S7 and D3 at shutdown: the running reply ends Stopped, its journal is flushed
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "tests" / "operator_process.py"), str(tmp_path),
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
    [journal] = tmp_path.glob("*.json")
    assert json.loads(journal.read_text())["result"]["status"] == "stopped_by_user"
