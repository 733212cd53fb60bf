"""The review page against crafted journals and hostile requests (issue 22 item 6; SPEC V2-V6),
through the review server over real HTTP on loopback: DOT and SVG injection, `dot` that fails
or never finishes, requests fired by other sites, files of the wrong shape or size, links out
of the folder, heat maps that name one big journal many times, and a story that must stay
linear. Hypothesis fuzzes the catalog and the story with type-confused and oversized
journals and the DOT writer with arbitrary strings (rendered by the real `dot`)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import json
import os
import re
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_review_page import text_at

from fsm.review import diagram
from fsm.review.diagram import MAX_STEPS_SHOWN, MAX_UNDECLARED, journal_dot
from fsm.review.inspect import parse_journal
from fsm.review.web import catalog as catalog_module
from fsm.review.web.budget import Budgets
from fsm.review.web.catalog import Catalog, row_of
from fsm.review.web.server import create_app
from fsm.review.web.story import story
from fsm.review.web.svg import SHAPES, sanitize_svg
from fsm.scenarios.demo import main as play_built_in_turns
from fsm.scenarios.format import ScenarioError

PHISH = 'URL="https://phish.example/" target="_top" image="/etc/hostname"'
FORBIDDEN_IN_SVG = ("<a", "href", "<image", "phish.example", "/etc/hostname", "<script",
                    "foreignObject", "style=", "url(", "onload", "target=")


@pytest.fixture(scope="module")
def built_in(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The five built-in turns' journals, as documents to copy and craft from."""
    folder = tmp_path_factory.mktemp("built_in")
    play_built_in_turns(folder, out=io.StringIO())
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in folder.glob("*.json")}


@pytest.fixture
def folder(tmp_path: Path, built_in: dict[str, dict[str, Any]]) -> Path:
    root = tmp_path / "journals"
    root.mkdir()
    for name, document in built_in.items():
        (root / f"{name}.json").write_text(json.dumps(document), encoding="utf-8")
    return root


@pytest_asyncio.fixture
async def server(folder: Path) -> AsyncIterator[TestServer]:
    async with TestServer(create_app(folder), host="127.0.0.1") as srv:
        yield srv


async def _get(srv: TestServer, path: str, **headers: str) -> tuple[int, str]:
    async with ClientSession() as session, \
            session.get(srv.make_url(path), headers=headers) as response:
        return response.status, await response.text()


def _write(folder: Path, name: str, document: Any) -> str:
    (folder / name).write_text(json.dumps(document), encoding="utf-8")
    return name


@pytest.fixture
def fake_dot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder put first on the PATH, where a test writes the `dot` it wants."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    yield bin_dir


def _script(bin_dir: Path, body: str) -> None:
    dot = bin_dir / "dot"
    dot.write_text("#!/bin/sh\n" + body, encoding="utf-8")
    dot.chmod(0o755)


# ------------------------------------------------------------------ V4: other sites


@pytest.mark.asyncio
async def test_requests_from_other_sites_are_refused(server: TestServer) -> None:
    # covers V4: a page on another site (or another port of localhost: same-site) cannot
    # fire the page's requests; the page's own requests and a typed address are served,
    # and a link from elsewhere may open the (data-free) page itself, nothing more
    own = f"http://127.0.0.1:{server.port}"
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": "https://attacker.example"}, {"Origin": "null"},
                    {"Origin": f"http://127.0.0.1:{server.port + 1}"}):
        for path in ("/api/journals", "/api/story?id=05_kill.json",
                     "/api/diagram.svg?id=05_kill.json"):
            status, body = await _get(server, path, **headers)
            assert status == 403 and "refuses requests from other sites" in body, \
                (headers, path, body)
            assert body.count("\n") == 1
    for headers in ({}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"},
                    {"Origin": own}):
        assert (await _get(server, "/api/journals", **headers))[0] == 200, headers
    navigate = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    assert (await _get(server, "/", **navigate))[0] == 200
    assert (await _get(server, "/api/journals", **navigate))[0] == 403


