"""The typing indicator in virtual time: refresh schedule, single owner, stop rules (D1);
posted once per stretch of work, not between a stream's messages (D50)."""

from __future__ import annotations

import asyncio

import pytest

from discord_io.delivery import DiscordChannel
from discord_io.testing import DiscordEmulator, Fault, emulated_discord
from discord_io.typing_indicator import TypingIndicator

TYPING = "POST /channels/{channel_id}/typing"
SEND = "POST /channels/{channel_id}/messages"


def _typing_times(emu: DiscordEmulator, since: float) -> list[float]:
    return [round(r.at - since, 3) for r in emu.requests_to(TYPING)]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_typing_refreshes_every_8_seconds_while_working_and_stops(looptime: float) -> None:
    # covers D1 (the channel shows the bot is working while a reply is produced)
    async with emulated_discord() as (emu, client):
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        start = float(looptime)
        typing.start()
        await asyncio.sleep(20.0)  # the turn works
        await typing.stop()
        await asyncio.sleep(60.0)

        assert _typing_times(emu, start) == [0.0, 8.0, 16.0]
        assert typing.posts == 3
        await typing.stop()  # stopping twice is harmless
        assert not typing.running


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_start_while_running_keeps_one_refresher(looptime: float) -> None:
    # covers D1
    async with emulated_discord() as (emu, client):
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        start = float(looptime)
        async with typing:
            typing.start()
            typing.start()
            await asyncio.sleep(9.0)
        assert _typing_times(emu, start) == [0.0, 8.0]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_typing_failures_never_reach_the_turn(looptime: float) -> None:
    # covers D1
    async with emulated_discord() as (emu, client):
        emu.inject(TYPING, Fault.forbidden())
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        start = float(looptime)
        typing.start()
        await asyncio.sleep(10.0)
        assert typing.running
        await typing.stop()
        assert [r.status for r in emu.requests_to(TYPING)] == [403, 204]
        assert _typing_times(emu, start) == [0.0, 8.0]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_typing_stops_before_the_last_message_and_with_the_turn(looptime: float) -> None:
    # covers D1
    async with emulated_discord() as (emu, client):
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        channel = DiscordChannel(
            client, emu.channel_id, typing=typing, idle_flush_s=None, flush_paragraphs=True
        )
        start = float(looptime)
        await channel.deliver("Thinking out loud.\n\n")  # starts typing, sends a message
        await asyncio.sleep(10.0)
        await channel.deliver("The final answer.")
        await channel.finish_pass()
        final = emu.sent()[-1]
        assert final.json["content"] == "The final answer."
        # a mid-reply message hides the indicator; the turn then stays silent for 10 s, so it
        # is posted again once the silence has lasted `retype_after_s` (D50)
        first_send = emu.sent()[0].at - start
        times = _typing_times(emu, start)
        assert times[0] == 0.0
        assert round(first_send + typing.retype_after_s, 3) in times[1:]
        # nothing after the final message while the turn wraps up
        assert all(r.at <= final.at for r in emu.requests_to(TYPING))
        await typing.stop()  # the turn's owner ends it
        await asyncio.sleep(30.0)
        assert all(r.at <= final.at for r in emu.requests_to(TYPING))


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_typing_resumes_when_the_turn_goes_on_after_a_pass(looptime: float) -> None:
    # covers D1
    async with emulated_discord() as (emu, client):
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        channel = DiscordChannel(
            client, emu.channel_id, typing=typing, idle_flush_s=None, typing_resume_s=2.0
        )
        await channel.deliver("Let me look that up.")
        await channel.finish_pass()
        sent_at = emu.sent()[-1].at
        await asyncio.sleep(5.0)  # a tool runs
        assert [round(r.at - sent_at, 3) for r in emu.requests_to(TYPING) if r.at > sent_at] == [
            2.0
        ]
        await typing.stop()


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_pass_with_no_text_leaves_typing_running() -> None:
    # covers D1
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.forbidden())  # would fail loudly if anything were sent
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        channel = DiscordChannel(client, emu.channel_id, typing=typing, idle_flush_s=None)
        typing.start()
        await channel.finish_pass()  # a pass that only asked for a tool
        assert typing.running
        await typing.stop()


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_streamed_reply_of_seven_messages_types_once(looptime: float) -> None:
    # covers D50 (typing between messages a few hundred milliseconds apart is wasted; the
    # last two wait for the channel's bucket after the pass ended: nothing is typed then)
    async with emulated_discord() as (emu, client):
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        channel = DiscordChannel(client, emu.channel_id, typing=typing, idle_flush_s=None,
                                 flush_paragraphs=True)
        for number in range(7):
            await channel.deliver(f"Paragraph {number}.\n\n")
            await asyncio.sleep(0.3)
        await channel.finish_pass()
        await typing.stop()
        assert len(emu.sent()) == 7
        assert len(emu.requests_to(TYPING)) == 1


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_typing_comes_back_when_the_next_send_is_seconds_away(looptime: float) -> None:
    # covers D50 (a pause in the stream: a slow model, a rate-limit wait)
    async with emulated_discord() as (emu, client):
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        channel = DiscordChannel(client, emu.channel_id, typing=typing, idle_flush_s=None,
                                 flush_paragraphs=True)
        start = float(looptime)
        await channel.deliver("First.\n\n")
        await asyncio.sleep(1.5)  # shorter than retype_after_s: no post
        await channel.deliver("Second.\n\n")
        await asyncio.sleep(12.0)  # the model pauses
        await channel.deliver("Third.")
        await channel.finish_pass()
        await typing.stop()
        second = emu.sent()[1].at - start
        assert _typing_times(emu, start) == [0.0, round(second + 2.0, 3),
                                             round(second + 2.0 + typing.interval_s, 3)]
