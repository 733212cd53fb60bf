"""What a /kill reaches (A7, D3): the bot as production starts it, /kill arriving as an
INTERACTION_CREATE on the emulated gateway with the member's channel permissions
(Discord's docs: Interactions > Receiving and Responding, `member.permissions`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from gateway_support import Harness, bot_on_gateway

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

MANAGE_MESSAGES = 1 << 13


def _story(count: int) -> list[list[dict[str, Any]]]:
    """Each turn streams a line, then stalls until it is stopped."""
    return [[{"at": 1, "text": f"Story {n}.\n\n"}, {"at": 3, "stall": True}]
            for n in range(count)]


def _answered(passes: int) -> list[list[dict[str, Any]]]:
    """The first turn stalls; the ones after it answer."""
    return _story(1) + [[{"at": 1, "text": f"Answer {n}."}, {"at": 2, "end": "completed"}]
                        for n in range(passes)]


async def _three_in_line(h: Harness, *others: int) -> None:
    """Alice's story streams; a question of each of `others` waits behind it."""
    await h.say("tell me a story")
    await asyncio.sleep(2)
    for user in others:
        await h.say("a question", author=user)
    await h.queued(h.emu.channel_id, 1 + len(others))


async def test_the_requesters_kill_stops_their_reply_and_no_one_elses_question() -> None:
    # covers A7: alice stops the reply to her message; bob's and carol's queued questions
    # are answered after it (issue 22 item 9: "Dropped 2 queued messages")
    async with bot_on_gateway(_answered(2), None) as h:
        carol = h.user("carol")
        await _three_in_line(h, h.bob, carol)
        answer = await h.kill_answer(user=h.emu.alice_id)
        assert answer == "Stopping the reply in this channel."
        await h.idle()
        assert [r.status for r in h.bot.results] == ["stopped_by_user", "completed",
                                                     "completed"]
        assert h.provider.calls == 3


async def test_a_kill_by_someone_else_drops_only_their_own_queued_message() -> None:
    # covers A7: bob, without Manage Messages, may withdraw his own queued question; the
    # running reply and carol's question are not his to stop
    async with bot_on_gateway(_answered(1), None) as h:
        carol = h.user("carol")
        await _three_in_line(h, h.bob, carol)
        answer = await h.kill_answer(user=h.bob)
        assert answer == ("The reply running here answers someone else, so it goes on. "
                          "Dropped your queued message.")
        assert [m.author.id for m in h.bot.queue.pending(str(h.emu.channel_id))] == [carol]
        refused = await h.kill_answer(user=h.bob)  # nothing of his is left
        assert "Only the person" in refused
        assert await h.kill_answer(user=h.emu.alice_id) == "Stopping the reply in this channel."
        await h.idle()
        assert [r.status for r in h.bot.results] == ["stopped_by_user", "completed"]


async def test_a_moderators_kill_still_clears_the_whole_queue() -> None:
    # covers A7, D3: Manage Messages in the channel reaches every reply and queued message
    async with bot_on_gateway(_answered(2), None) as h:
        mod = h.user("mod")
        await _three_in_line(h, h.bob, h.user("carol"))
        answer = await h.kill_answer(user=mod, permissions=MANAGE_MESSAGES)
        assert answer == "Stopping the reply in this channel. Dropped 2 queued messages."
        await h.idle()
        assert [r.status for r in h.bot.results] == ["stopped_by_user"]
