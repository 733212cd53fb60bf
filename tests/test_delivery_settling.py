"""Delivery when sends wait (SPEC D1, D2, D50, S10): a pass's last messages held by a
429 get no typing before them, a superseded attempt's cleanup or a closed channel
never waits on messages it dropped, a notice cut off by the close is told why, and a pause
late in a turn sends what is complete after the idle wait, not later."""

from __future__ import annotations

import asyncio

import pytest

from discord_io.delivery import DeliveryError, DiscordChannel
from discord_io.testing import DiscordEmulator, Fault, emulated_discord
from discord_io.typing_indicator import TypingIndicator
from fsm.engine.channel import Notice

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

TYPING = "POST /channels/{channel_id}/typing"
SEND = "POST /channels/{channel_id}/messages"


def _typing_times(emu: DiscordEmulator, since: float) -> list[float]:
    return [round(r.at - since, 3) for r in emu.requests_to(TYPING)]


async def test_a_last_message_cut_at_the_pass_end_waits_out_a_429_untyped(
    looptime: float,
) -> None:
    # covers D50: the pass's last message is only cut when the pass ends and then waits out
    # a 429 for seconds; nothing is typed before it
    async with emulated_discord() as (emu, client):
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        channel = DiscordChannel(client, emu.channel_id, typing=typing, idle_flush_s=None,
                                 flush_paragraphs=True)
        start = float(looptime)
        await channel.deliver("First.\n\n")
        await asyncio.sleep(0.5)
        emu.inject(SEND, Fault.rate_limited(3.0))
        await channel.deliver("The last words.")
        await channel.finish_pass()
        await typing.stop()  # the turn ends
        last = emu.sent()[-1]
        assert last.json["content"] == "The last words."
        assert round(last.at - start, 3) == 3.5  # it waited out the 429
        assert _typing_times(emu, start) == [0.0]


async def test_a_next_pass_whose_only_message_waits_out_a_429_types_after_it(
    looptime: float,
) -> None:
    # covers D50: after a tool call, the next pass's one message was queued while it streamed
    # and still waits out a 429 when the pass ends: nothing is typed before it, and the
    # indicator comes back 2 s after it while the turn goes on
    async with emulated_discord() as (emu, client):
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        channel = DiscordChannel(client, emu.channel_id, typing=typing, idle_flush_s=None,
                                 flush_paragraphs=True)
        start = float(looptime)
        typing.start()  # the turn starts
        await asyncio.sleep(1.0)  # the first token
        await channel.deliver("Let me look that up.")
        await channel.finish_pass()  # a tool call follows
        await asyncio.sleep(0.5)
        emu.inject(SEND, Fault.rate_limited(3.0))
        await channel.deliver("The answer.\n\n")
        await channel.finish_pass()
        answer = emu.sent()[-1]
        assert answer.json["content"] == "The answer."
        assert round(answer.at - start, 3) == 4.5
        await asyncio.sleep(5.0)  # the turn goes on (another tool call)
        await typing.stop()
        assert _typing_times(emu, start) == [0.0, 6.5]


async def test_cleanup_behind_a_429_deletes_what_landed_and_returns(looptime: float) -> None:
    # covers D2, S10: an attempt superseded while its messages queue behind a send waiting
    # out a 429: the queued ones (and a notice behind them) are dropped, the one on the wire
    # lands and is deleted with the first, and nothing waits for what was dropped
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None,
                                 flush_paragraphs=True)
        await channel.deliver("One.\n\n")
        await emu.wait_for(lambda r: r.route == SEND)
        emu.inject(SEND, Fault.rate_limited(3.0))
        for word in ("Two", "Three", "Four"):
            await channel.deliver(f"{word}.\n\n")
        notice = asyncio.create_task(channel.post_notice(Notice.of("still_working")))
        await asyncio.sleep(1.0)  # "Two." waits out the 429, the rest behind it
        async with asyncio.timeout(60.0):
            deleted = await channel.cleanup()
            await notice  # dropped: told nothing, raises nothing
        assert deleted == 2
        assert [r.json["content"] for r in emu.sent()] == ["One.", "Two."]
        assert emu.channel_messages() == []
        assert channel.notices == []


async def test_a_notice_cut_off_by_the_close_is_told_its_delivery_was_cancelled(
    looptime: float,
) -> None:
    # covers S10, D2: the turn closes its channel while a notice's send hangs; after the
    # grace the send is cancelled and the notice's caller learns why
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.delay(60.0))
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None, close_grace_s=5.0)
        notice = asyncio.create_task(channel.post_notice(Notice.of("timeout_idle")))
        await emu.wait_for(lambda r: r.route == SEND, answered=False)
        start = float(looptime)
        await channel.aclose()
        assert round(float(looptime) - start, 3) == 5.0
        with pytest.raises(DeliveryError) as raised:
            await notice
        assert str(raised.value) == "delivery cancelled"
        assert channel.notices == []


async def test_a_pause_late_in_a_turn_sends_what_is_complete_after_the_idle_wait(
    looptime: float,
) -> None:
    # covers D1: text that comes 30 s into the turn and then pauses has its complete
    # paragraphs sent 5 s after it, the unfinished one kept back
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=5.0)
        await asyncio.sleep(30.0)  # the model thinks
        start = float(looptime)
        await channel.deliver("The first thought is complete.\n\nThe second is still co")
        [sent] = await emu.wait_for(lambda r: r.route == SEND)
        assert round(sent.at - start, 3) == 5.0
        assert sent.json["content"] == "The first thought is complete."
        await channel.deliver("ming.")
        await channel.finish_pass()
        assert emu.sent()[-1].json["content"] == "The second is still coming."
