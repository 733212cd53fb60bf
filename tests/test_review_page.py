"""The review page (issue 18 item 2, issue 27 item 3; SPEC V10): its JSON over a folder of
journals, and the page itself in a real headless Chromium driven by Playwright — list, filter,
open a turn, step through it, a heat map of several; replies with their attempts grouped,
status-coloured badges, the timeline of passes and tools, the model's input per pass, faded
untaken edges and zoom — with journal text that tries to be markup shown as text."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from pydantic import BaseModel

from fsm.engine.generation import Attempt, run_generation_turn
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.tools import FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.review.inspect import load_journal
from fsm.review.web.catalog import PREVIEW_CHARS, Query, row_of
from fsm.review.web.server import create_app
from fsm.review.web.story import story
from fsm.scenarios.demo import main as play_built_in_turns
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import run_virtual
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider
from turn_engine.journals import JournalStore, ReplyJournals, scenario_history
from turn_engine.settings import JournalSettings

from engine_support import ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SCREENSHOT_ENV = "REVIEW_SCREENSHOT"
"""Set to a path (docs/review-page.png) to refresh the README's screenshot from the test of
replies (`test_replies_in_a_real_browser`)."""
HOSTILE_NAME = '<img src=x onerror="window.__pwned=1">'
HOSTILE_TEXT = "<script>window.__pwned=2</script> & <b>not bold</b>"


def _day(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The five built-in turns as live journals, a turn whose text is markup, a broken file,
    each with a known date."""
    folder = tmp_path_factory.mktemp("journals")
    play_built_in_turns(folder, out=io.StringIO())
    hostile = json.loads((folder / "01_plain_reply.json").read_text(encoding="utf-8"))
    hostile["name"] = HOSTILE_NAME
    hostile["passes"][0][0]["text"] = HOSTILE_TEXT
    hostile["result"]["text"] = hostile["result"]["delivered_text"] = HOSTILE_TEXT
    hostile["result"]["pass_results"][0]["text"] = HOSTILE_TEXT
    nested = folder / "2026-03"
    nested.mkdir()
    (nested / "markup.json").write_text(json.dumps(hostile), encoding="utf-8")
    (folder / "broken.json").write_text('{"journal": [', encoding="utf-8")
    dates = {"01_plain_reply.json": "2026-03-01T10:00", "02_tool_call.json": "2026-03-02T10:00",
             "03_context_restart.json": "2026-03-03T10:00", "04_idle_timeout.json":
             "2026-03-04T10:00", "05_kill.json": "2026-03-05T10:00",
             "2026-03/markup.json": "2026-03-06T10:00", "broken.json": "2026-03-06T11:00"}
    for name, when in dates.items():
        os.utime(folder / name, (_day(when), _day(when)))
    return folder


SYSTEM_PROMPT = "You are a weather bot for the <b>north</b>. Keep it short."
UNREACHABLE = {"message": "connection refused", "kind": "provider_stream_error",
               "type": "connection_error"}


class City(BaseModel):
    city: str


async def _weather(args: City, _ctx: ToolContext) -> ToolResult:
    return ToolResult.ok({"city": args.city, "sky": "snow"})


def _scripted(passes: list[list[dict[str, Any]]]) -> ScriptedProvider:
    return ScriptedProvider(parse_scenario({"passes": passes}).passes)