# ------------------------------------------------------------------ V2: DOT and SVG


@pytest.mark.asyncio
async def test_journal_strings_cannot_reach_the_drawing_as_dot(
        server: TestServer, folder: Path, built_in: dict[str, dict[str, Any]]) -> None:
    # covers V2: an event with a line break once left the `// key` comment and added a node
    # with a link and a local image; events must be triggers of the table now, and a name
    # or status that tries the same is shown as text
    crafted = copy.deepcopy(built_in["01_plain_reply"])
    crafted["journal"][0]["event"] = f'begin\n  evil [{PHISH}]\n  //'
    _write(folder, "event.json", crafted)
    status, body = await _get(server, "/api/diagram.svg?id=event.json")
    assert status == 422 and "is not a trigger of fsm/table.py" in body, body
    assert body.count("\n") == 1 and "'begin   evil [" in body  # shown on one line, cut
    named = copy.deepcopy(built_in["01_plain_reply"])
    named["name"] = f'x"];\n evil [{PHISH}]; <b>bold</b> > //'
    named["result"]["status"] = f'"]\n evil2 [{PHISH}]'
    _write(folder, "named.json", named)
    status, svg = await _get(server, "/api/diagram.svg?id=named.json")
    assert status == 200, svg
    shown = _text_only(svg)
    assert 'x"];' in shown and 'evil [URL="https://phish.example/"' in shown
    assert "<b>bold</b> >" in shown


def _text_only(svg: str) -> str:
    """The text the drawing shows, after checking that journal text is nowhere else: no
    link, image or reference, and no attribute carrying the crafted strings."""
    root = ET.fromstring(svg)
    for element in root.iter():
        assert element.tag.rpartition("}")[2] in SHAPES, element.tag
        for name, value in element.attrib.items():
            assert "phish" not in value and "/etc/" not in value and "href" not in name, \
                (element.tag, name, value)
    return " ".join(t for e in root.iter() if e.tag.endswith("text") for t in [e.text or ""])


HOSTILE_SVG = """<?xml version="1.0"?>
<!DOCTYPE svg PUBLIC "-//W3C//DTD SVG 1.1//EN" "http://www.w3.org/Graphics/SVG/1.1/DTD/svg11.dtd">
<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"
     width="10pt" height="10pt" onload="alert(1)" style="background:url(https://x.example/)">
<g id="begin:Preparing:AwaitingFirstToken" class="edge" transform="translate(4 4)">
<title>begin</title>
<a xlink:href="https://phish.example/" target="_top" xlink:title="tooltip &amp; more">
<path fill="url(https://x.example/p#g)" stroke="#000" d="M0,0L5,5"/>
<text x="1" y="2" font-family="Helvetica,sans-Serif">kept text</text>
</a>
<image xlink:href="/etc/hostname" width="5" height="5"/>
<use xlink:href="https://x.example/sprite.svg#a"/>
<script>alert(2)</script>
<foreignObject><div xmlns="http://www.w3.org/1999/xhtml">html</div></foreignObject>
<polygon fill="red" stroke="javascript:alert(3)" points="0,0 1,1"/>
</g>
</svg>
"""


def test_the_svg_is_rebuilt_from_an_allow_list() -> None:
    # covers V2: links, images, references, scripts, HTML, styles and handlers are gone;
    # shapes, text, ids and tooltips (as SVG titles) stay
    clean = sanitize_svg(HOSTILE_SVG.encode()).decode()
    for bad in (*FORBIDDEN_IN_SVG, "alert", "x.example", "<use", "html", "javascript"):
        assert bad not in clean, (bad, clean)
    for kept in ('id="begin:Preparing:AwaitingFirstToken"', "kept text", 'd="M0,0L5,5"',
                 "<title>tooltip &amp; more</title>", 'transform="translate(4 4)"',
                 'stroke="#000"'):
        assert kept in clean, (kept, clean)
    with pytest.raises(ValueError, match="no readable SVG"):
        sanitize_svg(b'<!DOCTYPE svg [<!ENTITY a "aaaa">]><svg>&a;</svg>')
    with pytest.raises(ValueError, match="not SVG"):
        sanitize_svg(b'<html xmlns="http://www.w3.org/1999/xhtml"/>')


