"""Running the bot (O2, O4, O7, O9): log lines with timestamps and levels that
never carry a secret; the turn-end line with its tokens; journal retention by count, age and
size, and journals off; the persona file with {date} and {time}, re-read when it changes;
the enrichment tools on, off or listed. Pure units plus one `python -m turn_engine` run."""

from __future__ import annotations

import asyncio
import datetime
import io
import logging
import os
import re
import sys
from pathlib import Path

import pytest

from discord_io.enrichment_tools import EnrichmentTools
from discord_io.media_fetch import MediaFetcher
from fsm.engine.generation import GenerationResult
from fsm.engine.result import PassResult, TurnResult
from turn_engine.journals import JournalStore
from turn_engine.live_settings import select_tools
from turn_engine.logging_setup import REDACTED, setup_logging
from turn_engine.persona import Persona
from turn_engine.settings import ConfigurationError, JournalSettings, ToolSettings
from turn_engine.turn_log import turn_end_line

from engine_support import ROOT

SECRET = "MTIzNDU2Nzg5.token-that-must-never-show"


@pytest.fixture
def log_stream() -> io.StringIO:
    stream = io.StringIO()
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    setup_logging("INFO", "WARNING", secrets=[SECRET, "sk-key-1"], stream=stream)
    yield stream
    for handler in list(root.handlers):
        if getattr(handler, "turn_engine", False):
            root.removeHandler(handler)
    root.handlers[:] = before[0]
    root.setLevel(before[1])


def test_log_lines_are_timestamped_levelled_and_never_hold_a_secret(
        log_stream: io.StringIO) -> None:
    # covers O7: timestamps, level setting, no secrets (args and tracebacks too)
    log = logging.getLogger("turn_engine.test")
    log.info("connecting with %s", SECRET)
    log.debug("not shown at INFO")
    logging.getLogger("discord.client").info("library chatter below WARNING")
    try:
        raise RuntimeError(f"Authorization: Bot {SECRET} and sk-key-1")
    except RuntimeError:
        log.exception("failed")
    text = log_stream.getvalue()
    assert SECRET not in text and "sk-key-1" not in text and text.count(REDACTED) >= 3
    lines = text.splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO turn_engine\.test: "
                        r"connecting with \[redacted\]", lines[0])
    assert "not shown" not in text and "library chatter" not in text


def test_discord_reconnect_attempts_are_one_line_each(log_stream: io.StringIO) -> None:
    # covers O7: discord.py's reconnect loop logs a traceback per attempt; the operator gets
    # one line per attempt naming what failed and when it tries again, secrets still scrubbed
    shard = logging.getLogger("discord.shard")
    try:
        raise OSError(f"Cannot connect to host gateway.discord.gg:443 ssl:default {SECRET}")
    except OSError as exc:
        shard.error("Attempting a reconnect for shard ID %s in %.2fs", 0, 4.0, exc_info=exc)
    try:
        raise TimeoutError
    except TimeoutError:
        logging.getLogger("discord.client").exception("Attempting a reconnect in %.2fs", 8.0)
    try:
        raise ValueError("a bug")
    except ValueError:
        logging.getLogger("discord.client").exception("Ignoring exception in on_message")
    text = log_stream.getvalue()
    lines = text.splitlines()
    assert lines[0].endswith("ERROR discord.shard: Attempting a reconnect for shard ID 0 in "
                             "4.00s: OSError: Cannot connect to host gateway.discord.gg:443 "
                             "ssl:default [redacted]")
    assert lines[1].endswith("ERROR discord.client: Attempting a reconnect in 8.00s: "
                             "TimeoutError")
    assert "Traceback" in text.split("Ignoring exception in on_message", 1)[1]  # a bug stays
    assert text.count("Traceback") == 1


def _result(status: str, state: str, usages: list[dict[str, int] | None]) -> GenerationResult:
    passes = [PassResult(index=i, status="completed", usage=u) for i, u in enumerate(usages)]
    attempt = TurnResult(status=status, state=state, text="", passes=passes,  # type: ignore[arg-type]
                         consecutive_tool_errors=0, flags={}, function_history=[],
                         context_items_added=0, stash_items=0, reactor_lookups=0, notices=[],
                         deferred_notice=None, metrics=[])
    return GenerationResult(status=status, attempts=[attempt],  # type: ignore[arg-type]
                            labels=["openai:m"], text="", delivered_text="")


