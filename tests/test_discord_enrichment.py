"""Enrichment tools against a loopback CDN with Pillow-made media (R2, R3, R8)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import discord
import pytest
from PIL import Image

from discord_io.delivery import DiscordChannel
from discord_io.enrichment_tools import (
    EnrichmentTools,
    NoArgs,
    PeekProfilePictureArgs,
    ProcessGifArgs,
    ProcessYouTubeArgs,
    discord_avatar_lookup,
    youtube_video_id,
)
from discord_io.media_fetch import (
    FetchError,
    FetchLimits,
    MediaFetcher,
    PublicOnlyResolver,
    check_url,
)
from discord_io.testing import CdnFile, DiscordEmulator, emulated_discord
from fsm.engine.flags import TurnFlags
from fsm.engine.provider import AbortSignal
from fsm.engine.stash import ContextStash
from fsm.engine.tools import NOT_AVAILABLE, ToolContext, ToolRegistry, ToolResult

from media_support import make_gif, make_png

AVATAR_HASH = "0123456789abcdef0123456789abcdef"


@dataclass
class Env:
    emu: DiscordEmulator
    client: discord.Client
    tools: EnrichmentTools
    ctx: ToolContext
    avatar_user: dict[str, Any]


@asynccontextmanager
async def enrichment_env(**tool_options: Any) -> AsyncIterator[Env]:
    async with emulated_discord() as (emu, client):
        user = emu.add_user("carol", global_name="Carol", avatar=AVATAR_HASH)
        emu.cdn[f"/avatars/{user['id']}/{AVATAR_HASH}.png"] = CdnFile("image/png", make_png())
        fetcher = MediaFetcher(allow_private=True)  # the CDN is on loopback
        tools = EnrichmentTools(fetcher, discord_avatar_lookup(client), **tool_options)
        ctx = ToolContext(
            channel=DiscordChannel(client, emu.channel_id, idle_flush_s=None),
            flags=TurnFlags(),
            abort=AbortSignal(),
            stash=ContextStash(),
            turn_id="turn-1",
        )
        try:
            yield Env(emu, client, tools, ctx, user)
        finally:
            await fetcher.aclose()


def _stashed(ctx: ToolContext, result: ToolResult, restart_type: str) -> dict[str, Any]:
    assert result.success, result.error
    assert result.data["type"] == restart_type
    assert set(result.data) == {"type", "pending_context_key"}
    item = ctx.stash.take(result.data["pending_context_key"])
    assert isinstance(item, dict)
    return item


@pytest.mark.asyncio
async def test_peek_profile_picture_stashes_the_avatar() -> None:
    # covers R3
    async with enrichment_env() as env:
        result = await env.tools.peek_profile_picture(
            PeekProfilePictureArgs(user_id=env.avatar_user["id"]), env.ctx
        )
        item = _stashed(env.ctx, result, "context_restart_image")
        assert item["role"] == "user"
        image, text = item["parts"]
        assert image == {"type": "image", "mime": "image/png", "data": make_png()}
        assert text == {"type": "text", "text": "<profile picture of \"Carol\">"}  # A3
        fetched = env.emu.requests_to(f"GET /cdn/avatars/{env.avatar_user['id']}/{AVATAR_HASH}.png")
        assert fetched[0].query["size"] == "256"
        assert env.ctx.stash.take(result.data["pending_context_key"]) is None  # single drain (R4)


@pytest.mark.asyncio
async def test_peek_profile_picture_of_an_unknown_user_fails() -> None:
    # covers R3
    async with enrichment_env() as env:
        result = await env.tools.peek_profile_picture(
            PeekProfilePictureArgs(user_id="999999999999999999"), env.ctx
        )
        assert not result.success and "no user" in (result.error or "")


@pytest.mark.asyncio
async def test_avatar_that_is_not_an_image_fails() -> None:
    # covers R3
    async with enrichment_env() as env:
        path = f"/avatars/{env.avatar_user['id']}/{AVATAR_HASH}.png"
        env.emu.cdn[path] = CdnFile("image/png", b"<html>definitely not a png</html>")
        result = await env.tools.peek_profile_picture(
            PeekProfilePictureArgs(user_id=env.avatar_user["id"]), env.ctx
        )
        assert not result.success and "not an image" in (result.error or "")
        assert len(env.ctx.stash) == 0


@pytest.mark.asyncio
async def test_avatar_over_the_size_limit_fails() -> None:
    # covers R3
    async with enrichment_env(avatar_limits=FetchLimits(max_bytes=100, timeout_s=10)) as env:
        result = await env.tools.peek_profile_picture(
            PeekProfilePictureArgs(user_id=env.avatar_user["id"]), env.ctx
        )
        assert not result.success and "larger than 100 bytes" in (result.error or "")


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_slow_download_times_out_on_the_loop_clock(looptime: float) -> None:
    # covers R3
    async with enrichment_env(gif_limits=FetchLimits(timeout_s=10.0)) as env:
        env.emu.cdn["/files/slow.gif"] = CdnFile("image/gif", make_gif(), delay_s=60.0)
        start = float(looptime)
        result = await env.tools.process_gif(
            ProcessGifArgs(url=env.emu.cdn_url("/files/slow.gif")), env.ctx
        )
        assert not result.success and "longer than 10 s" in (result.error or "")
        assert 10.0 <= float(looptime) - start < 60.0


@pytest.mark.asyncio
async def test_process_gif_stashes_evenly_spread_keyframes() -> None:
    # covers R3
    async with enrichment_env() as env:
        env.emu.cdn["/files/dance.gif"] = CdnFile("image/gif", make_gif(frames=10))
        url = env.emu.cdn_url("/files/dance.gif")
        result = await env.tools.process_gif(ProcessGifArgs(url=url), env.ctx)
        item = _stashed(env.ctx, result, "context_restart_gif")
        *frames, text = item["parts"]
        assert len(frames) == 4
        colours = []
        for part in frames:
            assert part["type"] == "image" and part["mime"] == "image/png"
            frame = Image.open(io.BytesIO(part["data"]))
            assert frame.format == "PNG" and frame.size == (64, 48)
            colours.append(frame.convert("RGB").getpixel((0, 0)))
        assert len(set(colours)) == 4  # first, middle and last frames, not one frame four times
        assert text == {
            "type": "text",
            "text": f"<GIF from \"{url}\": 4 keyframes of 10 frames, in order>",  # A3
        }


@pytest.mark.asyncio
async def test_process_gif_follows_a_redirect() -> None:
    # covers R3
    async with enrichment_env() as env:
        env.emu.cdn["/files/a.gif"] = CdnFile("image/gif", make_gif(frames=3))
        env.emu.cdn["/r/a"] = CdnFile(redirect_to="/cdn/files/a.gif")
        result = await env.tools.process_gif(ProcessGifArgs(url=env.emu.cdn_url("/r/a")), env.ctx)
        item = _stashed(env.ctx, result, "context_restart_gif")
        assert len(item["parts"]) == 4  # three frames and the label


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (CdnFile("text/html", b"<html>a page</html>"), "not an image"),
        (CdnFile("image/png", make_png()), "not a GIF"),
        (CdnFile("image/gif", make_gif(frames=3) + bytes(60_000), chunked=True), "larger than"),
        (CdnFile("image/gif", make_gif(frames=3) + bytes(60_000)), "larger than"),
        (CdnFile("image/gif", b"", status=404), "HTTP 404"),
    ],
)
async def test_process_gif_failures_are_results_not_crashes(entry: CdnFile, error: str) -> None:
    # covers R3
    async with enrichment_env(gif_limits=FetchLimits(max_bytes=20_000, timeout_s=10)) as env:
        env.emu.cdn["/files/x.gif"] = entry
        result = await env.tools.process_gif(
            ProcessGifArgs(url=env.emu.cdn_url("/files/x.gif")), env.ctx
        )
        assert not result.success and error in (result.error or "")
        assert len(env.ctx.stash) == 0


@pytest.mark.asyncio
async def test_stash_refusing_a_huge_item_is_a_failed_result() -> None:
    # covers R3
    async with enrichment_env() as env:
        env.ctx.stash = ContextStash(max_bytes=64)
        env.emu.cdn["/files/a.gif"] = CdnFile("image/gif", make_gif())
        result = await env.tools.process_gif(
            ProcessGifArgs(url=env.emu.cdn_url("/files/a.gif")), env.ctx
        )
        assert not result.success and "too large" in (result.error or "")


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/a.gif",
        "file:///etc/passwd",
        "http://127.0.0.1:9/a.gif",
        "http://localhost/a.gif",
        "http://[::1]/a.gif",
        "http://10.0.0.8/a.gif",
        "http://169.254.169.254/latest/meta-data",
        "http://user:pw@example.com/a.gif",
        "not a url at all",
    ],
)
async def test_urls_that_may_not_be_fetched_are_refused(url: str) -> None:
    # covers R3 (a model-chosen URL must not reach private services)
    fetcher = MediaFetcher()
    try:
        with pytest.raises(FetchError):
            await fetcher.fetch(url, FetchLimits())
        assert fetcher._session is None  # refused before any connection was made
    finally:
        await fetcher.aclose()


def test_public_urls_pass_the_check() -> None:
    # covers R3
    assert check_url("https://media.tenor.com/x/y.gif").host == "media.tenor.com"
    assert check_url("http://8.8.8.8/a.gif").host == "8.8.8.8"


@pytest.mark.asyncio
async def test_host_names_resolving_to_private_addresses_are_refused() -> None:
    # covers R3
    resolver = PublicOnlyResolver()
    try:
        with pytest.raises(OSError):
            await resolver.resolve("localhost", 80)
    finally:
        await resolver.close()


@pytest.mark.parametrize(
    ("url", "video_id"),
    [
        ("https://www.youtube.com/watch?v=dQw4w9WgXcQ", "dQw4w9WgXcQ"),
        ("https://youtu.be/dQw4w9WgXcQ?t=42", "dQw4w9WgXcQ"),
        ("youtube.com/shorts/abcdefghijk", "abcdefghijk"),
        ("https://m.youtube.com/watch?feature=share&v=A_b-C1d2E3f", "A_b-C1d2E3f"),
        ("https://www.youtube-nocookie.com/embed/dQw4w9WgXcQ", "dQw4w9WgXcQ"),
        ("https://vimeo.com/123456", None),
        ("https://www.youtube.com/watch?v=short", None),
        ("https://evil.com/youtube.com/watch?v=dQw4w9WgXcQ", None),
        ("https://www.youtube.com/channel/UC123", None),
        ("javascript:alert(1)", None),
    ],
)
def test_youtube_video_ids(url: str, video_id: str | None) -> None:
    # covers R2
    assert youtube_video_id(url) == video_id


@pytest.mark.asyncio
async def test_youtube_link_travels_inline_without_network() -> None:
    # covers R2
    async with enrichment_env() as env:
        before = len(env.emu.requests)
        result = await env.tools.process_youtube_link(
            ProcessYouTubeArgs(url="https://youtu.be/dQw4w9WgXcQ"), env.ctx
        )
        assert result == ToolResult.ok(
            {
                "type": "context_restart_youtube",
                "enhanced_context_item": {
                    "role": "user",
                    "parts": [
                        {
                            "type": "text",
                            "text": "<YouTube video: https://www.youtube.com/watch?v=dQw4w9WgXcQ>",
                        }
                    ],
                },
            }
        )
        assert len(env.emu.requests) == before
        bad = await env.tools.process_youtube_link(
            ProcessYouTubeArgs(url="https://vimeo.com/1"), env.ctx
        )
        assert not bad.success


@pytest.mark.asyncio
async def test_reveal_message_metadata_asks_for_a_restart() -> None:
    # covers R6
    async with enrichment_env() as env:
        result = await env.tools.reveal_message_metadata(NoArgs(), env.ctx)
        assert result == ToolResult.ok({"type": "context_restart_message_metadata"})


@pytest.mark.asyncio
async def test_each_tool_is_guarded_by_its_flag() -> None:
    # covers R8
    async with enrichment_env() as env:
        registry = ToolRegistry(env.tools.tools())
        guards = {name: registry.get(name).guard for name in registry.names()}  # type: ignore[union-attr]
        assert guards == {
            "peek_profile_picture": "image",
            "process_gif": "gif",
            "process_youtube_link": "youtube",
            "reveal_message_metadata": "message_metadata",
        }
        flags = TurnFlags()
        flags.disable("youtube")
        flags.disable("image")
        assert sorted(t.name for t in registry.available(flags)) == [
            "process_gif",
            "reveal_message_metadata",
        ]
        env.ctx.flags = flags
        tool = registry.get("process_youtube_link")
        assert tool is not None
        refused = await tool.run(ProcessYouTubeArgs(url="https://youtu.be/dQw4w9WgXcQ"), env.ctx)
        assert not refused.success and NOT_AVAILABLE in (refused.error or "")


@pytest.mark.asyncio
async def test_bad_arguments_become_messages_for_the_model() -> None:
    # covers R8 (execution checks never crash the turn)
    async with enrichment_env() as env:
        registry = ToolRegistry(env.tools.tools())
        peek = registry.get("peek_profile_picture")
        assert peek is not None
        problem = registry.parse_args(peek, {"user_id": "carol"})
        assert isinstance(problem, str) and "user_id" in problem
        metadata = registry.get("reveal_message_metadata")
        assert metadata is not None
        assert isinstance(registry.parse_args(metadata, {"anything": 1}), NoArgs)


@pytest.mark.asyncio
async def test_default_avatar_is_used_when_the_user_has_none() -> None:
    # covers R3
    async with emulated_discord() as (emu, client):
        lookup = discord_avatar_lookup(client)
        ref = await lookup(emu.alice_id)
        assert ref is not None and ref.name == "Alice"
        assert "/embed/avatars/" in ref.url
        assert await lookup(111111111111111111) is None
