"""How the bot's notices look in Discord and what a reply's messages carry (SPEC T1, S12,
D1, D5, G3): every kind of notice is an embed in its kind's colour within Discord's limits,
messages never mention anyone and never unfurl links unless asked, and only the first
message of a reply answers its trigger. Real discord.py against the emulator."""

from __future__ import annotations

import asyncio
from typing import get_args

import pytest

from discord_io.delivery import DeliveryError, DiscordChannel
from discord_io.testing import Fault, emulated_discord
from discord_io.typing_indicator import TypingIndicator
from fsm.engine.channel import DeliveryCapReached, Notice, NoticeKind

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

ORANGE, BLUE, RED, GREY = 0xE67E22, 0x3498DB, 0xE74C3C, 0x95A5A6
COLOURS: dict[str, int] = {
    "timeout_first_token": ORANGE, "timeout_idle": ORANGE, "delivery_cap": ORANGE,
    "still_working": BLUE, "tool_error_loop": RED, "max_iterations": RED,
    "failed_context_too_long": RED, "failed_unreachable": RED, "failed_rejected_key": RED,
    "failed_rate_limited": RED, "failed_blocked": RED, "failed_empty_reply": RED,
    "failed_other": RED, "answered_by_fallback": GREY,
}
SUPPRESS_EMBEDS = 1 << 2


async def test_every_kind_of_notice_is_an_embed_in_its_colour() -> None:
    # covers T1, S12, G2: a warning is orange, progress blue, a failure red (the notices
    # naming why the last attempt failed too), a note grey; every kind has its colour
    assert set(COLOURS) == set(get_args(NoticeKind))
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None)  # type: ignore[arg-type]
        for kind in get_args(NoticeKind):
            await channel.post_notice(Notice.of(kind))
            embed = emu.sent()[-1].json["embeds"][0]
            assert embed["color"] == COLOURS[kind], kind
            assert embed["title"] == Notice.of(kind).title
        assert len(channel.notices) == len(get_args(NoticeKind)) and channel.delivered == []
        assert all(notice.kind == "notice" for notice in channel.notices)


async def test_a_notice_longer_than_discord_allows_is_cut_to_its_limits() -> None:
    # covers T1: Discord refuses an embed over 256/4096 characters
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None)  # type: ignore[arg-type]
        await channel.post_notice(Notice("still_working", "t" * 300, "d" * 5000))
        embed = emu.sent()[-1].json["embeds"][0]
        assert embed["title"] == "t" * 256 and embed["description"] == "d" * 4096


@pytest.mark.parametrize("previews", [None, False, True])
async def test_links_unfurl_only_when_link_previews_are_on(previews: bool | None) -> None:
    # covers D1 (A6: link previews off by default)
    async with emulated_discord() as (emu, client):
        options = {} if previews is None else {"link_previews": previews}
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None,  # type: ignore[arg-type]
                                 **options)
        await channel.deliver("See https://example.com/page for more.")
        await channel.finish_pass()
        body = emu.sent()[-1].json
        assert bool(body.get("flags", 0) & SUPPRESS_EMBEDS) is not bool(previews)
        assert body["allowed_mentions"]["parse"] == []
        assert [m.kind for m in channel.delivered] == ["text"]


async def test_reactors_the_access_lists_deny_are_not_named() -> None:
    # covers R6 (A1: the model reads no one the access lists deny)
    async with emulated_discord() as (emu, client):
        bob = emu.add_user("bob")
        message = emu.add_message(emu.channel_id, emu.alice_id, "vote!")
        emu.add_reaction(int(message["id"]), "👍", emu.alice_id)
        emu.add_reaction(int(message["id"]), "👍", int(bob["id"]))
        asked: list[list[int]] = []

        async def readable(ids: list[int]) -> set[int]:
            asked.append(ids)
            return {int(bob["id"])}

        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None,  # type: ignore[arg-type]
                                 readable=readable)
        assert await channel.fetch_reactors(message["id"], "👍", 10) == ["bob"]
        assert asked == [[emu.alice_id, int(bob["id"])]]
        assert await channel.fetch_reactors("not-a-message-id", "👍", 10) == []