async def _play_replies(folder: Path) -> None:
    """Two replies through the real generation turn and the journals the chat and the bot
    write (ReplyJournals): one whose first model is unreachable and whose fallback calls a
    tool and answers, one that fails on its only model (the user sees a notice)."""
    store = JournalStore(JournalSettings(dir=str(folder), max_files=None))
    tools = ToolRegistry([FunctionTool("get_weather", "the weather in a city", City, _weather)])
    items = [{"type": "dialogue", "role": "user", "author": "ana", "message_id": "m1",
              "content": "Is it snowing in Oslo?"},
             {"type": "dialogue", "role": "user", "author": HOSTILE_NAME, "message_id": "m2",
              "content": HOSTILE_TEXT}]
    chains = [
        ("chain", [Attempt(_scripted([[{"at": 0.2, "error": UNREACHABLE}]]), "a:first"),
                   Attempt(_scripted([
                       [{"at": 0.3, "tool_call": {"name": "get_weather",
                                                  "args": {"city": "Oslo"}}}],
                       [{"at": 0.2, "text": "Snow in Oslo, "}, {"at": 0.4, "text": "-3 °C."},
                        {"at": 0.5, "end": "completed"}]]), "b:second")]),
        ("failed", [Attempt(_scripted([[{"at": 0.2, "error": UNREACHABLE}]]), "a:only")]),
    ]
    for where, attempts in chains:
        reply = ReplyJournals(store, where, [a.label for a in attempts], tools,
                              history=scenario_history(items))
        locks = ChannelLockRegistry()
        lock = locks.try_acquire("c", where)
        assert lock is not None
        result = await run_generation_turn(
            attempts, channel=InMemoryChannel(), locks=locks, lock=lock, tools=tools,
            request=TurnRequest(context_items=items, system_prompt=SYSTEM_PROMPT),
            on_attempt=reply.on_attempt)
        await reply.save(result)


@pytest.fixture(scope="module")
def replies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of the two replies' three journals and the built-in plain reply."""
    folder = tmp_path_factory.mktemp("replies")
    run_virtual(lambda: _play_replies(folder))
    built_in = tmp_path_factory.mktemp("built_in")
    play_built_in_turns(built_in, out=io.StringIO())
    (folder / "01_plain_reply.json").write_bytes((built_in / "01_plain_reply.json").read_bytes())
    os.utime(folder / "01_plain_reply.json", (_day("2026-03-01T10:00"),) * 2)
    return folder


@pytest_asyncio.fixture
async def server(journals: Path) -> AsyncIterator[TestServer]:
    """The review app over real HTTP on loopback."""
    async with TestServer(create_app(journals), host="127.0.0.1") as srv:
        yield srv


async def _get(srv: TestServer, path: str, **headers: str) -> tuple[int, str, dict[str, str]]:
    async with ClientSession() as session, \
            session.get(srv.make_url(path), headers=headers) as response:
        return response.status, await response.text(), dict(response.headers)


async def _names(srv: TestServer, query: str) -> list[str]:
    status, body, _ = await _get(srv, f"/api/journals?{query}")
    assert status == 200, body
    return [row["name"] for row in json.loads(body)["rows"]]


@pytest.mark.asyncio
async def test_list_filters_and_search(server: TestServer) -> None:
    # covers issue 18 item 2 (list, filters, search) over journals of S16 kill, S11 timeout
    status, body, headers = await _get(server, "/api/journals")
    data = json.loads(body)
    assert status == 200 and data["total"] == 6 and data["matching"] == 6
    assert [r["id"] for r in data["rows"]][:2] == ["2026-03/markup.json", "05_kill.json"]
    assert data["problems"][0]["id"] == "broken.json"
    assert "\n" not in data["problems"][0]["error"]
    assert data["facets"]["state"] == ["Done", "Stopped", "TimedOut"]
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert await _names(server, "state=Stopped") == ["kill"]
    assert await _names(server, "status=timeout") == ["idle_timeout"]
    assert await _names(server, "notice=timeout_idle") == ["idle_timeout"]
    assert await _names(server, "tool=get_weather") == ["tool_call"]
    assert sorted(await _names(server, "tool=(none)")) == sorted(
        ["kill", "idle_timeout", "plain_reply", HOSTILE_NAME])
    assert await _names(server, "min_duration=5&max_duration=60") == ["kill"]
    assert await _names(server, "max_duration=2&state=Done") == [HOSTILE_NAME, "plain_reply"]
    assert await _names(server, "since=2026-03-02&until=2026-03-03") == [
        "context_restart", "tool_call"]
    assert await _names(server, "q=TINY+hat") == ["context_restart"]
    assert await _names(server, "q=snowing+oslo") == ["tool_call"]
    assert await _names(server, "q=snowing+paris") == []