@pytest.mark.asyncio
async def test_what_dot_writes_reaches_the_page_only_sanitised(
        server: TestServer, fake_dot: Path, tmp_path: Path) -> None:
    # covers V2 through the server: whatever `dot` writes, the page gets the allow-list
    (tmp_path / "hostile.svg").write_text(HOSTILE_SVG, encoding="utf-8")
    _script(fake_dot, f"cat >/dev/null\ncat '{tmp_path / 'hostile.svg'}'\n")
    status, svg = await _get(server, "/api/diagram.svg?id=05_kill.json")
    assert status == 200, svg
    assert "kept text" in svg and "alert" not in svg and "href" not in svg


# ------------------------------------------------------------------ V3: budgets


@pytest.mark.asyncio
async def test_a_failing_or_missing_dot_is_one_line(server: TestServer, fake_dot: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # covers V3: `dot` exiting with an error, or writing something that is not SVG, is
    # named in one line, not a bare 500; a `dot` that is not installed says which package
    _script(fake_dot, "cat >/dev/null\necho 'Error: syntax error in line 7' >&2\nexit 3\n")
    status, body = await _get(server, "/api/diagram.svg?id=05_kill.json")
    assert (status, body) == (502, "graphviz's `dot` failed (exit 3): Error: syntax error in "
                                   "line 7\n")
    _script(fake_dot, "cat >/dev/null\necho '<svg'\n")
    status, body = await _get(server, "/api/diagram.svg?id=05_kill.json")
    assert status == 502 and "no readable SVG" in body and body.count("\n") == 1
    monkeypatch.setenv("PATH", str(fake_dot))
    (fake_dot / "dot").unlink()
    status, body = await _get(server, "/api/diagram.svg?id=05_kill.json")
    assert (status, body) == (503, "graphviz's `dot` is not installed (Debian package "
                                   "graphviz)\n")


def _started(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.exists() else []


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.asyncio
async def test_drawings_whose_dot_never_ends_leave_the_list_answering(
        folder: Path, fake_dot: Path, tmp_path: Path) -> None:
    # covers V3: seven drawings whose `dot` never ends once filled the thread pool and the
    # list stopped answering; now `dot` runs as a process, two at a time, and the list is
    # served while they hang; closing the server stops them. Real processes: every wait is
    # on a condition, none on time
    pids = tmp_path / "pids"
    _script(fake_dot, f"echo $$ >> '{pids}'\nexec sleep 600\n")
    async with TestServer(create_app(folder), host="127.0.0.1") as srv:
        drawings = [asyncio.create_task(_get(srv, "/api/diagram.svg?id=05_kill.json"))
                    for _ in range(7)]
        async with asyncio.timeout(30):
            while len(_started(pids)) < 2:
                await asyncio.sleep(0)
        async with asyncio.timeout(60):  # before, the listing waited for the hung drawings
            status, body = await _get(srv, "/api/journals")
            assert status == 200 and json.loads(body)["total"] == 5
            status, _ = await _get(srv, "/api/story?id=05_kill.json")
            assert status == 200
        assert len(_started(pids)) == 2 and not any(d.done() for d in drawings)
        for drawing in drawings:
            drawing.cancel()
        await asyncio.gather(*drawings, return_exceptions=True)
    async with asyncio.timeout(30):
        while not all(_gone(pid) for pid in _started(pids)):
            await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_dot_past_its_time_budget_is_killed_and_named(
        folder: Path, fake_dot: Path, tmp_path: Path) -> None:
    # covers V3: a drawing gets its budget (here half a second of real time: `dot` is a real
    # process), then `dot` is killed and the answer is one line
    pids = tmp_path / "pids"
    _script(fake_dot, f"echo $$ >> '{pids}'\nexec sleep 600\n")
    budgets = Budgets(dot_s=0.5)
    async with TestServer(create_app(folder, budgets=budgets), host="127.0.0.1") as srv:
        status, body = await _get(srv, "/api/diagram.svg?id=05_kill.json")
    assert (status, body) == (503, "drawing: graphviz's `dot` took longer than 0.5 s; "
                                   "stopped it\n")
    started = _started(pids)
    assert len(started) == 1 and _gone(started[0])


def _every_transition(document: dict[str, Any], count: int) -> dict[str, Any]:
    """`document` with `count` transitions cycling over every (trigger, state, state)."""
    states = [s.value for s in diagram.STATES]
    triggers = sorted(diagram.TRIGGERS)
    keys = [(e, a, b) for e in triggers for a in states for b in states]
    crafted = copy.deepcopy(document)
    crafted["journal"] = [{"t": n * 0.001, "event": keys[n % len(keys)][0],
                           "from": keys[n % len(keys)][1], "to": keys[n % len(keys)][2]}
                          for n in range(count)]
    return crafted


@pytest.mark.asyncio
async def test_a_crafted_journal_draws_a_bounded_diagram(
        server: TestServer, folder: Path, built_in: dict[str, dict[str, Any]]) -> None:
    # covers V2, V3: a journal that takes every (trigger, source, dest) thousands of times
    # once kept `dot` busy for minutes; its DOT is now as small as a few turns' whatever it
    # holds: the undeclared transitions and the steps listed per edge are capped
    small = journal_dot([parse_journal(_every_transition(built_in["05_kill"], 20_000), "s")])
    big = journal_dot([parse_journal(_every_transition(built_in["05_kill"], 60_000), "b")])
    assert len(big) < 1.05 * len(small) and len(big) < 60_000, (len(small), len(big))
    assert big.count("(not in fsm/table.py)") == MAX_UNDECLARED
    assert "more transitions not in fsm/table.py are not drawn" in big
    assert re.search(rf"(#\d+ @[\d.]+s, ){{{MAX_STEPS_SHOWN - 1}}}#\d+ @[\d.]+s and \d+ more",
                     big)
    _write(folder, "every.json", _every_transition(built_in["05_kill"], 20_000))
    status, svg = await _get(server, "/api/diagram.svg?id=every.json")
    assert status == 200, svg


@pytest.mark.asyncio
async def test_a_heat_map_reads_each_journal_once_off_the_loop(
        folder: Path, built_in: dict[str, dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # covers V3: one big journal named 30 times in a heat map was read 30 times on the event
    # loop (11 s stalled); it is read once, in a worker thread, within the request's bytes,
    # and a request naming more journals than a heat map draws is refused in one line
    big = copy.deepcopy(built_in["01_plain_reply"])
    big["history"] = [{"role": "user", "content": "w" * 1000} for _ in range(3000)]
    _write(folder, "big.json", big)
    reads: list[tuple[str, bool]] = []
    real = catalog_module.load_journal

    def counted(path: Path) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        reads.append((path.name, on_loop))
        return real(path)

    monkeypatch.setattr(catalog_module, "load_journal", counted)
    budgets = Budgets(request_bytes=8_000_000, heat_journals=40)
    async with TestServer(create_app(folder, budgets=budgets), host="127.0.0.1") as srv:
        assert (await _get(srv, "/api/journals"))[0] == 200
        reads.clear()
        ids = "&".join(["id=big.json"] * 30 + ["id=05_kill.json"])
        status, svg = await _get(srv, f"/api/diagram.svg?{ids}")
        assert status == 200, svg
        assert sorted(reads) == [("05_kill.json", False), ("big.json", False)]
        assert "2 journals" in svg
        many = "&".join(f"id=n{n}.json" for n in range(41))
        status, body = await _get(srv, f"/api/diagram.svg?{many}")
        assert status == 413 and "at most 40" in body and body.count("\n") == 1
        for n in range(3):
            _write(folder, f"big{n}.json", big)
        status, body = await _get(srv, "/api/diagram.svg?" + "&".join(
            f"id=big{n}.json" for n in range(3)))
        assert status == 413 and "more than the 8 MB one request reads" in body, body


# ------------------------------------------------------------------ V5: bad files


TYPE_CONFUSED: dict[str, Any] = {
    "pass_results": 5, "notices": 5, "function_history": {"a": 1}, "passes": "3",
    "delivered_text": ["a"], "error": {"x": 1}, "flags": ["a"], "deferred_notice": 7,
    "context_items_added": "many",
}


@pytest.mark.asyncio
async def test_one_bad_file_is_one_problem_never_a_failed_listing(
        folder: Path, tmp_path: Path, built_in: dict[str, dict[str, Any]]) -> None:
    # covers V5: `"pass_results": 5` once made the whole list a 500; a file over the size
    # budget is listed, not parsed; a link to a file outside the folder is listed as a
    # problem and never served, a link inside it is followed
    for field, value in TYPE_CONFUSED.items():
        crafted = copy.deepcopy(built_in["02_tool_call"])
        crafted["result"][field] = value
        _write(folder, f"confused_{field}.json", crafted)
    _write(folder, "large.json", dict(built_in["01_plain_reply"], padding="p" * 300_000))
    outside = tmp_path / "secret.json"
    outside.write_text(json.dumps(dict(built_in["01_plain_reply"], name="secret")))
    (folder / "leak.json").symlink_to(outside)
    (folder / "alias.json").symlink_to(folder / "05_kill.json")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "deep.json").write_text(json.dumps(built_in["05_kill"]))
    (folder / "linked_dir").symlink_to(tmp_path / "elsewhere")
    budgets = Budgets(journal_bytes=200_000)
    async with TestServer(create_app(folder, budgets=budgets), host="127.0.0.1") as srv:
        status, body = await _get(srv, "/api/journals")
        assert status == 200, body
        data = json.loads(body)
        listed = {row["id"] for row in data["rows"]}
        problems = {p["id"]: p["error"] for p in data["problems"]}
        assert {f"confused_{field}.json" for field in TYPE_CONFUSED} <= listed
        assert "alias.json" in listed and "secret" not in body
        assert problems["leak.json"] == "a link to a file outside the folder; not read"
        assert problems["large.json"].endswith("larger than the 0.2 MB the review page reads")
        assert not any(key.startswith("linked_dir") for key in listed | set(problems))
        for field in TYPE_CONFUSED:
            status, told = await _get(srv, f"/api/story?id=confused_{field}.json")
            assert status == 200, (field, told)
        assert (await _get(srv, "/api/story?id=leak.json"))[0] == 404
        status, body = await _get(srv, "/api/story?id=large.json")
        assert status == 404, body
        assert (await _get(srv, "/api/story?id=alias.json"))[0] == 200


def test_a_listing_reads_new_files_within_its_time_budget(
        folder: Path, built_in: dict[str, dict[str, Any]]) -> None:
    # covers V5: with no time left, a listing still reads one new file and counts the rest
    # as pending; the next listing goes on from there (what it read is kept)
    catalog = Catalog(folder)
    first = catalog.scan(budget_s=0.0)
    assert (len(first.rows), first.pending) == (1, 4)
    second = catalog.scan(budget_s=0.0)
    assert (len(second.rows), second.pending) == (2, 3)
    assert len(catalog.scan().rows) == 5


# ------------------------------------------------------------------ V6: linear story


def _many_passes(document: dict[str, Any], passes: int, chunk: int) -> dict[str, Any]:
    crafted = copy.deepcopy(document)
    crafted["journal"] = []
    crafted["passes"] = []
    crafted["result"]["pass_results"] = []
    for n in range(passes):
        t = n * 2.0
        crafted["journal"] += [
            {"t": t, "event": "begin", "from": "Preparing", "to": "AwaitingFirstToken"},
            {"t": t + 0.5, "event": "first_token", "from": "AwaitingFirstToken",
             "to": "Streaming"},
            {"t": t + 1.0, "event": "tool_call", "from": "Streaming", "to": "ToolCall"},
            {"t": t + 1.5, "event": "tool_result", "from": "ToolCall", "to": "Preparing"}]
        text = f"{n:05d}" + "t" * (chunk - 5)
        crafted["passes"].append([{"at": 0.5, "text": text}])
        crafted["result"]["pass_results"].append({"index": n + 1, "status": "function_call",
                                                  "text": text})
    return crafted


def test_the_story_is_linear_in_the_journal(built_in: dict[str, dict[str, Any]]) -> None:
    # covers V6: a 480 KB journal once took 1.8 s and told an 81 MB story (the whole text
    # at every step); each chunk is sent once now, and the text at a step is rebuilt
    document = _many_passes(built_in["01_plain_reply"], passes=240, chunk=1000)
    size = len(json.dumps(document))
    told = story(parse_journal(document, "many"))
    assert len(json.dumps(told)) < 3 * size, (size, len(json.dumps(told)))
    last = told["steps"][-1]
    assert text_at(told, last["t"]).startswith("00000t") and \
        len(text_at(told, last["t"])) == 240 * 1000


# ------------------------------------------------------------------ fuzzing

SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) \
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place inside a decoded JSON document (not the root)."""
    out: list[tuple[Any, ...]] = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value[:4]):
            out += _paths(child, (*prefix, index))
    return out


def _set(document: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        document = document[key]
    document[path[-1]] = value


@st.composite
def confused_journals(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """A real journal with a few fields replaced by values of any type, or blown up."""
    document = copy.deepcopy(base)
    places = _paths(document)
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(places))
        kind = draw(st.sampled_from(["value", "long_text", "long_list"]))
        if kind == "value":
            replacement: Any = draw(JSON_VALUES)
        elif kind == "long_text":
            replacement = draw(st.sampled_from(["\n", "é", "<b>", "\"", "\ud800"])) * 20_000
        else:  # scalars only: a shared list or object would be blown up 2,000 times over
            replacement = [draw(SCALARS)] * 2_000
        with contextlib.suppress(KeyError, IndexError, TypeError):
            _set(document, path, replacement)
        places = _paths(document)
    return document


def _check_story_types(told: dict[str, Any]) -> None:
    """What review.js reads, with the types it expects."""
    assert isinstance(told["name"], str) and isinstance(told["final_state"], str)
    assert told["status"] is None or isinstance(told["status"], str)
    assert told["error"] is None or isinstance(told["error"], str)
    assert all(isinstance(n, str) for n in told["notices"])
    assert isinstance(told["delivered_text"], str) and isinstance(told["summary"], str)
    assert all(isinstance(f, str) for f in told["flags"])
    for p in told["passes"]:
        assert isinstance(p["start"], float) and (p["end"] is None or isinstance(p["end"], float))
        assert p["text"] is None or isinstance(p["text"], str)
        assert all(isinstance(at, float) and isinstance(text, str) for at, text in p["chunks"])
        assert p["usage"] is None or all(isinstance(v, int) for v in p["usage"].values())
        assert all(isinstance(name, str) for name in p["tool_calls"])
    for c in told["tools"]:
        assert isinstance(c["name"], str) and isinstance(c["pass"], int)
        assert c["outcome"] is None or isinstance(c["outcome"], dict)
    assert all(isinstance(p["fed_back"], int) for p in told["passes"])
    given = told["input"]
    assert isinstance(given["system_prompt"], str) and isinstance(given["prefill"], str)
    assert all(isinstance(m[k], str) for m in given["history"] for k in ("author", "content"))
    assert all(isinstance(c["name"], str) for c in given["replayed"] + given["context"])
    assert told["outcome"] in ("ok", "failed", "timeout", "stopped", "other", "unknown")
    reply = told["reply"]
    if reply is not None:
        assert isinstance(reply["id"], str) and all(isinstance(n, str) for n in reply["notices"])
        assert all(isinstance(a["journal"], str) for a in reply["attempts"])


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_confused_journal_is_a_row_or_one_problem_and_a_story_of_the_right_types(
        built_in: dict[str, dict[str, Any]], tmp_path: Path, data: st.DataObject) -> None:
    # covers V5, V6, fuzzed: whatever type a field holds and however long, the catalog
    # lists a row or one problem, and the story is told (or refused in one line) with the
    # types the page expects, its size linear in the journal's
    base = built_in[data.draw(st.sampled_from(sorted(built_in)))]
    document = data.draw(confused_journals(base))
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    (root / "j.json").write_text(json.dumps(document), encoding="utf-8")
    scan = Catalog(root).scan()
    assert len(scan.rows) + len(scan.problems) == 1
    if scan.problems:
        assert "\n" not in scan.problems[0].error
    try:
        journal = parse_journal(json.loads((root / "j.json").read_text()), "j.json")
    except ScenarioError:
        return
    row_of(journal, "j.json", datetime.now(UTC))
    try:
        told = story(journal)
    except ScenarioError as exc:
        assert "\n" not in str(exc)
        return
    _check_story_types(told)
    assert len(json.dumps(told)) <= 8 * len(json.dumps(document)) + 20_000


TEXT = st.text(st.characters(exclude_categories=()), max_size=40) | \
    st.sampled_from(['"]; x [URL="https://e.example"]', "\n//", "<b>", "\\", "}", "&amp;"])
ALLOWED_DOT_ATTRIBUTES = frozenset({
    "rankdir", "compound", "newrank", "nodesep", "ranksep", "fontname", "fontsize", "label",
    "labelloc", "labeljust", "pad", "bgcolor", "style", "shape", "margin", "color",
    "fontcolor", "penwidth", "id", "tooltip", "ltail", "fillcolor", "width", "group",
    "fixedsize", "arrowsize", "rank", "class", "name", "directed", "strict", "_gvid",
    "_subgraph_cnt", "objects", "edges", "nodes", "subgraphs", "head", "tail", "bb", "lp",
    "pos", "height", "xdotversion", "lheight", "lwidth", "_draw_", "_ldraw_",
    "_hdraw_", "_tdraw_", "_hldraw_", "_tldraw_"})


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(name=TEXT, status=TEXT, state=TEXT, event=TEXT | st.sampled_from(sorted(diagram.TRIGGERS)))
def test_the_dot_writer_keeps_any_string_inside_an_escaped_label(
        built_in: dict[str, dict[str, Any]], name: str, status: str, state: str,
        event: str) -> None:
    # covers V2, fuzzed: any journal string either refuses the drawing (an event that is not
    # a trigger) or ends up inside a label; `dot` reads the DOT without error, and the graph
    # it read has only the table's states as nodes and only the attributes the writer uses
    document = copy.deepcopy(built_in["02_tool_call"])
    document["name"] = name
    document["result"]["status"] = status
    document["journal"][1]["event"] = event
    empty = copy.deepcopy(document)
    empty["journal"] = []
    empty["result"]["state"] = state
    for crafted in (document, empty):
        try:
            dot = journal_dot([parse_journal(crafted, "fuzz")])
        except ScenarioError as exc:
            assert event not in diagram.TRIGGERS, exc
            assert "is not a trigger" in str(exc) or "missing or not a string" in str(exc)
            assert "\n" not in str(exc)
            continue
        drawn = subprocess.run(["dot", "-Tjson0"], input=dot.encode(), capture_output=True,
                               timeout=60, check=False)
        assert drawn.returncode == 0, drawn.stderr
        graph = json.loads(drawn.stdout)
        nodes = {o["name"] for o in graph["objects"] if "nodes" not in o}
        assert nodes <= {s.value for s in diagram.STATES} | {"__start__"}
        for item in [graph, *graph["objects"], *graph.get("edges", [])]:
            assert set(item) <= ALLOWED_DOT_ATTRIBUTES, set(item) - ALLOWED_DOT_ATTRIBUTES
