"""The bot process's event loop (D55): uvloop where it is installed, asyncio's own loop
where it is not or where `TURN_EVENT_LOOP=asyncio` asks for it, and one log line naming the
loop. The real bot on each loop (signals, gateway, a streaming reply) is in
tests/test_operator_signals.py."""

from __future__ import annotations

import asyncio
import logging
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from turn_engine.bot import run_bot
from turn_engine.event_loop import EventLoopChoice, run_on_event_loop
from turn_engine.settings import AppSettings, ConfigurationError, load_settings
from turn_engine.startup import StartupError

pytestmark = [pytest.mark.spec("D55"),
              pytest.mark.skipif(sys.platform == "win32", reason="uvloop is not on Windows")]


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def _loop_of(choice: EventLoopChoice) -> str:
    loop = run_on_event_loop(_running_loop(), choice)
    return f"{type(loop).__module__}.{type(loop).__qualname__}"


def _loop_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "turn_engine.event_loop" and r.levelno == logging.INFO]


def test_the_bot_runs_on_uvloop_where_it_is_installed(caplog: pytest.LogCaptureFixture) -> None:
    # covers D55: the default is uvloop's loop, named in one line with its version
    import uvloop

    caplog.set_level(logging.INFO, logger="turn_engine.event_loop")
    assert _loop_of("uvloop") == f"{uvloop.Loop.__module__}.{uvloop.Loop.__qualname__}"
    assert _loop_lines(caplog) == [f"event loop: uvloop {version('uvloop')}"]


def test_without_uvloop_the_bot_runs_on_asyncio_and_says_why(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # covers D55: where uvloop cannot be imported (Windows, a trimmed install), asyncio's loop
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    caplog.set_level(logging.INFO, logger="turn_engine.event_loop")
    assert _loop_of("uvloop") == "asyncio.unix_events._UnixSelectorEventLoop"
    assert _loop_lines(caplog) == ["event loop: asyncio (uvloop is not installed)"]


def test_turn_event_loop_asyncio_chooses_asyncio_where_uvloop_is_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # covers D55 with O3: the operator's switch, read like every other setting
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TURN_EVENT_LOOP", "asyncio")
    choice = load_settings().event_loop
    caplog.set_level(logging.INFO, logger="turn_engine.event_loop")
    assert _loop_of(choice) == "asyncio.unix_events._UnixSelectorEventLoop"
    assert _loop_lines(caplog) == ["event loop: asyncio (TURN_EVENT_LOOP=asyncio)"]


def test_an_unknown_event_loop_is_one_line_naming_the_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # covers D55 with O3: a value that is not a loop is refused at start-up
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TURN_EVENT_LOOP", "trio")
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    [problem] = raised.value.problems
    assert "TURN_EVENT_LOOP" in problem and "'uvloop'" in problem and "'asyncio'" in problem


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_run_bot_starts_on_the_loop_the_settings_choose(
        choice: EventLoopChoice, caplog: pytest.LogCaptureFixture) -> None:
    # covers D55: `turn-engine bot` makes its loop from the setting before anything else
    caplog.set_level(logging.INFO, logger="turn_engine.event_loop")
    with pytest.raises(StartupError, match="TURN_DISCORD_TOKEN is not set"):
        run_bot(AppSettings(discord_token=None, event_loop=choice))
    [line] = _loop_lines(caplog)
    assert line.startswith(f"event loop: {choice}")