@pytest.mark.asyncio
async def test_bad_requests_get_one_line_answers(server: TestServer) -> None:
    # covers issue 18 item 2: bad input is refused with one line; no file outside the folder
    for path, code, words in [
        ("/api/journals?min_duration=soon", 400, "min_duration: 'soon' is not a number"),
        ("/api/journals?since=yesterday", 400, "since: 'yesterday' is not a date"),
        ("/api/journals?colour=red", 400, "unknown filter 'colour'"),
        ("/api/story", 400, "id: name at least one journal"),
        ("/api/story?id=../../etc/passwd", 404, "is not a journal of the folder"),
        ("/api/story?id=broken.json", 404, "is not a journal of the folder"),
        ("/api/diagram.svg?id=nope.json", 404, "is not a journal of the folder"),
        ("/static/../server.py", 404, ""),
    ]:
        status, body, _ = await _get(server, path)
        assert status == code, (path, body)
        assert words in body and body.count("\n") <= 1, (path, body)
    status, body, _ = await _get(server, "/", Host="attacker.example")
    assert status == 421 and "answers only to 127.0.0.1" in body
    assert (await _get(server, "/", Host="localhost:8018"))[0] == 200


def text_at(told: dict[str, Any], t: float) -> str:
    """The text delivered by time `t`, rebuilt from the story as review.js rebuilds it."""
    out = ""
    for p in told["passes"]:
        if p["start"] > t:
            continue
        if p["end"] is not None and t >= p["end"] and p["text"] is not None:
            out += p["text"]
        else:
            out += "".join(text for at, text in p["chunks"] if at <= t)
    return out


def test_story_shows_the_text_delivered_at_each_transition(journals: Path) -> None:
    # covers issue 18 item 2 (step-through): R1/R9 restart then the next pass; S10/S13 a
    # timed-out pass keeps what landed as it settled
    restart = story(load_journal(journals / "03_context_restart.json"))
    steps = [(s["event"], s["pass"], text_at(restart, s["t"])) for s in restart["steps"]]
    assert steps == [
        ("begin", 1, ""), ("tool_call", 1, ""), ("restart_requested", None, ""),
        ("restart", None, ""), ("begin", 2, ""),
        ("first_token", 2, "Your avatar is a cat in a tiny hat."),
        ("completed", 2, "Your avatar is a cat in a tiny hat.")]
    assert restart["tools"][0]["name"] == "peek_profile_picture"
    assert restart["tools"][0]["outcome"]["success"] is True
    assert [r["event"] for r in restart["restarts"]] == ["restart_requested", "restart"]
    timeout = story(load_journal(journals / "04_idle_timeout.json"))
    by_event = {s["event"]: text_at(timeout, s["t"]) for s in timeout["steps"]}
    assert by_event["first_token"] == "The three reasons are"
    assert by_event["settled"] == "The three reasons are first,"
    assert timeout["passes"][0]["ended_by"] == "settled"


def test_the_list_shows_the_start_of_a_long_reply(journals: Path) -> None:
    # covers issue 18 item 2: a long reply is previewed in the list, searched in full
    journal = load_journal(journals / "01_plain_reply.json")
    journal.result["delivered_text"] = "word " * 400 + "needle"
    row = row_of(journal, "long.json", datetime(2026, 3, 1, tzinfo=UTC))
    shown = row.as_json()["text"]
    assert len(shown) == PREVIEW_CHARS and shown.endswith("…")
    assert Query(text="needle").matches(row)


