"""Uploads the model sees (O6): image attachments, and images of the message
replied to, reach a vision model as image parts in the request the provider receives (a
loopback OpenAI-compatible server captures it); a model without vision gets the placeholder;
text files are inlined within their budget; every download goes through the size- and
address-checked fetcher. The bot started as production starts it (the sharded client through
the emulated gateway; the uploads arrive in MESSAGE_CREATE dispatches), virtual time."""

from __future__ import annotations

import base64
import io
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from gateway_support import Harness, bot_on_gateway
from PIL import Image

from discord_io.attachments import AttachmentPolicy, AttachmentReader
from discord_io.history import HistoryPolicy
from discord_io.media_fetch import MediaFetcher
from discord_io.testing import DiscordEmulator
from fsm.engine.generation import Attempt
from providers import ProviderConfig, build_provider
from providers.replay_server import ReplayServer, Send
from turn_engine.bot import TurnBot

from providers_support import sse

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

ANSWER = sse({"choices": [{"index": 0, "delta": {"content": "A teal square."},
                           "finish_reason": "stop"}]}) + b"data: [DONE]\n\n"


def placeholder(name: str) -> re.Pattern[str]:
    """The placeholder of an image attachment, however the dialogue renderer quotes names."""
    return re.compile(rf'<attachment: "?{re.escape(name)}"? \("?image/png"?\)>')


def _png(colour: str = "teal", side: int = 32) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side), colour).save(out, format="PNG")
    return out.getvalue()


@dataclass
class Vision:
    gateway: Harness
    model: ReplayServer

    @property
    def emu(self) -> DiscordEmulator:
        return self.gateway.emu

    @property
    def bot(self) -> TurnBot:
        return self.gateway.bot

    async def say(self, text: str, *, attachments: tuple[dict[str, Any], ...] = (),
                  reply_to: int | None = None, mention: bool = True) -> dict[str, Any]:
        """Alice posts in the guild channel; the gateway dispatches it."""
        return await self.gateway.say(text, attachments=attachments, reply_to=reply_to,
                                      mention=mention)

    async def answered(self) -> dict[str, Any]:
        """The body of the model request of the turn that answered the mention."""
        await self.gateway.until(lambda: len(self.bot.results) == 1)
        body: dict[str, Any] = self.model.requests[-1].json()
        return body


def _parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, list):
            parts.extend(content)
        else:
            parts.append({"type": "text", "text": content})
    return parts


def _images(body: dict[str, Any]) -> list[bytes]:
    found = []
    for part in _parts(body):
        if part["type"] == "image_url":
            url = part["image_url"]["url"]
            assert url.startswith("data:image/png;base64,")
            found.append(base64.b64decode(url.split(",", 1)[1]))
    return found


def _text(body: dict[str, Any]) -> str:
    return "\n".join(p["text"] for p in _parts(body) if p["type"] == "text")


@asynccontextmanager
async def vision_bot(policy: AttachmentPolicy, *, private_cdn_allowed: bool = True
                     ) -> AsyncIterator[Vision]:
    async with ReplayServer([Send(ANSWER)]) as model, aiohttp.ClientSession() as session:
        fetcher = MediaFetcher(allow_private=private_cdn_allowed)  # the CDN is on loopback
        config = ProviderConfig(kind="openai", model="vision-model", base_url=model.url + "/v1")
        try:
            async with bot_on_gateway(
                    [], None, attempts=[Attempt(build_provider(config, session), "openai:vision")],
                    attachments=AttachmentReader(fetcher, policy)) as h:
                yield Vision(h, model)
        finally:
            await fetcher.aclose()


async def test_an_attached_image_reaches_a_vision_model_as_an_image_part() -> None:
    # covers O6 (and R7's image part shape on the wire)
    image = _png()
    async with vision_bot(AttachmentPolicy(vision=True)) as v:
        upload = v.emu.add_attachment("square.png", "image/png", image)
        await v.say("what is this?", attachments=(upload,))
        body = await v.answered()
    assert _images(body) == [image]
    assert "square.png" in _text(body)


@pytest.mark.parametrize("history", [20, 1], ids=["in-history", "beyond-history"])
async def test_images_of_the_message_replied_to_are_shown_too(history: int) -> None:
    # covers O6: the image is in the message being replied to, also when that
    # message is older than the history the model sees
    first, second = _png("red"), _png("blue")
    async with vision_bot(AttachmentPolicy(vision=True)) as v:
        v.bot.history = HistoryPolicy(max_messages=history)
        original = await v.say("look", attachments=(
            v.emu.add_attachment("red.png", "image/png", first),), mention=False)
        await v.say("and this one?", reply_to=int(original["id"]), attachments=(
            v.emu.add_attachment("blue.png", "image/png", second),))
        body = await v.answered()
    assert _images(body) == [second, first]  # the message answered first


async def test_without_vision_the_model_gets_the_placeholder_only() -> None:
    # covers O6: a model configured without vision
    async with vision_bot(AttachmentPolicy(vision=False)) as v:
        await v.say("what is this?", attachments=(
            v.emu.add_attachment("square.png", "image/png", _png()),))
        body = await v.answered()
        cdn_reads = [r for r in v.emu.requests if r.route.startswith("GET /cdn/")]
    assert _images(body) == [] and cdn_reads == []
    assert placeholder("square.png").search(_text(body))


async def test_text_files_are_inlined_within_their_budget() -> None:
    # covers O6: text attachments inlined, cut at max_text_chars
    async with vision_bot(AttachmentPolicy(vision=False, max_text_chars=40)) as v:
        await v.say("read this", attachments=(
            v.emu.add_attachment("notes.txt", "text/plain; charset=utf-8",
                                 b"first line\n" + b"x" * 500),))
        body = await v.answered()
    text = _text(body)
    assert re.search(r"<file \"notes\.txt\">\n(> )?first line\n", text), text
    assert "x" * 40 not in text


async def test_an_image_over_the_size_limit_is_not_sent() -> None:
    # covers O6: the fetcher's size check applies to uploads
    big = _png(side=600)
    async with vision_bot(AttachmentPolicy(vision=True, max_image_bytes=1024)) as v:
        await v.say("huge", attachments=(v.emu.add_attachment("big.png", "image/png", big),))
        body = await v.answered()
    assert len(big) > 1024 and _images(body) == []
    assert placeholder("big.png").search(_text(body))


async def test_an_upload_at_a_private_address_is_refused_before_any_connect() -> None:
    # covers O6: the address check of the fetcher (no request leaves)
    async with vision_bot(AttachmentPolicy(vision=True), private_cdn_allowed=False) as v:
        upload = v.emu.add_attachment("square.png", "image/png", _png())
        await v.say("what is this?", attachments=(upload,))
        body = await v.answered()
        cdn_reads = [r for r in v.emu.requests if r.route.startswith("GET /cdn/")]
    assert upload["url"].startswith("http://127.0.0.1:")
    assert cdn_reads == [] and _images(body) == []
    assert placeholder("square.png").search(_text(body))  # the upload did reach the bot
