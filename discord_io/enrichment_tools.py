"""The enrichment tools: each asks the engine to restart generation with richer context (R1-R8).

Bulky media (a profile picture, GIF keyframes) is stashed and only its key returned (R3);
its caption names the user or the link as quoted strings, as the dialogue does (A3);
a YouTube link travels inline (R2); message metadata is fetched by the engine itself through
`TurnChannel.fetch_reactors` (R6). Every problem the model could cause (bad URL, not an
image, too big, too slow) is a failed `ToolResult` it can read, never an exception.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import discord
from pydantic import BaseModel, ConfigDict, Field

from fsm import (
    NOT_AVAILABLE,
    EnrichmentKind,
    FunctionTool,
    StashFull,
    Tool,
    ToolContext,
    ToolResult,
    quoted_name,
)

from .media_fetch import FetchError, FetchLimits, MediaFetcher
from .media_frames import MediaError, image_mime, keyframes

log = logging.getLogger(__name__)

AVATAR_LIMITS = FetchLimits(max_bytes=2 * 1024 * 1024, timeout_s=10.0)
GIF_LIMITS = FetchLimits(max_bytes=10 * 1024 * 1024, timeout_s=15.0)
AVATAR_SIZE = 256
DEFAULT_KEYFRAMES = 4

YOUTUBE_HOSTS = frozenset(
    {
        "youtube.com",
        "www.youtube.com",
        "m.youtube.com",
        "music.youtube.com",
        "youtube-nocookie.com",
        "www.youtube-nocookie.com",
        "youtu.be",
    }
)
_VIDEO_ID = re.compile(r"^[A-Za-z0-9_-]{11}$")
_PATH_PREFIXES = ("shorts", "embed", "live", "v")


@dataclass(frozen=True, slots=True)
class AvatarRef:
    """Whose picture it is and where to download it."""

    name: str
    url: str


AvatarLookup = Callable[[int], Awaitable[AvatarRef | None]]


def discord_avatar_lookup(client: discord.Client, *, size: int = AVATAR_SIZE) -> AvatarLookup:
    """Look a user up over REST and point at their avatar (the default one if none) as PNG."""

    async def lookup(user_id: int) -> AvatarRef | None:
        try:
            user = await client.fetch_user(user_id)
        except discord.NotFound:
            return None
        asset = user.display_avatar.with_size(size).with_static_format("png")
        return AvatarRef(name=user.display_name, url=asset.url)

    return lookup


class PeekProfilePictureArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(
        pattern=r"^\d{15,21}$",
        description="The Discord user id whose profile picture to look at (a dialogue author_id).",
    )


class ProcessGifArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2048, description="The http(s) URL of the GIF.")


class ProcessYouTubeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2048, description="The YouTube video URL.")


class NoArgs(BaseModel):
    """No arguments; anything sent is ignored."""

    model_config = ConfigDict(extra="ignore")


def youtube_video_id(url: str) -> str | None:
    """The 11-character video id of a YouTube URL, or None when it is not one."""
    candidate = url.strip()
    if "://" not in candidate:
        candidate = "https://" + candidate
    try:
        parts = urlsplit(candidate)
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or host not in YOUTUBE_HOSTS:
        return None
    segments = [segment for segment in parts.path.split("/") if segment]
    video_id: str | None = None
    if host == "youtu.be":
        video_id = segments[0] if segments else None
    elif segments[:1] == ["watch"]:
        values = parse_qs(parts.query).get("v")
        video_id = values[0] if values else None
    elif len(segments) >= 2 and segments[0] in _PATH_PREFIXES:
        video_id = segments[1]
    if video_id is None or not _VIDEO_ID.match(video_id):
        return None
    return video_id


def _refused(kind: EnrichmentKind, name: str, ctx: ToolContext) -> ToolResult | None:
    """Defence in depth: the registry refuses a used enrichment too (R8)."""
    if ctx.flags.is_disabled(kind):
        return ToolResult.fail(f"{name} is {NOT_AVAILABLE}")
    return None


def _stash(ctx: ToolContext, item: dict[str, Any], restart_type: str) -> ToolResult:
    try:
        key = ctx.stash.put(item)
    except StashFull as exc:
        return ToolResult.fail(f"the media is too large to use ({exc})")
    return ToolResult.ok({"type": restart_type, "pending_context_key": key})


class EnrichmentTools:
    """Builds the four enrichment tools around a media fetcher and an avatar lookup."""

    def __init__(
        self,
        fetcher: MediaFetcher,
        avatars: AvatarLookup,
        *,
        avatar_limits: FetchLimits = AVATAR_LIMITS,
        gif_limits: FetchLimits = GIF_LIMITS,
        keyframe_count: int = DEFAULT_KEYFRAMES,
    ) -> None:
        self.fetcher = fetcher
        self.avatars = avatars
        self.avatar_limits = avatar_limits
        self.gif_limits = gif_limits
        self.keyframe_count = keyframe_count

    def tools(self) -> list[Tool]:
        peek: FunctionTool[PeekProfilePictureArgs] = FunctionTool(
            name="peek_profile_picture",
            description=(
                "Look at a user's Discord profile picture. Use it when the conversation is "
                "about how someone's avatar looks."
            ),
            args_model=PeekProfilePictureArgs,
            func=self.peek_profile_picture,
            guard="image",
        )
        gif: FunctionTool[ProcessGifArgs] = FunctionTool(
            name="process_gif",
            description="Look at a GIF from a link: a few keyframes of it are shown to you.",
            args_model=ProcessGifArgs,
            func=self.process_gif,
            guard="gif",
        )
        youtube: FunctionTool[ProcessYouTubeArgs] = FunctionTool(
            name="process_youtube_link",
            description="Watch a YouTube video someone linked, to talk about its content.",
            args_model=ProcessYouTubeArgs,
            func=self.process_youtube_link,
            guard="youtube",
        )
        metadata: FunctionTool[NoArgs] = FunctionTool(
            name="reveal_message_metadata",
            description=(
                "See who wrote each recent message, when, what it replied to and who reacted to it."
            ),
            args_model=NoArgs,
            func=self.reveal_message_metadata,
            guard="message_metadata",
        )
        return [peek, gif, youtube, metadata]

    async def peek_profile_picture(
        self, args: PeekProfilePictureArgs, ctx: ToolContext
    ) -> ToolResult:
        refused = _refused("image", "peek_profile_picture", ctx)
        if refused is not None:
            return refused
        try:
            avatar = await self.avatars(int(args.user_id))
        except (discord.HTTPException, OSError) as exc:
            log.warning("avatar lookup failed: %s", type(exc).__name__)
            return ToolResult.fail("could not look that user up right now")
        if avatar is None:
            return ToolResult.fail(f"no user with id {args.user_id}")
        try:
            fetched = await self.fetcher.fetch(avatar.url, self.avatar_limits)
            mime = await asyncio.to_thread(image_mime, fetched.data)
        except (FetchError, MediaError) as exc:
            return ToolResult.fail(f"could not get the profile picture: {exc}")
        item = {
            "role": "user",
            "parts": [
                {"type": "image", "mime": mime, "data": fetched.data},
                {"type": "text", "text": f"<profile picture of {quoted_name(avatar.name)}>"},
            ],
        }
        return _stash(ctx, item, "context_restart_image")

    async def process_gif(self, args: ProcessGifArgs, ctx: ToolContext) -> ToolResult:
        refused = _refused("gif", "process_gif", ctx)
        if refused is not None:
            return refused
        try:
            fetched = await self.fetcher.fetch(args.url, self.gif_limits)
            frames = await asyncio.to_thread(keyframes, fetched.data, count=self.keyframe_count)
        except (FetchError, MediaError) as exc:
            return ToolResult.fail(f"could not process the GIF: {exc}")
        parts: list[dict[str, Any]] = [
            {"type": "image", "mime": "image/png", "data": frame} for frame in frames.frames
        ]
        parts.append(
            {
                "type": "text",
                "text": (
                    f"<GIF from {quoted_name(args.url)}: {len(frames.frames)} keyframes of "
                    f"{frames.total_frames} frames, in order>"
                ),
            }
        )
        return _stash(ctx, {"role": "user", "parts": parts}, "context_restart_gif")

    async def process_youtube_link(self, args: ProcessYouTubeArgs, ctx: ToolContext) -> ToolResult:
        refused = _refused("youtube", "process_youtube_link", ctx)
        if refused is not None:
            return refused
        video_id = youtube_video_id(args.url)
        if video_id is None:
            return ToolResult.fail("that is not a YouTube video URL")
        url = f"https://www.youtube.com/watch?v={video_id}"
        return ToolResult.ok(
            {
                "type": "context_restart_youtube",
                "enhanced_context_item": {
                    "role": "user",
                    "parts": [{"type": "text", "text": f"<YouTube video: {url}>"}],
                },
            }
        )

    async def reveal_message_metadata(self, args: NoArgs, ctx: ToolContext) -> ToolResult:
        refused = _refused("message_metadata", "reveal_message_metadata", ctx)
        if refused is not None:
            return refused
        return ToolResult.ok({"type": "context_restart_message_metadata"})