async def test_only_the_first_message_answers_the_trigger_until_it_is_deleted() -> None:
    # covers S2, G1: a fallback's reply answers the trigger again once the failed
    # attempt's messages are gone
    async with emulated_discord() as (emu, client):
        trigger = emu.add_message(emu.channel_id, emu.alice_id, "hi")
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None,  # type: ignore[arg-type]
                                 reply_to=int(trigger["id"]), limit=64)
        await channel.deliver("first message, long enough to need two of them. " * 2)
        await channel.finish_pass()
        sent = [r.json for r in emu.sent()]
        assert len(sent) == 2
        assert sent[0]["message_reference"]["message_id"] == int(trigger["id"])
        assert "message_reference" not in sent[1]
        assert await channel.cleanup() == 2
        await channel.deliver("the fallback's answer")
        await channel.finish_pass()
        assert emu.sent()[-1].json["message_reference"]["message_id"] == int(trigger["id"])


SEND = "POST /channels/{channel_id}/messages"


async def test_a_refused_reply_is_sent_plain_and_the_turn_replies_no_more() -> None:
    # covers S2 (D7: without READ_MESSAGE_HISTORY Discord refuses only the reference)
    async with emulated_discord() as (emu, client):
        trigger = emu.add_message(emu.channel_id, emu.alice_id, "hi")
        emu.inject(SEND, Fault.forbidden(160002))
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None,  # type: ignore[arg-type]
                                 reply_to=int(trigger["id"]))
        await channel.deliver("an answer")
        await channel.finish_pass()
        await channel.post_notice(Notice.of("still_working"))
        tried = [r.json for r in emu.requests_to(SEND)]
        assert [m.content for m in channel.delivered] == ["an answer"]
        assert "message_reference" in tried[0] and len(tried) == 3
        assert all("message_reference" not in body for body in tried[1:])


async def test_a_send_refused_for_another_reason_is_not_retried_plain() -> None:
    # covers D2: Missing Permissions is the channel's answer, not the reply's
    async with emulated_discord() as (emu, client):
        trigger = emu.add_message(emu.channel_id, emu.alice_id, "hi")
        emu.inject(SEND, Fault.forbidden())
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None,  # type: ignore[arg-type]
                                 reply_to=int(trigger["id"]))
        await channel.deliver("an answer")
        with pytest.raises(DeliveryError, match=r"^could not send a message to channel "):
            await channel.finish_pass()
        assert len(emu.requests_to(SEND)) == 1 and channel.delivered == []


async def test_by_default_a_paused_stream_sends_its_paragraphs_after_five_seconds() -> None:
    # covers D1: paragraphs go out when the stream pauses, not while it flows
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id)  # type: ignore[arg-type]
        await channel.deliver("First paragraph.\n\nSecond paragraph.\n\nstill typ")
        await asyncio.sleep(4.9)
        assert emu.sent() == []
        await asyncio.sleep(0.2)
        assert [r.json["content"] for r in emu.sent()] == [
            "First paragraph.\n\nSecond paragraph."]
        await channel.deliver("ing.")
        await channel.finish_pass()
        assert emu.sent()[-1].json["content"] == "still typing."
        await channel.aclose()


async def test_at_most_a_hundred_reactors_are_asked_for() -> None:
    # covers R6: Discord's page size
    async with emulated_discord() as (emu, client):
        message = emu.add_message(emu.channel_id, emu.alice_id, "vote!")
        emu.add_reaction(int(message["id"]), "👍", emu.alice_id)
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None)  # type: ignore[arg-type]
        assert await channel.fetch_reactors(message["id"], "👍", 500) == ["Alice"]
        assert emu.requests[-1].query["limit"] == "100"
        assert await channel.fetch_reactors(message["id"], "👍", 0) == ["Alice"]
        assert emu.requests[-1].query["limit"] == "1"


@pytest.mark.parametrize("previews", [False, True])
async def test_the_thought_log_unfurls_links_only_with_link_previews(previews: bool) -> None:
    # covers T8 (A6)
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None,  # type: ignore[arg-type]
                                 link_previews=previews)
        await channel.post_thoughts(str(emu.channel_id), "ana", "looked at https://example.com")
        body = emu.sent()[-1].json
        assert body["content"] == "**Thoughts of ana:** looked at https://example.com"
        assert bool(body.get("flags", 0) & SUPPRESS_EMBEDS) is not previews
        assert body["allowed_mentions"]["parse"] == []