def test_review_command_refuses_a_missing_folder(tmp_path: Path) -> None:
    # covers issue 18 item 2: `python -m fsm review` names the problem in one line
    proc = subprocess.run([sys.executable, "-m", "fsm", "review", str(tmp_path / "nope")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'nope'}: not a folder of journals"


@pytest.mark.asyncio
async def test_review_command_names_the_port_it_bound_and_stops_on_ctrl_c(
        journals: Path) -> None:
    # covers issue 18 item 2: `--port 0` serves on a free port and prints that port, the page
    # answers there, and Ctrl-C stops the command with exit 0 and no traceback
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "fsm", "review", str(journals), "--port", "0", cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            line = (await proc.stdout.readline()).decode()
        match = re.fullmatch(r"review page for .+: (http://127\.0\.0\.1:(\d+)/) \(Ctrl-C stops "
                             r"it\)\n", line)
        assert match is not None and int(match[2]) != 0, line
        async with ClientSession() as http, http.get(match[1] + "api/journals") as answer:
            assert answer.status == 200
            assert len((await answer.json())["rows"]) == 6
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(60):
            _, err = await proc.communicate()
        assert proc.returncode == 0 and b"Traceback" not in err, err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_review_command_names_a_busy_port_in_one_line(journals: Path) -> None:
    # covers issue 18 item 2: a port already taken is one line and exit 2, not a traceback
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "fsm", "review", str(journals),
                               "--port", str(port)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: ")
    assert proc.stderr.count("\n") == 1


@dataclass
class Browsing:
    """A page of headless Chromium, with what it reported: script errors and any request
    that left the review server."""

    page: Any
    errors: list[str] = field(default_factory=list)
    offsite: list[str] = field(default_factory=list)


@asynccontextmanager
async def browsing(base: str, tmp_path: Path) -> AsyncIterator[Browsing]:
    """Debian's Chromium through Playwright, on a 1440 x 1000 window."""
    assert CHROMIUM.exists(), "Debian's chromium is missing: run scripts/setup.sh"
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1440, "height": 1000})
        try:
            page = browser.pages[0] if browser.pages else await browser.new_page()
            seen = Browsing(page)
            page.on("pageerror", lambda exc: seen.errors.append(str(exc)))
            page.on("request", lambda r: seen.offsite.append(r.url)
                    if not r.url.startswith(base) else None)
            yield seen
        finally:
            await browser.close()