def test_the_turn_end_line_has_what_an_operator_needs() -> None:
    # covers O7: channel, turn id, terminal state, status, passes, duration,
    # tokens if known
    usage = [{"input_tokens": 100, "output_tokens": 7}, {"input_tokens": 120, "output_tokens": 30}]
    assert turn_end_line("42", "99", _result("completed", "Done", usage), 3.25) == (
        "turn end channel=42 turn=99 state=Done status=completed passes=2 duration=3.2s "
        "tokens=220/37 model=openai:m")
    assert "tokens=unknown" in turn_end_line("42", "99", _result("timeout", "TimedOut", [None]),
                                             1)
    assert "status=failed" in turn_end_line("42", "99", None, 0.5)
    assert "state=- status=cancelled" in turn_end_line("42", "99", None, 0.5, "cancelled")


def _write(store: JournalStore, name: str, size: int, mtime: float) -> Path:
    path = store.write(name, {"pad": "x" * size})
    assert path is not None
    os.utime(path, (mtime, mtime))
    return path


def test_journals_are_pruned_by_count_age_and_size(tmp_path: Path) -> None:
    # covers O9: retention by count, age and bytes; oldest go first
    now = 1_000_000.0
    by_count = JournalStore(JournalSettings(dir=str(tmp_path / "c"), max_files=2),
                            clock=lambda: now)
    for n in range(4):
        _write(by_count, f"j{n}", 10, now - 100 + n)
    by_count.prune()
    assert sorted(p.stem for p in (tmp_path / "c").glob("*.json")) == ["j2", "j3"]

    by_age = JournalStore(JournalSettings(dir=str(tmp_path / "a"), max_files=None,
                                          max_age_days=1), clock=lambda: now)
    _write(by_age, "old", 10, now - 2 * 86_400)
    _write(by_age, "new", 10, now - 60)
    by_age.prune()
    assert [p.stem for p in (tmp_path / "a").glob("*.json")] == ["new"]

    by_size = JournalStore(JournalSettings(dir=str(tmp_path / "s"), max_files=None,
                                           max_bytes=2500), clock=lambda: now)
    for n in range(3):
        _write(by_size, f"s{n}", 1000, now - 10 + n)
    by_size.prune()
    kept = sorted(p.stem for p in (tmp_path / "s").glob("*.json"))
    assert kept == ["s1", "s2"]
    assert (tmp_path / "s" / "notes.txt").exists() is False


def test_journals_can_be_turned_off(tmp_path: Path) -> None:
    # covers O9: journals off writes nothing at all
    store = JournalStore(JournalSettings(dir=str(tmp_path / "off"), enabled=False))
    assert store.write("x", {"a": 1}) is None and not (tmp_path / "off").exists()


def test_persona_file_fills_date_and_time_and_is_reread(tmp_path: Path) -> None:
    # covers O4: a persona from a file with {date} and {time}
    moment = datetime.datetime(2026, 12, 1, 15, 4, tzinfo=datetime.UTC)
    persona_file = tmp_path / "persona.txt"
    persona_file.write_text("You are Aria. Today is {date}, {time}. Keep {braces} as they are.")
    persona = Persona("unused", persona_file, clock=lambda: moment)
    assert persona.system_prompt() == (
        "You are Aria. Today is Tuesday, 01 December 2026, 15:04 UTC. "
        "Keep {braces} as they are.")
    persona_file.write_text("Now a pirate on {date}.")
    os.utime(persona_file, (1, 1))  # a different modification time, whatever the clock
    assert persona.system_prompt() == "Now a pirate on Tuesday, 01 December 2026."
    persona_file.unlink()
    assert persona.system_prompt() == "Now a pirate on Tuesday, 01 December 2026."


def test_enrichment_tools_on_off_or_listed() -> None:
    # covers O4: the tools per operator setting; a typo in a name is refused
    tools = EnrichmentTools(MediaFetcher(), lambda _id: asyncio.sleep(0)).tools()  # type: ignore[arg-type, return-value]
    names = [t.name for t in tools]
    assert [t.name for t in select_tools(tools, ToolSettings())] == names
    assert select_tools(tools, ToolSettings(enabled=False)) == []
    kept = select_tools(tools, ToolSettings(allowed=["process_gif"]))
    assert [t.name for t in kept] == ["process_gif"]
    with pytest.raises(ConfigurationError, match=r"tools\.allowed .*no tool named proces_gif"):
        select_tools(tools, ToolSettings(allowed=["proces_gif"]))


@pytest.mark.asyncio
async def test_a_token_without_a_provider_is_one_line_at_start_up(tmp_path: Path) -> None:
    # covers O2: today the demo played and said no token was configured
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TURN_")}
    env.update(PYTHONPATH=str(ROOT), TURN_DISCORD_TOKEN=SECRET)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "turn_engine", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and out == b""
    [line] = err.decode().splitlines()
    assert line.startswith("error: TURN_PROVIDER: not set") and SECRET not in line
