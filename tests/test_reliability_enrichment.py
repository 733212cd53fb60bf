"""Fault cells for the enrichment tools (`process_gif`, `peek_profile_picture`) run by a real
turn: the scripted model calls the tool, the tool downloads from a loopback server
(`ReplayServer`, so every fault of the wire is scriptable and the server sees a client leave)
through `MediaFetcher`, decodes with Pillow and stashes the item. Every cell ends with the tool
returning a failed result the model sees in its next pass (or the restart going on without the
item), the turn in one terminal state, nothing left running, no connection checked out of the
fetcher's pool, and the stash within its bounds at every put.

Tests reach the loopback server with `MediaFetcher(allow_private=True)`; production builds
`MediaFetcher()` (turn_engine/bot.py), which refuses private addresses: one cell runs that one."""

from __future__ import annotations

import asyncio
import logging
import re
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from PIL import GifImagePlugin

from discord_io.enrichment_tools import AvatarRef, EnrichmentTools, ProcessGifArgs
from discord_io.media_fetch import FetchLimits, MediaFetcher
from discord_io.media_frames import MAX_FRAMES
from fsm.engine.config import TurnConfig
from fsm.engine.provider import AbortSignal, PassRequest, ProviderEvent
from fsm.engine.result import TurnResult
from fsm.engine.stash import ContextStash
from fsm.engine.tools import FunctionTool, Tool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import ScriptedProvider
from providers.replay_server import Hang, ReplayServer, Send, Step