@pytest.mark.asyncio
async def test_the_page_in_a_real_browser(server: TestServer, tmp_path: Path) -> None:
    # covers issue 18 item 2 in headless Chromium: filter, search, open a turn (R1 restart,
    # S16 kill), step through it, heat map; journal markup stays text
    from playwright.async_api import expect

    base = str(server.make_url("/"))
    async with browsing(base, tmp_path) as seen:
        page = seen.page
        await page.goto(base)
        rows = page.locator("#rv-rows tr")
        await expect(rows).to_have_count(6)
        await expect(page.locator("#rv-problems-title")).to_have_text(
            "1 file not readable as a journal")
        markup_row = page.locator('tr[data-id="2026-03/markup.json"]')
        await expect(markup_row.locator(".rv-open")).to_have_text(HOSTILE_NAME)
        await expect(markup_row.locator(".rv-preview")).to_have_text(HOSTILE_TEXT)

        await page.select_option("#rv-f-state", "Stopped")
        await expect(rows).to_have_count(1)
        await expect(rows.first.locator(".rv-open")).to_have_text("kill")
        await page.click("#rv-clear")
        await expect(rows).to_have_count(6)
        await page.fill("#rv-f-q", "tiny hat")
        await expect(rows).to_have_count(1)
        await page.fill("#rv-f-q", "")
        await page.fill("#rv-f-min", "3")
        await page.press("#rv-f-min", "Enter")
        await expect(rows).to_have_count(3)
        await page.click("#rv-clear")
        await expect(rows).to_have_count(6)

        await page.click('tr[data-id="03_context_restart.json"] .rv-open')
        await expect(page.locator("body")).to_have_attribute(
            "data-turn-loaded", "03_context_restart.json")
        await expect(page.locator("#rv-diagram svg")).to_have_count(1)
        await expect(page.locator("#rv-timeline li")).to_have_count(7)
        await expect(page.locator("#rv-step-label")).to_have_text("transition 1 of 7")
        current_edge = page.locator('#rv-diagram g.edge.rv-current')
        await expect(current_edge).to_have_attribute(
            "id", "begin:Preparing:AwaitingFirstToken")
        await expect(page.locator("#rv-now-text")).to_have_text("(nothing yet)")
        await expect(page.locator("#rv-tools tr")).to_have_count(1)
        await expect(page.locator("#rv-tools")).to_contain_text("peek_profile_picture")
        for _ in range(2):
            await page.click("#rv-next")
        await expect(current_edge).to_have_attribute(
            "id", "restart_requested:ToolCall:ContextRestart")
        await expect(page.locator("#rv-tools tr.rv-current")).to_contain_text(
            "peek_profile_picture")
        await expect(page.locator("#rv-diagram g.node.rv-current")).to_have_attribute(
            "id", "ContextRestart")
        await page.keyboard.press("ArrowRight")
        await page.keyboard.press("ArrowRight")
        await page.keyboard.press("ArrowRight")
        await expect(page.locator("#rv-step-label")).to_have_text("transition 6 of 7")
        await expect(current_edge).to_have_attribute(
            "id", "first_token:AwaitingFirstToken:Streaming")
        await expect(page.locator("#rv-now-text")).to_have_text(
            "Your avatar is a cat in a tiny hat.")
        await expect(page.locator("#rv-timeline li.rv-current")).to_contain_text(
            "first_token")
        await expect(page.locator("#rv-passes tr.rv-current")).to_have_attribute(
            "data-pass", "2")
        await expect(page.locator("#rv-tools tr.rv-current")).to_have_count(0)
        await expect(page.locator("#rv-next")).to_be_enabled()
        await page.click("#rv-next")
        await expect(page.locator("#rv-next")).to_be_disabled()
        await page.click("#rv-prev")
        await page.screenshot(path=str(tmp_path / "review.png"), full_page=False)

        await page.click("#rv-turn-view .rv-back")
        await expect(rows).to_have_count(6)
        await page.check('tr[data-id="05_kill.json"] .rv-pick')
        await expect(page.locator("#rv-heat-button")).to_be_disabled()
        await page.check('tr[data-id="04_idle_timeout.json"] .rv-pick')
        await page.click("#rv-heat-button")
        await expect(page.locator("body")).to_have_attribute("data-heat-loaded", "2")
        await expect(page.locator("#rv-heat svg")).to_contain_text("2 journals")
        await expect(page.locator("#rv-heat svg")).to_contain_text("1× Stopped")

        await page.goto(base + "#turn=" + "2026-03%2Fmarkup.json")
        await expect(page.locator("body")).to_have_attribute(
            "data-turn-loaded", "2026-03/markup.json")
        await expect(page.locator("#rv-turn-title")).to_have_text(HOSTILE_NAME)
        await page.click("#rv-last")
        await expect(page.locator("#rv-now-text")).to_have_text(HOSTILE_TEXT)
        pwned: Any = await page.evaluate("window.__pwned")
        assert pwned is None
        assert await page.locator("#rv-now-text b, #rv-rows img, script:not([src])").count() \
            == 0
        assert seen.errors == [] and seen.offsite == []
    assert (tmp_path / "review.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.asyncio
async def test_a_replys_attempts_are_listed_together_with_what_the_user_saw(
        replies: Path) -> None:
    # covers V9, V10 over HTTP: the list keeps a reply's attempts together and in order,
    # filters on the notice the reply posted, and a story names its reply's other attempts
    # and the input of each pass (the tool results fed back grow pass by pass)
    async with TestServer(create_app(replies), host="127.0.0.1") as srv:
        _, body, _ = await _get(srv, "/api/journals")
        data = json.loads(body)
        ids = [row["id"] for row in data["rows"]]
        chain = [i for i in ids if "-chain-" in i]
        assert len(chain) == 2 and ids.index(chain[1]) == ids.index(chain[0]) + 1
        first = data["rows"][ids.index(chain[0])]
        assert first["reply"]["attempts"] == 2 and first["reply"]["answered_by"] == 2
        assert (first["outcome"], first["reply"]["outcome"]) == ("failed", "ok")
        assert await _names(srv, "notice=failed_unreachable") == [
            next(i for i in ids if "-failed-" in i).removesuffix(".json")]
        _, body, _ = await _get(srv, f"/api/story?id={chain[0]}")
        told = json.loads(body)
        assert [a["id"] for a in told["reply"]["attempts"]] == chain
        _, body, _ = await _get(srv, f"/api/story?id={chain[1]}")
        told = json.loads(body)
    assert told["input"]["system_prompt"] == SYSTEM_PROMPT
    assert [m["author"] for m in told["input"]["history"]] == ["ana", HOSTILE_NAME]
    assert [p["fed_back"] for p in told["passes"]] == [0, 1]
    assert told["tools"][0]["outcome"]["data"] == {"city": "Oslo", "sky": "snow"}


@pytest.mark.asyncio
async def test_replies_in_a_real_browser(replies: Path, tmp_path: Path) -> None:
    # covers V10 in headless Chromium (issue 27 item 3): status-coloured badges (a failed
    # turn is not a green Done, nor is its Done node), a reply's attempts grouped under it
    # and linked, a timeline of passes and tools, the model's input per pass as the journal
    # holds it (journal markup as text), untaken edges faded, zoom, legible labels
    from playwright.async_api import expect

    names = sorted(p.stem for p in replies.glob("*-a*-*.json"))
    chain = [n for n in names if "-chain-" in n]
    [failed] = [n for n in names if "-failed-" in n]
    async with TestServer(create_app(replies), host="127.0.0.1") as srv:
        base = str(srv.make_url("/"))
        async with browsing(base, tmp_path) as seen:
            page = seen.page
            await page.goto(base)
            rows = page.locator("#rv-rows tr")
            await expect(rows).to_have_count(5)  # one reply head, three attempts, one turn
            head = page.locator("tr.rv-reply-head")
            await expect(head).to_have_count(1)
            await expect(head).to_contain_text("reply of 2 attempts · answered by attempt 2")
            attempts = page.locator("tr.rv-attempt")
            await expect(attempts).to_have_count(2)
            for n, name in enumerate(chain):
                await expect(attempts.nth(n)).to_have_attribute("data-id", f"{name}.json")
                await expect(attempts.nth(n).locator(".rv-attempt-of")).to_contain_text(
                    f"attempt {n + 1} of 2")
            assert await page.evaluate(
                "[...document.querySelectorAll('#rv-rows tr')].indexOf("
                "document.querySelector('tr.rv-reply-head')) + 1 === [...document."
                "querySelectorAll('#rv-rows tr')].indexOf(document.querySelector("
                "'tr.rv-attempt'))")
            failed_badge = page.locator(f'tr[data-id="{failed}.json"] .rv-badge')
            ok_badge = page.locator('tr[data-id="01_plain_reply.json"] .rv-badge')
            await expect(failed_badge).to_have_text("Done")
            await expect(failed_badge).to_have_class(re.compile(r"\brv-outcome-failed\b"))
            await expect(ok_badge).to_have_class(re.compile(r"\brv-outcome-ok\b"))
            colour = "el => getComputedStyle(el).backgroundColor"
            assert await failed_badge.evaluate(colour) == "rgb(239, 154, 154)"
            assert await ok_badge.evaluate(colour) == "rgb(165, 214, 167)"
            await expect(page.locator(f'tr[data-id="{failed}.json"]')).to_contain_text(
                "failed_unreachable")

            await attempts.nth(0).locator(".rv-open").click()
            await expect(page.locator("body")).to_have_attribute("data-turn-loaded",
                                                                 f"{chain[0]}.json")
            await expect(page.locator("#rv-turn-badge .rv-outcome-failed")).to_have_text("Done")
            await expect(page.locator("#rv-reply")).to_contain_text("attempt 1 of 2 of reply")
            done = page.locator("#rv-diagram g.node#Done")
            await expect(done).to_have_class(re.compile(r"\boutcome-failed\b"))
            assert await done.locator("ellipse").first.get_attribute("fill") == "#ef9a9a"
            await page.click("#rv-reply a.rv-other-attempt")
            await expect(page.locator("body")).to_have_attribute("data-turn-loaded",
                                                                 f"{chain[1]}.json")
            await expect(page.locator("#rv-reply li b")).to_have_text(" · answered")
            await expect(page.locator("#rv-diagram g.node#Done")).to_have_class(
                re.compile(r"\boutcome-ok\b"))

            await expect(page.locator("#rv-lanes rect.rv-lane-pass")).to_have_count(2)
            await expect(page.locator("#rv-lanes rect.rv-lane-tool")).to_have_count(1)
            await page.click('#rv-lanes rect.rv-lane-pass[data-pass="2"]')
            story_steps = await page.evaluate("turn.steps.map(s => [s.event, s.pass])")
            second_begin = story_steps.index(["begin", 2])
            await expect(page.locator("#rv-step-label")).to_have_text(
                f"transition {second_begin + 1} of {len(story_steps)}")
            await expect(page.locator("#rv-lanes rect.rv-lane-pass.rv-current")).to_have_attribute(
                "data-pass", "2")
            panel = page.locator("#rv-input")
            await expect(panel).to_have_attribute("data-pass", "2")
            await expect(panel.locator(".rv-system")).to_have_text(SYSTEM_PROMPT)
            await expect(panel.locator(".rv-dialogue li")).to_have_count(2)
            await expect(panel.locator(".rv-dialogue .rv-message").nth(1)).to_have_text(
                HOSTILE_TEXT)
            await expect(panel).to_contain_text("tool results fed back (1)")
            await expect(panel.locator(".rv-fed li")).to_contain_text("get_weather")
            await expect(panel.locator(".rv-fed li")).to_contain_text('"sky":"snow"')
            await page.click('#rv-input-tabs button[data-pass="1"]')
            await expect(panel).to_have_attribute("data-pass", "1")
            await expect(panel).to_contain_text("tool results fed back (0)")
            await page.click('#rv-lanes rect.rv-lane-tool')
            await expect(page.locator("#rv-now-edge")).to_contain_text("ToolCall → Preparing")

            svg = page.locator("#rv-diagram svg")
            untaken = page.locator("#rv-diagram g.edge.untaken")
            assert await untaken.count() > 10
            assert await untaken.first.evaluate("el => getComputedStyle(el).opacity") == "0.55"
            taken = page.locator("#rv-diagram g.edge.taken text").first
            assert await taken.evaluate("el => getComputedStyle(el.parentNode).opacity") == "1"
            assert (await taken.bounding_box() or {"height": 0})["height"] >= 11
            await expect(page.locator("#rv-zoom-level")).to_have_text("70 %")
            width = (await svg.bounding_box() or {"width": 0})["width"]
            await page.click("#rv-zoom-in")
            await expect(page.locator("#rv-zoom-level")).to_have_text("88 %")
            wider = (await svg.bounding_box() or {"width": 0})["width"]
            assert wider == pytest.approx(width * 1.25, rel=0.02)
            await page.click("#rv-zoom-fit")
            await expect(page.locator("#rv-zoom-level")).to_have_text("fit")
            box = await page.locator("#rv-diagram").bounding_box()
            fitted = await svg.bounding_box()
            assert box is not None and fitted is not None and fitted["width"] <= box["width"]
            await page.click("#rv-zoom-reset")
            await page.click('#rv-lanes rect.rv-lane-pass[data-pass="2"]')
            await page.click("#rv-next")
            await page.screenshot(path=str(tmp_path / "replies.png"), full_page=True)
            screenshot = os.environ.get(SCREENSHOT_ENV)
            if screenshot:
                await page.screenshot(path=screenshot, full_page=True)
            pwned: Any = await page.evaluate("window.__pwned")
            assert pwned is None
            assert await page.locator("#rv-input img, #rv-rows img, script:not([src])").count() \
                == 0
            assert seen.errors == [] and seen.offsite == []
