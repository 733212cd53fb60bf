"""The bot end to end: the production client started with `client.start()` through the
loopback Discord emulator's gateway, the real engine, a scripted model (SPEC D1-D4, S2, S7,
R3, R7, R8). Messages and /kill arrive as gateway dispatches. Virtual time.

Follow-up interrupts (S17) and 429 retries (D2) are in test_discord_gateway_bot.py."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest
from gateway_support import CALLBACK, PARAGRAPH, SEND, bot_on_gateway
from PIL import Image

from discord_io.testing import CdnFile
from fsm.engine.config import TurnConfig
from fsm.review.replay import replay_on_loop
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import read_journal

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

TYPING = "POST /channels/{channel_id}/typing"
AVATAR_HASH = "0123456789abcdef0123456789abcdef"


async def test_mention_streams_a_reply_in_several_messages(tmp_path: Path) -> None:
    # covers D1, S2, D2 (every delivered message recorded), typing with one owner
    text = "\n\n".join(PARAGRAPH.strip() for _ in range(3))
    chunks = [{"at": 0.1 * (i + 1), "text": text[i * 100:(i + 1) * 100]}
              for i in range(len(text) // 100 + 1)]
    async with bot_on_gateway([[*chunks, {"at": 5, "end": "completed"}]], tmp_path) as h:
        trigger = await h.mention("tell me a story")
        await h.idle()
        sent = h.bot_messages()
        assert len(sent) >= 2 and all(len(m["content"]) <= 2000 for m in sent)
        assert "".join(m["content"] for m in sent).replace("\n", "") == text.replace("\n", "")
        assert str(sent[0]["message_reference"]["message_id"]) == trigger["id"]
        assert all("message_reference" not in m for m in sent[1:])
        assert all(m["allowed_mentions"]["parse"] == [] for m in sent)
        last_send = h.emu.requests_to(SEND, status=200)[-1]
        typings = h.emu.requests_to(TYPING)
        assert typings and typings[-1].at <= last_send.at
        [result] = h.bot.results
        assert result.status == "completed"
        journals = sorted(tmp_path.glob("*.json"))
        assert len(journals) == 1
        journal = read_journal(journals[0])
        assert journal["origin"] == {"channel_id": str(h.emu.channel_id),
                                     "message_id": trigger["id"]}  # no worker in one process
        assert await replay_on_loop(journal, "bot journal") is None


async def test_second_message_is_queued_and_answered_after(tmp_path: Path) -> None:
    # covers D4
    passes = [[{"at": 1, "text": "first answer"}, {"at": 30, "end": "completed"}],
              [{"at": 1, "text": "second answer"}, {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(passes, tmp_path) as h:
        await h.mention("one")
        await asyncio.sleep(5)
        await h.mention("two", author=h.bob)
        await asyncio.sleep(1)
        assert h.bot.queue.pending(str(h.emu.channel_id))
        await h.idle()
        contents = [m["content"] for m in h.bot_messages()]
        assert contents == ["first answer", "second answer"]
        assert len(h.bot.locks) == 0


async def test_the_bot_keeps_only_its_recent_results(tmp_path: Path) -> None:
    # covers the bot's memory over weeks of turns: results are kept for a look, bounded
    passes = [[{"at": 1, "text": f"answer {n}"}, {"at": 2, "end": "completed"}]
              for n in range(3)]
    async with bot_on_gateway(passes, tmp_path, recent_results=2) as h:
        for n in range(3):
            await h.mention(f"question {n}")
            await h.idle()
        assert [r.text for r in h.bot.results] == ["answer 1", "answer 2"]


async def test_kill_mid_stream_keeps_delivered_text_and_empties_the_queue(
        tmp_path: Path) -> None:
    # covers D3, S7, D4 (lock released), typing stopped
    passes = [[{"at": 1, "text": "Once upon a time.\n\n"}, {"at": 2, "text": "The end"},
               {"at": 3, "stall": True}]]
    async with bot_on_gateway(passes, tmp_path) as h:
        await h.mention("story")
        await asyncio.sleep(2.5)
        await h.mention("and me", author=h.bob)
        assert h.bot.queue.pending(str(h.emu.channel_id))
        await asyncio.sleep(7.5)  # the idle flush has sent the finished paragraph
        await h.kill(permissions=1 << 13)  # Manage Messages: bob's question goes too (A7)
        (answer,) = await h.emu.wait_for(lambda r: r.route == CALLBACK)
        assert answer.json["data"]["flags"] == 64
        await h.idle()
        [result] = h.bot.results
        assert result.status == "stopped_by_user"
        assert "Once upon a time." in "".join(m["content"] for m in h.bot_messages())
        assert not h.bot.queue.pending(str(h.emu.channel_id))
        typing_after = [r for r in h.emu.requests_to(TYPING) if r.at > answer.at]
        assert typing_after == [] and len(h.bot.locks) == 0
        assert h.provider.calls == 1  # the queued message was dropped, not answered


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), "teal").save(out, format="PNG")
    return out.getvalue()


async def test_profile_picture_tool_restarts_the_turn_with_the_image(tmp_path: Path) -> None:
    # covers R3, R7, R8 with the real tool, download and stash
    passes: list[list[dict[str, Any]]] = [[], [{"at": 1, "text": "Teal square!"},
                                               {"at": 2, "end": "completed"}]]
    async with bot_on_gateway(passes, tmp_path, enrichment_tools=True) as h:
        carol = h.emu.add_user("carol", avatar=AVATAR_HASH)
        h.emu.cdn[f"/avatars/{carol['id']}/{AVATAR_HASH}.png"] = CdnFile("image/png", _png())
        h.provider._passes[0] = parse_scenario({"passes": [[
            {"at": 1, "tool_call": {"name": "peek_profile_picture",
                                    "args": {"user_id": carol["id"]}}}]]}).passes[0]
        await h.mention("what does carol's avatar look like?")
        await h.idle()
        [result] = h.bot.results
        final = result.attempts[0]
        assert final.status == "completed" and final.context_items_added == 1
        assert final.flags["disable_profile_picture_processing"] is True
        second = h.provider.requests[1]
        assert second.context_items[-1]["parts"][0]["type"] == "image"
        assert "peek_profile_picture" not in [t["name"] for t in second.tools]
        assert h.bot.stash.total_bytes == 0


async def test_follow_up_interrupts_are_capped_while_the_channel_stays_busy(
        tmp_path: Path) -> None:
    # covers S17 (per-lock cap across a chain of queued turns)
    long_pass = [{"at": 1, "text": "thinking"}, {"at": 50, "end": "completed"}]
    async with bot_on_gateway([long_pass, long_pass, long_pass], tmp_path,
                       config=TurnConfig(max_follow_up_interrupts=1)) as h:
        await h.mention("first")
        await asyncio.sleep(3)
        await h.mention("second")  # interrupts the first turn
        await asyncio.sleep(3)
        await h.mention("third")  # the cap is spent: queued, not an interrupt
        await h.idle()
        assert [r.status for r in h.bot.results] == [
            "follow_up_interrupt", "completed", "completed"]
