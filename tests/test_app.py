"""The main job's three modes as a user starts them: `python -m turn_engine` with nothing
configured (built-in turns), with a provider (terminal chat over real HTTP), and with an
invalid value (refused, naming the field). Subprocesses, so real time; no timed asserts."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import sys
from pathlib import Path

import pytest

from providers.replay_server import ReplayServer, Send
from turn_engine.gc_tuning import GcSettings, tune_gc
from turn_engine.settings import ConfigurationError, load_settings

from engine_support import ROOT
from providers_support import sse


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURN_")}
    env.update(extra)
    return env


async def _app(stdin: str, cwd: Path, **env: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "turn_engine", cwd=cwd, env=_env(PYTHONPATH=str(ROOT), **env),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.asyncio
async def test_nothing_configured_plays_the_built_in_turns(tmp_path: Path) -> None:
    # covers the main job's embedded default (S7, S10, R3 through the real engine) and O14:
    # each journal's replay command works as printed, and the run ends with what to do next
    code, out, _ = await _app("", tmp_path)
    assert code == 0 and "Stopped" in out and "TimedOut" in out
    assert len(list((tmp_path / "journals").glob("*.json"))) == 5
    commands = re.findall(r"\(replay: (.+?)\)$", out, re.MULTILINE)
    assert len(commands) == 5 and not any("python -m fsm" in c for c in commands)
    shell = await asyncio.create_subprocess_shell(
        commands[-1], cwd=tmp_path, env=_env(), stdout=asyncio.subprocess.PIPE)
    replayed, _ = await asyncio.wait_for(shell.communicate(), 60)
    assert shell.returncode == 0 and b"replay matches" in replayed
    steps = out.split("\nNext:\n", 1)[1]
    assert "TURN_PROVIDER='{" in steps and "docs/discord.md" in steps
    assert "docs/configuration.md" in steps and " review journals/" in steps


@pytest.mark.asyncio
async def test_terminal_chat_talks_to_a_real_http_model(tmp_path: Path) -> None:
    # covers G1 and S5 end to end: a person types, the model streams back over HTTP
    chunks = [{"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
              for text in ("Hi ", "there!")]
    done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    async with ReplayServer([Send(sse(*chunks, done)), Send(b"data: [DONE]\n\n")]) as server:
        provider = json.dumps({"kind": "openai", "model": "local",
                               "base_url": server.url + "/v1"})
        code, out, err = await _app("hello\n/quit\n", tmp_path, TURN_PROVIDER=provider)
        body = server.requests[0].json()
    assert code == 0, err
    assert "Hi there!" in out
    assert "AwaitingFirstToken" in err and "─completed─▶ Done" in err
    assert body["messages"][-1]["content"].endswith("hello") and body["stream"] is True


@pytest.mark.asyncio
async def test_invalid_configuration_is_refused_naming_the_field(tmp_path: Path) -> None:
    # covers the configuration rule: refused at start-up, field named, secret never shown
    code, _, err = await _app("", tmp_path, TURN_ENGINE__IDLE_TIMEOUT_S="soon",
                                TURN_DISCORD_TOKEN="super-secret-token")
    assert code == 2 and "engine.idle_timeout_s" in err and "super-secret-token" not in err
    code, _, err = await _app("", tmp_path, TURN_PROVIDER=json.dumps(
        {"kind": "openai", "model": "m", "api_key_env": "NOT_SET_ANYWHERE"}))
    assert code == 2 and "NOT_SET_ANYWHERE" in err


def test_bot_process_gc_settings_are_validated_and_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # covers issue 7 item 4 (F4 in BENCHMARKS.md): the bot process raises the collector's
    # thresholds and freezes what start-up created; a bad value is refused naming the field
    monkeypatch.chdir(tmp_path)
    for name in [k for k in os.environ if k.startswith("TURN_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TURN_GC__THRESHOLDS", "[0, 10, 10]")
    with pytest.raises(ConfigurationError, match=r"gc\.thresholds"):
        load_settings()
    monkeypatch.setenv("TURN_GC__THRESHOLDS", "[5000, 20, 30]")
    settings = load_settings()
    assert settings.gc.thresholds == (5000, 20, 30) and settings.gc.enabled
    original = gc.get_threshold()
    try:
        tune_gc(GcSettings(enabled=False))
        assert gc.get_threshold() == original and gc.get_freeze_count() == 0
        tune_gc(settings.gc)
        assert gc.get_threshold() == (5000, 20, 30) and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*original)
