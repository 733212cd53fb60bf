"""Uploads the model should see: images as image parts for vision models, text files inline.

Attachment URLs point at Discord's CDN, but they are still fetched through `MediaFetcher`, the
same size-, time- and address-checked downloader the enrichment tools use: a message can be
forwarded or edited, and nothing a chat user controls gets a download without those checks.
An image is decoded (Pillow) before it is handed on, so a file that only claims to be an image
never reaches the provider. A failed download leaves the placeholder the message already
carries (`<attachment: name (type)>`) and is logged; it never fails the turn. A model without
vision gets only that placeholder.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import discord

from fsm import quoted_name

from .media_fetch import FetchError, FetchLimits, MediaFetcher
from .media_frames import MediaError, image_mime

log = logging.getLogger(__name__)

TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-yaml")
TEXT_SUFFIXES = (".txt", ".md", ".py", ".json", ".csv", ".log", ".yaml", ".yml", ".toml")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp")

ContextItem = dict[str, Any]


@dataclass(frozen=True, slots=True)
class AttachmentPolicy:
    vision: bool = False
    max_images: int = 4
    max_image_bytes: int = 8 * 1024 * 1024
    inline_text: bool = True
    max_text_chars: int = 8000
    timeout_s: float = 15.0


def is_image(attachment: discord.Attachment) -> bool:
    kind = (attachment.content_type or "").lower()
    return kind.startswith("image/") or attachment.filename.lower().endswith(IMAGE_SUFFIXES)


def is_text(attachment: discord.Attachment) -> bool:
    kind = (attachment.content_type or "").lower()
    return kind.startswith(TEXT_TYPES) or attachment.filename.lower().endswith(TEXT_SUFFIXES)


@dataclass(frozen=True, slots=True)
class ShownImage:
    """An image part and the message it came from."""

    message: discord.Message
    filename: str
    part: dict[str, Any]


def image_caption(images: Iterable[ShownImage]) -> str:
    """What the images are and whose: file and display names are the uploaders' choice, so
    each is a quoted one-line string (`quoted_name`), like the dialogue's names."""
    names = ", ".join(f"{quoted_name(image.filename)} from "
                      f"{quoted_name(image.message.author.display_name)}" for image in images)
    return f"<images attached: {names}>"


def image_item(images: Sequence[ShownImage]) -> ContextItem | None:
    """One user item carrying `images` and their caption, or None when there is none."""
    if not images:
        return None
    parts = [image.part for image in images]
    parts.append({"type": "text", "text": image_caption(images)})
    return {"role": "user", "type": "attachments", "parts": parts}


class AttachmentReader:
    """Turns the attachments of a turn's messages into context the model can use."""

    def __init__(self, fetcher: MediaFetcher, policy: AttachmentPolicy) -> None:
        self.fetcher = fetcher
        self.policy = policy

    async def text_of(self, attachment: discord.Attachment) -> str | None:
        """A text file's content, cut at `max_text_chars`; None if it cannot be read."""
        limit = self.policy.max_text_chars
        if not self.policy.inline_text or limit <= 0 or not is_text(attachment):
            return None
        try:
            fetched = await self.fetcher.fetch(
                attachment.url, FetchLimits(max_bytes=max(4 * limit, 1024),
                                            timeout_s=self.policy.timeout_s))
        except FetchError as exc:
            log.info("attachment %s not inlined: %s", attachment.filename, exc)
            return None
        text = fetched.data.decode("utf-8", errors="replace")
        return text if len(text) <= limit else text[: limit - 1] + "…"

    async def images(self, messages: Iterable[discord.Message]) -> list[ShownImage]:
        """The images of `messages` the model may see, in order, at most `max_images`;
        none when vision is off."""
        if not self.policy.vision or self.policy.max_images <= 0:
            return []
        found: list[ShownImage] = []
        for message in messages:
            for attachment in message.attachments:
                if len(found) >= self.policy.max_images:
                    return found
                if not is_image(attachment):
                    continue
                image = await self._image(attachment)
                if image is not None:
                    found.append(ShownImage(message, attachment.filename, image))
        return found

    async def _image(self, attachment: discord.Attachment) -> dict[str, Any] | None:
        limits = FetchLimits(max_bytes=self.policy.max_image_bytes,
                             timeout_s=self.policy.timeout_s)
        try:
            fetched = await self.fetcher.fetch(attachment.url, limits)
            mime = await asyncio.to_thread(image_mime, fetched.data)
        except (FetchError, MediaError) as exc:
            log.info("image %s not shown to the model: %s", attachment.filename, exc)
            return None
        return {"type": "image", "mime": mime, "data": fetched.data}
