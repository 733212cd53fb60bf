"""Links in what the bot posts (A6): model text goes out with link previews suppressed (the
SUPPRESS_EMBEDS message flag, 1 << 2; Discord's docs: Resources > Message > Message Flags)
unless the operator turns previews on, and a masked link shows its real target. Through the
bot as production starts it, the emulated gateway and REST; the unmasking fuzzed with
Hypothesis."""

from __future__ import annotations

import re
from typing import Any

import pytest
from gateway_support import SEND, Harness, bot_on_gateway
from hypothesis import example, given
from hypothesis import strategies as st

from discord_io.links import CODE, LEFTOVER, MASKED_LINK, unmask_links
from discord_io.splitting import discord_length
from fsm.engine.config import TurnConfig

SUPPRESS_EMBEDS = 1 << 2
BAIT = "Log in here: [discord.com/settings](https://evil.example/steal) to claim it."


def _says(text: str) -> list[list[dict[str, Any]]]:
    return [[{"at": 1, "text": text}, {"at": 2, "end": "completed"}]]


def _posts(h: Harness) -> list[dict[str, Any]]:
    return [r.json for r in h.emu.requests_to(SEND, status=200) if isinstance(r.json, dict)]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_replies_go_out_without_link_previews_and_with_masked_links_unmasked() -> None:
    # covers A6 (issue 22 item 8: replies unfurled the model's links; masked links went
    # out verbatim)
    async with bot_on_gateway(_says(BAIT + " More at https://example.com/page"), None) as h:
        await h.mention("how do I get nitro?")
        await h.idle()
        [post] = _posts(h)
        assert post["flags"] & SUPPRESS_EMBEDS
        assert post["content"] == ("Log in here: discord.com/settings "
                                   "(https://evil.example/steal) to claim it. "
                                   "More at https://example.com/page")
        [stored] = h.emu.channel_messages()[-1:]
        assert stored["flags"] & SUPPRESS_EMBEDS


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_an_operator_may_turn_previews_on_but_masks_still_come_off() -> None:
    # covers A6: `link_previews` (TURN_LINK_PREVIEWS) lets previews through
    async with bot_on_gateway(_says(BAIT), None, link_previews=True) as h:
        await h.mention("how do I get nitro?")
        await h.idle()
        [post] = _posts(h)
        assert not post.get("flags", 0) & SUPPRESS_EMBEDS
        assert "(https://evil.example/steal)" in post["content"]
        assert "[discord.com/settings]" not in post["content"]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_the_bots_own_notice_embeds_are_not_suppressed() -> None:
    # covers A6: only model text loses its previews; a notice is an embed of the bot's own
    stalled = [[{"at": 1, "text": "Thinking"}, {"at": 50, "stall": True}]]
    config = TurnConfig(idle_timeout_s=10.0, first_token_timeout_s=10.0)
    async with bot_on_gateway(stalled, None, config=config) as h:
        await h.mention("hello")
        await h.idle()
        notices = [p for p in _posts(h) if p.get("embeds")]
        assert notices and all(not p.get("flags", 0) & SUPPRESS_EMBEDS for p in notices)


def _outside_code(text: str) -> str:
    return CODE.sub("", text)


LINKISH = st.text(alphabet=st.sampled_from(list("[]()<>`\"' \nab:/.\\")), max_size=60)


@given(st.lists(st.one_of(LINKISH, st.text(max_size=20)), max_size=6).map("".join))
@example("[a](u \"`\") [x](y) `")
@example("[[a](https://x)](https://y)")
@example("`` [a](b) `` [c](<d>)")
def test_no_masked_link_survives_and_nothing_grows(text: str) -> None:
    # covers A6: whatever the model writes, no `](` is left outside code, so Discord can
    # render no masked link, and the text never gets longer (a cut message stays within
    # 2,000 characters)
    shown = unmask_links(text)
    assert LEFTOVER not in _outside_code(shown)
    assert discord_length(shown) <= discord_length(text)
    assert unmask_links(shown) == shown


@given(label=st.text(alphabet=st.characters(blacklist_characters="[]()`\\\n"), min_size=1,
                     max_size=30).filter(str.strip),
       target=st.from_regex(r"https://[a-z]{1,12}\.example/[a-z0-9/_-]{0,20}", fullmatch=True))
def test_every_masked_link_shows_its_target(label: str, target: str) -> None:
    # covers A6: the real target is in the text, right after the label
    text = f"before [{label}]({target}) after"
    assert MASKED_LINK.search(text)
    shown = unmask_links(text)
    assert target in shown
    assert re.search(re.escape(label.strip()) + r" \(" + re.escape(target) + r"\)", shown) or (
        label.strip() == target)
