"""The terminal chat as a person uses it (O10): `python -m turn_engine` with a
provider, in a real pseudo-terminal (pexpect) or with pipes, against loopback model servers.
Ctrl-C at the prompt leaves cleanly; a reply stays whole, its transitions after it;
chat turns are journaled like bot turns; a base_url answering 404 names the URL it tried.
Real processes, real time; no timed asserts (timeouts only bound a hang)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pexpect
import pytest

from providers.replay_server import ReplayServer, Send
from turn_engine.chat import Screen

from engine_support import ROOT
from providers_support import sse

ANSI = "\x1b["


def _chunk(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


DONE = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


@contextmanager
def model_server(body: bytes, *, status: int = 200) -> Iterator[str]:
    """A ReplayServer on its own loop in a thread (pexpect blocks this one); yields its URL."""
    loop = asyncio.new_event_loop()
    server = ReplayServer(body if status == 200 else [Send(body)], status=status,
                          content_type="text/event-stream" if status == 200 else "text/plain")
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(30)
    try:
        yield server.url
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def _env(tmp_path: Path, *providers: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TURN_")}
    configs = [{"kind": "openai", "model": f"m{i}", "base_url": url + "/v1"}
               for i, url in enumerate(providers)]
    env.update(PYTHONPATH=str(ROOT), TURN_PROVIDER=json.dumps(configs[0]),
               TURN_FALLBACKS=json.dumps(configs[1:]), TURN_JOURNALS__DIR=str(tmp_path / "j"),
               TURN_LOG__LEVEL="WARNING")
    return env


def _spawn(tmp_path: Path, *providers: str) -> pexpect.spawn:
    return pexpect.spawn(sys.executable, ["-m", "turn_engine"], cwd=str(tmp_path),
                         env=_env(tmp_path, *providers), encoding="utf-8", timeout=60)


def test_ctrl_c_at_the_prompt_leaves_cleanly(tmp_path: Path) -> None:
    # covers O10: Ctrl-C at the prompt exits 0 at once, no traceback
    child = _spawn(tmp_path, "http://127.0.0.1:9")
    child.expect_exact("you> ")
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    assert "Traceback" not in (child.before or "")


def test_ctrl_c_during_a_reply_stops_it_and_the_chat_goes_on(tmp_path: Path) -> None:
    # covers S7 in the terminal chat: Ctrl-C during a reply is /kill, the text stays
    hanging = sse(_chunk("Once upon a time")) + b":@hang\n"
    with model_server(hanging) as url:
        child = _spawn(tmp_path, url)
        child.expect_exact("you> ")
        child.sendline("tell me a story")
        child.expect_exact("bot> Once upon a time")
        child.sendintr()
        child.expect_exact("  = stopped_by_user")
        child.expect_exact("you> ")
        child.sendintr()
        child.expect(pexpect.EOF)
        child.close()
    assert child.exitstatus == 0 and "Traceback" not in (child.before or "")


def test_the_reply_stays_whole_with_transitions_after_it(tmp_path: Path) -> None:
    # covers O10 with G1 in a terminal: the first model breaks mid-reply, the fallback
    # continues; the reply is one line, the transitions from its first text on come after it
    broken = sse(_chunk("Hello"))  # no finish: the stream ends incomplete
    fine = sse(_chunk(" world."), DONE) + b"data: [DONE]\n\n"
    with model_server(broken) as first, model_server(fine) as second:
        child = _spawn(tmp_path, first, second)
        child.expect_exact("you> ")
        transcript = io.StringIO()
        child.logfile_read = transcript
        child.sendline("hi")
        child.expect_exact("  = completed")
        child.expect_exact("you> ")
        screen = transcript.getvalue().replace("\r\n", "\n")
        child.sendline("/quit")
        child.expect(pexpect.EOF)
        child.close()
    assert child.exitstatus == 0
    lines = [line for line in screen.split("\n") if line.strip()]
    transitions = [line for line in lines if "─▶" in line]
    assert transitions and all(line.startswith("  · ") for line in transitions), lines
    replies = [n for n, line in enumerate(lines) if line.startswith("bot> ")]
    assert len(replies) == 1, lines
    [reply] = replies
    assert lines[reply] == "bot> Hello world.", lines
    before = [line for line in lines[:reply] if "─▶" in line]
    after = [line for line in lines[reply:] if "─▶" in line]
    assert [line.split()[2:] for line in before] == [
        ["Preparing", "─begin─▶", "AwaitingFirstToken"]], lines
    assert sum("─begin─▶" in line for line in after) == 1  # the fallback's pass, held
    assert after[-1].endswith("─▶ Done") and lines[-2:] == ["  = completed", "you> "], lines
    journals = sorted((tmp_path / "j").glob("*-chat-*-a*.json"))
    assert len(journals) == 2  # one per attempt, like a bot turn (V8: named by the reply)
    results = [json.loads(p.read_text())["result"]["status"] for p in journals]
    assert sorted(results) == ["completed", "error"]


def test_a_reply_across_passes_lines_and_a_notice_reads_as_one() -> None:
    # covers O10 on the screen itself: a tool pass, text with newlines and a log line
    # mid-reply never cut it; a notice closes its line and the reply resumes after it
    out, err = io.StringIO(), io.StringIO()
    screen = Screen(out, err)
    screen.transition("  · begin")
    screen.reply("Let me check. ")
    screen.transition("  · tool_call")
    screen.reply("It is cold:\n- snow\n")
    screen.reply("- wind")
    screen.end_line()  # a log line or a notice closes the line
    screen.reply(" and more")
    screen.status("  = completed")
    assert out.getvalue() == "bot> Let me check. It is cold:\n- snow\n- wind\nbot>  and more\n"
    assert err.getvalue() == "  · begin\n  · tool_call\n  = completed\n"


@pytest.mark.asyncio
async def test_a_base_url_answering_404_names_the_url_it_tried(tmp_path: Path) -> None:
    # covers O10: a wrong base_url is named, not a bare "error"
    async with ReplayServer([Send(b"404: Not Found")], status=404,
                            content_type="text/plain") as server:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "turn_engine", cwd=tmp_path, env=_env(tmp_path, server.url),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(b"hello\n/quit\n"), 60)
    text = err.decode()
    assert proc.returncode == 0, text
    [line] = [line for line in text.splitlines() if line.startswith("error:")]
    assert f"{server.url}/v1/chat/completions answered 404 Not Found" in line, text
    assert "base_url" in line