async def test_by_default_paragraphs_that_fit_one_message_arrive_as_one() -> None:
    # covers D1: paragraphs are a place to cut, not a reason to
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None)  # type: ignore[arg-type]
        await channel.deliver("First.\n\n")
        await channel.deliver("Second.\n\nThird.")
        await channel.finish_pass()
        assert [r.json["content"] for r in emu.sent()] == ["First.\n\nSecond.\n\nThird."]


async def test_a_clean_up_that_leaves_a_notice_keeps_the_reply_answered() -> None:
    # covers S2, G1: the notice still answers the trigger, so the next text does not again
    async with emulated_discord() as (emu, client):
        trigger = emu.add_message(emu.channel_id, emu.alice_id, "hi")
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None,  # type: ignore[arg-type]
                                 reply_to=int(trigger["id"]))
        await channel.post_notice(Notice.of("still_working"))
        await channel.deliver("a first try")
        await channel.finish_pass()
        assert await channel.cleanup() == 1
        await channel.deliver("the answer")
        await channel.finish_pass()
        assert "message_reference" not in emu.sent()[-1].json


async def test_the_message_bound_is_logged_once_however_much_text_is_dropped(
        caplog: pytest.LogCaptureFixture) -> None:
    # covers D5
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None,  # type: ignore[arg-type]
                                 limit=64, max_messages=1)
        with pytest.raises(DeliveryCapReached):
            await channel.deliver("word " * 100)
        with pytest.raises(DeliveryCapReached):
            await channel.finish_pass()
        assert len(emu.sent()) == 1
        assert len([r for r in caplog.records if "reached its bound" in r.getMessage()]) == 1


@pytest.mark.parametrize(("takes_s", "lands"), [(4.5, True), (5.5, False)])
async def test_closing_gives_a_send_in_flight_five_seconds_to_land(takes_s: float,
                                                                   lands: bool) -> None:
    # covers S10: a send on the wire may still land, within the close grace
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.delay(takes_s))
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None)  # type: ignore[arg-type]
        await channel.deliver("on its way")
        finishing = asyncio.create_task(channel.finish_pass())  # the send goes on the wire
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        closing_at = loop.time()
        await channel.aclose()
        closed_after = loop.time() - closing_at
        await asyncio.wait({finishing})
        assert bool(channel.delivered) is lands
        # virtual times, equal up to looptime's 1 µs tick
        assert closed_after == pytest.approx(takes_s - 0.1 if lands else 5.0, abs=2e-6)


TYPING = "POST /channels/{channel_id}/typing"


async def test_by_default_typing_resumes_two_seconds_after_a_pass_that_sent_text() -> None:
    # covers D1: the turn may go on (a tool); the channel shows it is still working
    async with emulated_discord() as (emu, client):
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        channel = DiscordChannel(client, emu.channel_id, typing=typing,  # type: ignore[arg-type]
                                 idle_flush_s=None)
        await channel.deliver("Let me look that up.")
        await channel.finish_pass()
        sent_at = emu.sent()[-1].at
        await asyncio.sleep(5.0)
        assert [round(r.at - sent_at, 6) for r in emu.requests_to(TYPING)
                if r.at > sent_at] == [2.0]
        await typing.stop()


async def test_a_pass_without_text_keeps_typing_on_its_schedule() -> None:
    # covers D1: a pass that only asked for a tool leaves no gap in the indicator
    async with emulated_discord() as (emu, client):
        typing = TypingIndicator.for_channel(client, emu.channel_id)
        channel = DiscordChannel(client, emu.channel_id, typing=typing,  # type: ignore[arg-type]
                                 idle_flush_s=None)
        start = asyncio.get_running_loop().time()
        typing.start()
        await asyncio.sleep(1.0)
        await channel.finish_pass()
        await asyncio.sleep(19.0)
        assert [round(r.at - start, 6) for r in emu.requests_to(TYPING)] == [0.0, 8.0, 16.0]
        await typing.stop()


async def test_a_reply_to_a_trigger_deleted_meanwhile_is_still_delivered() -> None:
    # covers S2: the user deleted their message while the bot was answering
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=None,  # type: ignore[arg-type]
                                 reply_to=987654321)  # no such message (any longer)
        await channel.deliver("the answer")
        await channel.finish_pass()
        assert [m.content for m in channel.delivered] == ["the answer"]
