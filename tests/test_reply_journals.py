"""Journals of replies (issue 27 items 1 and 2; SPEC V8, V9): every journal name unique across
sessions and processes and portable, the chat's and the bot's; the reply's outcome (the
attempts and their journals, which one answered, the notice the user saw) in every attempt's
journal, where `inspect` and the review page find it. The chat runs as the real
`python -m turn_engine` process against loopback model servers; the bot on the Discord
emulator's gateway. Real processes, real time; timeouts only bound a hang."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gateway_support import bot_on_gateway

from fsm.engine.generation import Attempt
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import ScriptedProvider
from providers.replay_server import ReplayServer
from turn_engine.journals import new_reply_id, portable

from engine_support import ROOT
from providers_support import sse

PORTABLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
UNREACHABLE = "http://127.0.0.1:9"
"""The discard port: nothing listens on loopback there, so a connection is refused at once."""
ANSWER = sse({"choices": [{"index": 0, "delta": {"content": "Hi there."},
                           "finish_reason": None}]},
             {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) \
    + b"data: [DONE]\n\n"


def _env(journals: Path, *providers: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TURN_")}
    configs = [{"kind": "openai", "model": f"m{i}", "base_url": url + "/v1"}
               for i, url in enumerate(providers)]
    env.update(PYTHONPATH=str(ROOT), TURN_PROVIDER=json.dumps(configs[0]),
               TURN_FALLBACKS=json.dumps(configs[1:]), TURN_JOURNALS__DIR=str(journals),
               TURN_LOG__LEVEL="WARNING")
    return env


async def _chat(cwd: Path, journals: Path, *providers: str, lines: str = "hello\n/quit\n"
                ) -> str:
    """One session of the terminal chat; returns what it printed to stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "turn_engine", cwd=cwd, env=_env(journals, *providers),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(lines.encode()), 120)
    assert proc.returncode == 0, err.decode()
    return err.decode()


def _documents(folder: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(folder.glob("*.json"))}


def _inspect(path: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "fsm", "inspect", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.asyncio
async def test_chat_journals_of_many_sessions_never_overwrite_each_other(
        tmp_path: Path) -> None:
    # covers V8: five sessions against one model once left one journal (each started its
    # count at 1: `terminal-1-terminal-1-openai:m0`); every session's journal stays, named
    # portably, without a repeated part
    journals = tmp_path / "j"
    async with ReplayServer(ANSWER) as server:
        await asyncio.gather(*(_chat(tmp_path, journals, server.url) for _ in range(3)))
        await _chat(tmp_path, journals, server.url, lines="one\ntwo\n/quit\n")
    names = sorted(p.name for p in journals.glob("*.json"))
    assert len(names) == 5, names
    for name in names:
        stem = name.removesuffix(".json")
        assert PORTABLE.fullmatch(stem) and ":" not in stem, stem
        assert re.fullmatch(r"\d{8}T\d{6}Z-chat-[0-9a-f]{8}-a1-openai_m0", stem), stem
        assert stem.count("chat") == 1
    documents = _documents(journals)
    assert len({d["reply"]["id"] for d in documents.values()}) == 5
    assert all(d["name"] == stem for stem, d in documents.items())


def test_names_are_portable_and_unique_whatever_they_are_made_of() -> None:
    # covers V8: the parts of a name keep only letters, digits, `.`, `_` and `-`, never
    # lead with a dot or a dash, and stay short; two replies at the same second differ
    assert portable("openai:gpt-4o/mini") == "openai_gpt-4o_mini"
    assert portable("../../etc") == "etc" and portable(":::") == "x"
    assert portable("CON:" + "x" * 200) == "CON_" + "x" * 44
    ids = {new_reply_id("123-456", now=1_773_400_000.0) for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"20260313T\d{6}Z-123-456-[0-9a-f]{8}", i) for i in ids)


@pytest.mark.asyncio
async def test_the_notice_the_user_saw_is_in_the_journal_and_inspect_shows_it(
        tmp_path: Path) -> None:
    # covers V9, G2: "model unreachable" was shown, yet `inspect` said `notices none`: the
    # chain's outcome lived only in the generation result; it is now in every attempt's
    # journal, which names the attempts of its reply and the one that answered
    journals = tmp_path / "j"
    await _chat(tmp_path, journals, UNREACHABLE, UNREACHABLE)
    failed = _documents(journals)
    assert len(failed) == 2
    replies = [d["reply"] for d in failed.values()]
    assert all(r["notices"] == ["failed_unreachable"] for r in replies)
    assert all(r["final_notice"] == "failed_unreachable" and r["answered_by"] is None
               for r in replies)
    assert [r["attempt"] for r in replies] == [1, 2]
    assert [a["journal"] for a in replies[0]["attempts"]] == list(failed)
    shown = _inspect(journals / f"{list(failed)[1]}.json")
    assert "notices    none" not in shown, shown
    assert "failed_unreachable" in shown and "attempt 2 of 2" in shown, shown

    later = tmp_path / "k"
    async with ReplayServer(ANSWER) as server:
        await _chat(tmp_path, later, UNREACHABLE, server.url)
    answered = _documents(later)
    first, second = (d["reply"] for d in answered.values())
    assert first["id"] == second["id"] and first["answered_by"] == 2
    assert [a["status"] for a in first["attempts"]] == ["error", "completed"]
    assert [a["label"] for a in first["attempts"]] == [
        f"openai:m{n}" for n in range(2)]
    shown = _inspect(later / f"{next(iter(answered))}.json")
    assert "attempt 1 of 2" in shown and "answered by attempt 2 (openai:m1)" in shown, shown


@pytest.mark.asyncio
async def test_a_bot_replys_attempts_are_linked_and_named_portably(tmp_path: Path) -> None:
    # covers V8, V9 on the bot: one reply's attempts (a failing model, then a fallback)
    # share a reply id and list each other; the names carry the channel and the message
    # once, and no `:`
    failing = ScriptedProvider(parse_scenario({"passes": [[{"at": 0.1, "error": {
        "message": "connection refused", "kind": "provider_stream_error",
        "type": "connection_error"}}]]}).passes)
    fine = ScriptedProvider(parse_scenario({"passes": [[{"at": 0.2, "text": "Fine."},
                                                       {"at": 0.3, "end": "completed"}]]}
                                           ).passes)
    async with bot_on_gateway([], tmp_path, attempts=[Attempt(failing, "a:first"),
                                                      Attempt(fine, "b:second")]) as h:
        trigger = await h.mention("hello")
        await h.idle()
        channel = h.emu.channel_id
    documents = _documents(tmp_path)
    assert len(documents) == 2, list(documents)
    for stem in documents:
        assert PORTABLE.fullmatch(stem) and ":" not in stem, stem
        assert stem.count(str(trigger["id"])) == 1 and stem.count(str(channel)) == 1
    first, second = (d["reply"] for d in documents.values())
    assert first["id"] == second["id"] and (first["attempt"], second["attempt"]) == (1, 2)
    assert first["answered_by"] == 2 and first["status"] == "completed"
    assert [a["label"] for a in first["attempts"]] == ["a:first", "b:second"]
    assert all(d["origin"]["message_id"] == str(trigger["id"]) for d in documents.values())
