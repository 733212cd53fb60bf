"""The history budgets hold on the request as the model reads it (A5): after text files are
inlined, with the quoting every line gets, the message answered counted first and cut to
fit, the message it replies to counted too. The bot runs as production starts it (the
sharded client through the emulated gateway, uploads served by the emulated CDN), with a
scripted model whose requests are rendered by the providers' own code."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from gateway_support import Harness, bot_on_gateway

from discord_io.attachments import AttachmentPolicy, AttachmentReader
from discord_io.history import HistoryPolicy
from discord_io.media_fetch import MediaFetcher
from providers.context import normalize_items

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

BUDGET = HistoryPolicy(max_messages=20, max_chars=24_000, max_message_chars=4_000)
ANSWER = [[{"at": 1, "text": "ok"}, {"at": 2, "end": "completed"}]]


def _dialogue(h: Harness) -> list[str]:
    """The dialogue lines of the model's first request, as the providers render them."""
    items = [item for item in h.provider.requests[0].context_items
             if item.get("type") == "dialogue"]
    return [message.text for message in normalize_items(items)]


@asynccontextmanager
async def _bot(history: HistoryPolicy = BUDGET) -> AsyncIterator[Harness]:
    fetcher = MediaFetcher(allow_private=True)  # the CDN is on loopback
    try:
        async with bot_on_gateway(ANSWER, None, history=history, attachments=AttachmentReader(
                fetcher, AttachmentPolicy(max_text_chars=8_000))) as h:
            yield h
    finally:
        await fetcher.aclose()


def _uploads(h: Harness, count: int, body: bytes) -> tuple[dict[str, Any], ...]:
    return tuple(h.emu.add_attachment(f"part{n}.txt", "text/plain", body)
                 for n in range(count))


async def test_ten_text_uploads_stay_within_the_message_and_history_budgets() -> None:
    # covers A5: the per-message cap and the history budget apply after the files are
    # inlined (issue 22 item 7: 80,750 characters went past 24,000 and 4,000)
    async with _bot() as h:
        for n in range(15):
            await h.say(f"earlier message {n} " + "y" * 1500, mention=False)
        await h.say("read these", attachments=_uploads(h, 10, b"x" * 8_000))
        await h.idle()
        lines = _dialogue(h)
        assert sum(map(len, lines)) <= BUDGET.max_chars
        assert all(len(line) <= BUDGET.max_message_chars for line in lines)
        trigger = lines[-1]
        assert "read these" in trigger and '<file "part0.txt">' in trigger
        assert trigger.count("<file ") == trigger.count("</file>")  # every block closed


async def test_the_message_answered_is_cut_to_fit_the_history_budget() -> None:
    # covers A5: the trigger counts against the budget like any message, first, and is cut
    # to what is left rather than kept whatever it costs
    small = HistoryPolicy(max_messages=20, max_chars=3_000, max_message_chars=4_000)
    async with _bot(small) as h:
        await h.say("earlier", mention=False)
        await h.say("long question", attachments=_uploads(h, 2, b"x" * 8_000))
        await h.idle()
        lines = _dialogue(h)
        assert sum(map(len, lines)) <= small.max_chars
        assert "long question" in lines[-1]


async def test_quoting_counts_a_file_of_short_lines_is_not_three_times_its_size() -> None:
    # covers A5: the budget measures the rendered item, where each line of a multi-line
    # message gets its `> ` quote
    async with _bot() as h:
        await h.say("lines", attachments=_uploads(h, 1, b"a\n" * 4_000))
        await h.idle()
        [line] = _dialogue(h)
        assert len(line) <= BUDGET.max_message_chars


async def test_the_message_replied_to_counts_against_the_budget_too() -> None:
    # covers A5: the parent from beyond the history window, with its files, is inside the
    # budget (issue 22 item 7: it could add as much again)
    window = HistoryPolicy(max_messages=2, max_chars=6_000, max_message_chars=4_000)
    async with _bot(window) as h:
        parent = await h.say("see my files", mention=False,
                             attachments=_uploads(h, 10, b"p" * 8_000))
        for n in range(4):
            await h.say(f"chatter {n}", author=h.bob, mention=False)
        await h.say("what do they say?", reply_to=int(parent["id"]),
                    attachments=_uploads(h, 10, b"t" * 8_000))
        await h.idle()
        lines = _dialogue(h)
        assert sum(map(len, lines)) <= window.max_chars
        assert "see my files" in lines[0] and "what do they say?" in lines[-1]