from media_support import make_gif, make_png
from reliability_support import (
    EPS,
    build_turn,
    finish,
    no_task_left,
    server_saw_the_client_leave,
    times,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

CONFIG: dict[str, Any] = {
    "first_token_timeout_s": 60,
    "idle_timeout_s": 30,
    "settle_timeout_s": 5,
    "tool_timeout_s": 30,
}
LIMITS = FetchLimits(max_bytes=20_000, timeout_s=15.0)
USER_ID = "123456789012345678"
REPLY = "Here is what I can say."
FAILED_PREFIX = {
    "process_gif": "could not process the GIF: ",
    "peek_profile_picture": "could not get the profile picture: ",
}
TOOLS = list(FAILED_PREFIX)
PNG = make_png()
GIF = make_gif()


# ---------------------------------------------------------------------------------- harness


class BoundedStash(ContextStash):
    """The turn's stash, noting its size after every put (R3) and counting the puts. (It
    records rather than asserts: an assertion raised inside a tool would only become that
    tool's failed result.)"""

    puts = 0
    peak_items = 0
    peak_bytes = 0

    def put(self, item: Any) -> str:
        key = super().put(item)
        self.puts += 1
        self.peak_items = max(self.peak_items, len(self))
        self.peak_bytes = max(self.peak_bytes, self.total_bytes)
        return key


class RecordingProvider:
    """The scripted model, keeping every request so a cell can check what the model saw."""

    def __init__(self, inner: ScriptedProvider) -> None:
        self.inner = inner
        self.name = inner.name
        self.requests: list[PassRequest] = []

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        self.requests.append(request)
        return self.inner.stream(request, abort)


@dataclass
class Cell:
    turn: Turn
    cdn: ReplayServer
    fetcher: MediaFetcher
    stash: BoundedStash
    model: RecordingProvider
    tool: str
    url: str


@asynccontextmanager
async def enrichment_turn(
    cdn: ReplayServer,
    tool: str = "process_gif",
    *,
    config: dict[str, Any] | None = None,
    allow_private: bool = True,
    host: str = "127.0.0.1",
    limits: FetchLimits = LIMITS,
    wrap: Callable[[EnrichmentTools], list[Tool]] | None = None,
) -> AsyncIterator[Cell]:
    """A turn whose model calls `tool` once (pointing it at `cdn`), then answers `REPLY` a
    second later; after it, the server and the fetcher are closed and no task is left."""
    await cdn.start()
    url = f"http://{host}:{cdn.url.rsplit(':', 1)[1]}/media/clip.gif"
    fetcher = MediaFetcher(allow_private=allow_private)

    async def avatars(user_id: int) -> AvatarRef:
        return AvatarRef(name="Carol", url=url)

    tools = EnrichmentTools(fetcher, avatars, avatar_limits=limits, gif_limits=limits)
    args = {"url": url} if tool == "process_gif" else {"user_id": USER_ID}
    raw = {
        "name": "enrich",
        "config": {**CONFIG, **(config or {})},
        "passes": [
            [{"at": 0, "tool_call": {"name": tool, "args": args, "id": "call_1"}}],
            [{"at": 1, "text": REPLY}, {"at": 1, "end": "completed"}],
        ],
    }
    cfg = TurnConfig.model_validate(raw["config"])
    stash = BoundedStash(
        ttl_s=cfg.stash_ttl_s, max_items=cfg.stash_max_items, max_bytes=cfg.stash_max_bytes
    )
    model = RecordingProvider(ScriptedProvider(parse_scenario(raw).passes))
    registry = ToolRegistry(wrap(tools) if wrap is not None else tools.tools())
    turn = build_turn(raw, provider=model, registry=registry, stash=stash)
    try:
        yield Cell(turn, cdn, fetcher, stash, model, tool, url)
        assert stash.peak_items <= stash.max_items, "the stash held more items than allowed"
        assert stash.peak_bytes <= stash.max_bytes, "the stash held more bytes than allowed"
    finally:
        await fetcher.aclose()
        await cdn.close()
    await no_task_left()


def pool_is_empty(cell: Cell) -> bool:
    session = cell.fetcher._session
    return session is None or not session.connector._acquired  # type: ignore[union-attr]


async def ends_after_a_failed_tool(
    cell: Cell, error: str | re.Pattern[str], *, failed_at: float = 0.0
) -> TurnResult:
    """The tool failed with `error` (the text, or a pattern it matches) at `failed_at`; the
    model saw the failure in its next pass, the turn went on and completed; nothing was
    stashed; no connection is held."""
    result = await finish(cell.turn, engine_tasks_only=True)
    assert result.state == "Done" and result.status == "completed", result.error
    assert result.text == REPLY and len(result.passes) == 2
    entry = cell.turn.function_history[-1]
    assert entry.tool_name == cell.tool and entry.success is False
    said = entry.result["error"]
    assert said == error if isinstance(error, str) else error.fullmatch(said), said
    assert cell.model.requests[1].function_history[-1].result == {"success": False, "error": said}
    assert result.consecutive_tool_errors == 1 and result.context_items_added == 0
    assert not any(cell.turn.flags.as_dict().values())  # no restart: the guard stays open (R8)
    assert [t["event"] for t in cell.turn.transitions] == [
        "begin",
        "tool_call",
        "tool_result",
        "begin",
        "first_token",
        "completed",
    ]
    assert times(cell.turn)[3] == pytest.approx(failed_at, abs=EPS)
    assert times(cell.turn)[-1] == pytest.approx(failed_at + 1, abs=EPS)
    assert len(cell.stash) == 0 and cell.stash.total_bytes == 0
    assert pool_is_empty(cell)
    return result


def gif_with_frames(frames: int) -> bytes:
    """A GIF of `frames` one-pixel frames, ~15 bytes each: a small file, many frames."""
    head = b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return head + frame * frames + b"\x3b"


def corrupt(data: bytes, at: int, value: int) -> bytes:
    out = bytearray(data)
    out[at] = value
    return bytes(out)


@pytest.fixture
def frame_walks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the GIF frames Pillow walks (each one parsed, most decoded): the work done."""
    walked = [0]
    original = GifImagePlugin.GifImageFile._seek

    def counting(self: GifImagePlugin.GifImageFile, frame: int, *args: Any) -> None:
        walked[0] += 1
        original(self, frame, *args)

    monkeypatch.setattr(GifImagePlugin.GifImageFile, "_seek", counting)
    yield walked


# -------------------------------------------------------------------------------- downloads


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "growing body"])
async def test_oversized_download_is_refused_and_the_connection_closed(
    tool: str, declared: bool
) -> None:
    # covers R3, T5, T6, S14: a declared Content-Length over the limit is refused before the
    # body is read; a body without one is refused as soon as it grows past the limit; either
    # way the client closes the connection while the server is still sending
    if declared:
        steps: list[Step] = [Send(b"GIF89a"), Hang()]
        headers = {"Content-Length": str(50 * 1024 * 1024)}
    else:
        steps, headers = [*[Send(bytes(8192))] * 8, Hang()], {}
    cdn = ReplayServer(steps, headers=headers, content_type="image/gif")
    async with enrichment_turn(cdn, tool) as cell:
        error = FAILED_PREFIX[tool] + "the file is larger than 20000 bytes"
        await ends_after_a_failed_tool(cell, error)
        await server_saw_the_client_leave(cdn)
    assert cdn.completed == 0 and len(cdn.requests) == 1


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (404, {}, "the server answered HTTP 404"),
        (500, {}, "the server answered HTTP 500"),
        (200, {"Content-Length": "5000"}, "the download failed (ClientPayloadError)"),
    ],
    ids=["404", "500", "dropped mid-body"],
)
async def test_failing_download_is_a_failed_result(
    tool: str, status: int, headers: dict[str, str], expected: str
) -> None:
    # covers R3, T6, S14: an HTTP error, and a body cut short of its Content-Length (the
    # server closes the connection after 1,000 of 5,000 bytes)
    cdn = ReplayServer([Send(GIF[:1000])], status=status, headers=headers, content_type="image/gif")
    async with enrichment_turn(cdn, tool) as cell:
        await ends_after_a_failed_tool(cell, FAILED_PREFIX[tool] + expected)
    assert len(cdn.requests) == 1


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize(
    "steps", [[Hang()], [Send(b"GIF89a"), Hang()]], ids=["no body", "mid-body"]
)
async def test_hanging_download_hits_the_tool_timeout(tool: str, steps: list[Step]) -> None:
    # covers T5, T6, S6, S14: the tool budget (5 s) is shorter than the download's own
    # (15 s): at exactly 5 s the tool is cancelled, its connection closed, and the model sees
    # the timeout as a failed result; the turn goes on
    cdn = ReplayServer(steps, content_type="image/gif")
    async with enrichment_turn(cdn, tool, config={"tool_timeout_s": 5}) as cell:
        result = await finish(cell.turn, engine_tasks_only=True)
        assert result.state == "Done" and result.status == "completed"
        events = [t["event"] for t in cell.turn.transitions]
        assert events[:4] == ["begin", "tool_call", "tool_timeout", "begin"]
        assert times(cell.turn)[3] == pytest.approx(5.0, abs=EPS)
        failure = {"success": False, "error": f"{tool} timed out after 5 s"}
        assert cell.model.requests[1].function_history[-1].result == failure
        assert result.consecutive_tool_errors == 1 and len(cell.stash) == 0
        assert pool_is_empty(cell)
        await server_saw_the_client_leave(cdn)
    assert cdn.completed == 0


@pytest.mark.parametrize("tool", TOOLS)
async def test_hanging_download_hits_the_fetch_timeout(tool: str) -> None:
    # covers R3, T6, S14: the download's own budget (3 s, on the loop clock) is shorter than
    # the tool's: the tool itself fails at exactly 3 s and the turn goes on
    cdn = ReplayServer([Send(b"GIF89a"), Hang()], content_type="image/gif")
    limits = FetchLimits(max_bytes=20_000, timeout_s=3.0)
    async with enrichment_turn(cdn, tool, limits=limits) as cell:
        error = FAILED_PREFIX[tool] + "the download took longer than 3 s"
        await ends_after_a_failed_tool(cell, error, failed_at=3.0)
        await server_saw_the_client_leave(cdn)


async def test_kill_during_a_hanging_download_stops_at_once() -> None:
    # covers T5, S16, D3, D4: /kill while the tool waits on the wire: Stopped at the kill's
    # instant, the download's connection closed, and the model never sees a result
    cdn = ReplayServer([Send(b"GIF89a"), Hang()], content_type="image/gif")
    async with enrichment_turn(cdn) as cell:
        task = asyncio.create_task(cell.turn.run())
        await asyncio.sleep(2)
        assert cell.turn.state == "ToolCall"
        cell.turn.locks.request_stop(cell.turn.lock.channel_id)
        result = await finish(cell.turn, task, engine_tasks_only=True)
        assert result.state == "Stopped" and result.status == "stopped_by_user"
        assert times(cell.turn)[-1] == pytest.approx(2.0, abs=EPS)
        assert cell.turn.function_history == [] and len(cell.model.requests) == 1
        assert pool_is_empty(cell)
        await server_saw_the_client_leave(cdn)


@pytest.mark.parametrize(
    ("host", "refusal"),
    [
        ("127.0.0.1", "that address is not public"),
        ("localhost", "that address is not public"),
        ("[::ffff:127.0.0.1]", "that address is not public"),
        ("0x7f000001", "the download failed (ClientConnectorDNSError)"),
    ],
    ids=["ip literal", "localhost", "ipv4-mapped ipv6", "name resolving to loopback"],
)
async def test_private_address_is_refused_by_the_production_fetcher(
    host: str, refusal: str
) -> None:
    # covers R3 (a model-chosen URL must not reach private services): the production fetcher
    # refuses the loopback server, by the URL check (literals, localhost) or by its resolver
    # (a name that resolves to 127.0.0.1); no request reaches the server; the tests' fetcher
    # (allow_private=True) does reach the same URL, so the refusal is the policy's
    cdn = ReplayServer([Send(GIF)], content_type="image/gif")
    async with enrichment_turn(cdn, allow_private=False, host=host) as cell:
        await ends_after_a_failed_tool(cell, "could not process the GIF: " + refusal)
        assert cdn.requests == []
        if host != "localhost":  # may resolve to ::1 first, where the server does not listen
            reachable = MediaFetcher(allow_private=True)
            try:
                fetched = await reachable.fetch(cell.url, LIMITS)
            finally:
                await reachable.aclose()
            assert fetched.data == GIF and len(cdn.requests) == 1


# -------------------------------------------------------------------------------- the media


@pytest.mark.parametrize(
    ("tool", "body", "content_type", "expected"),
    [
        ("process_gif", b"<html>a page</html>", "text/html", "the file is not an image"),
        ("process_gif", PNG, "image/gif", "not a GIF or animation (got PNG)"),
        ("peek_profile_picture", b"<html>a page</html>", "image/png", "the file is not an image"),
        ("peek_profile_picture", PNG[:200], "image/png", "the image is damaged"),
        # with Pillow 13, these raised ValueError and SyntaxError out of the tool
        ("peek_profile_picture", corrupt(PNG, 11, 0), "image/png", "the image is damaged"),
        ("peek_profile_picture", corrupt(PNG, 36, 0), "image/png", "the image is damaged"),
        ("process_gif", GIF[:600], "image/gif", "the animation is damaged"),
        # with Pillow 13, these raised IndexError and struct.error out of the tool
        ("process_gif", GIF[:160], "image/gif", "the animation is damaged"),
        ("process_gif", GIF[:164], "image/gif", "the animation is damaged"),
    ],
    ids=[
        "html page",
        "png as gif",
        "html as png",
        "truncated png",
        "png bad header",
        "png broken chunk",
        "truncated gif",
        "gif cut in a frame header",
        "gif cut in a descriptor",
    ],
)
async def test_unusable_media_is_a_failed_result(
    tool: str, body: bytes, content_type: str, expected: str
) -> None:
    # covers R3, T6: the declared type is not trusted and a broken file is the tool's own
    # failed result (never an exception out of the tool, which the engine would only report
    # as "<tool> failed: IndexError: ...")
    cdn = ReplayServer([Send(body)], content_type=content_type)
    async with enrichment_turn(cdn, tool) as cell:
        await ends_after_a_failed_tool(cell, FAILED_PREFIX[tool] + expected)


async def test_gif_with_tens_of_thousands_of_frames_is_refused_with_bounded_work(
    frame_walks: list[int],
) -> None:
    # covers R3: 50,000 one-pixel frames in 750 kB: the frame walk stops after MAX_FRAMES
    # instead of walking (and, to reach the last keyframe, decoding) every frame
    data = gif_with_frames(50_000)
    cdn = ReplayServer([Send(data)], content_type="image/gif")
    limits = FetchLimits(max_bytes=len(data), timeout_s=15.0)
    async with enrichment_turn(cdn, limits=limits) as cell:
        error = f"could not process the GIF: the animation has more than {MAX_FRAMES} frames"
        await ends_after_a_failed_tool(cell, error)
    assert frame_walks[0] <= MAX_FRAMES + 10  # the walk, plus opening and rewinding


async def test_gif_with_thousands_of_frames_is_sampled_and_restarts(
    frame_walks: list[int],
) -> None:
    # covers R1, R3, R4, R7, R8, R9: 2,000 frames (under the cap): four keyframes stashed,
    # drained by the restart into the next pass's context, the guard set; the frames walked
    # are bounded by a few passes over the animation
    data = gif_with_frames(2_000)
    cdn = ReplayServer([Send(data)], content_type="image/gif")
    limits = FetchLimits(max_bytes=len(data), timeout_s=15.0)
    async with enrichment_turn(cdn, limits=limits) as cell:
        result = await finish(cell.turn, engine_tasks_only=True)
        assert result.state == "Done" and result.status == "completed"
        assert result.context_items_added == 1 and cell.turn.function_history == []
        item = cell.model.requests[1].context_items[-1]
        *frames, label = item["parts"]
        assert len(frames) == 4 and all(p["mime"] == "image/png" for p in frames)
        assert label["text"] == (  # A3: the link quoted
            f"<GIF from \"{cell.url}\": 4 keyframes of 2000 frames, in order>")
        assert cell.turn.flags.is_disabled("gif")
        assert "process_gif" not in [t["name"] for t in cell.model.requests[1].tools]
        assert cell.stash.puts == 1 and len(cell.stash) == 0  # drained (R4)
        assert pool_is_empty(cell)
    assert frame_walks[0] <= 3 * 2_000


# -------------------------------------------------------------------------------- the stash


async def test_item_over_the_stash_byte_budget_is_a_failed_result() -> None:
    # covers R3, T6: the keyframes are refused by a 256-byte stash: a failed result, nothing
    # stored
    cdn = ReplayServer([Send(GIF)], content_type="image/gif")
    async with enrichment_turn(cdn, config={"stash_max_bytes": 256}) as cell:
        error = re.compile(
            r"the media is too large to use \(item of \d+ bytes exceeds the stash budget of 256\)"
        )
        await ends_after_a_failed_tool(cell, error)
        assert cell.stash.puts == 0


@pytest.mark.parametrize("full_of", ["items", "bytes"])
async def test_full_stash_drops_the_oldest_and_the_restart_gets_its_item(full_of: str) -> None:
    # covers R3, R4, R5, R7: the stash is full of other turns' items (by count, or by bytes):
    # the tool's put drops the oldest, never exceeding a bound; the restart drains its own
    # item; a turn holding the dropped key would go on without it
    cdn = ReplayServer([Send(GIF)], content_type="image/gif")
    budget = {"stash_max_items": 2} if full_of == "items" else {"stash_max_bytes": 20_000}
    async with enrichment_turn(cdn, config=budget) as cell:
        filler = {"role": "user", "parts": [{"type": "text", "text": "x" * 9_900}]}
        oldest, newer = cell.stash.put(dict(filler)), cell.stash.put(dict(filler))
        assert len(cell.stash) == 2
        result = await finish(cell.turn, engine_tasks_only=True)
        assert result.status == "completed" and result.context_items_added == 1
        assert len(cell.model.requests[1].context_items[-1]["parts"]) == 5  # 4 frames, label
        assert cell.stash.take(oldest) is None  # dropped to make room
        assert cell.stash.take(newer) is not None and len(cell.stash) == 0
        assert cell.stash.puts == 3 and pool_is_empty(cell)


@pytest.mark.parametrize(
    ("delay", "resolved"), [(10.0, False), (9.5, True)], ids=["at its ttl", "before its ttl"]
)
async def test_stash_key_used_after_it_expired_goes_on_without_the_item(
    delay: float, resolved: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # covers R3, R5, R8: the tool stashes its keyframes, then takes `delay` more seconds to
    # return; with a 10 s ttl an item lives at most 10 s: drained at its ttl it is gone, the
    # warning is logged and the turn goes on without it (the guard still set); a moment
    # earlier it is used
    caplog.set_level(logging.WARNING, logger="fsm.engine.restart")

    def slow_gif(tools: EnrichmentTools) -> list[Tool]:
        async def process_gif(args: ProcessGifArgs, ctx: ToolContext) -> ToolResult:
            result = await tools.process_gif(args, ctx)
            await asyncio.sleep(delay)
            return result

        slow: FunctionTool[ProcessGifArgs] = FunctionTool(
            name="process_gif",
            description="slow",
            args_model=ProcessGifArgs,
            func=process_gif,
            guard="gif",
        )
        return [slow]

    cdn = ReplayServer([Send(GIF)], content_type="image/gif")
    async with enrichment_turn(cdn, config={"stash_ttl_s": 10}, wrap=slow_gif) as cell:
        result = await finish(cell.turn, engine_tasks_only=True)
        assert result.state == "Done" and result.status == "completed"
        events = [t["event"] for t in cell.turn.transitions]
        assert events[:5] == ["begin", "tool_call", "restart_requested", "restart", "begin"]
        assert times(cell.turn)[4] == pytest.approx(delay, abs=EPS)
        assert result.context_items_added == int(resolved)
        assert cell.turn.flags.is_disabled("gif")
        expired = [r for r in caplog.records if "expired, unknown or drained" in r.message]
        assert len(expired) == int(not resolved)
        assert cell.stash.puts == 1 and len(cell.stash) == 0 and cell.stash.total_bytes == 0
        assert pool_is_empty(cell)
