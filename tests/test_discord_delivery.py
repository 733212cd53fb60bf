"""`DiscordChannel` against the emulator with real discord.py (D1, D2, S2, R6)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from discord_io.delivery import DeliveryError, DiscordChannel
from discord_io.testing import DiscordEmulator, Fault, emulated_discord
from fsm.engine.channel import Notice, TurnChannel

SEND = "POST /channels/{channel_id}/messages"
DELETE = "DELETE /channels/{channel_id}/messages/{message_id}"


def _paragraph(index: int, words: int = 120) -> str:
    return f"Paragraph {index}: " + " ".join(f"word{index}_{n}" for n in range(words)) + "."


def _make(client: object, emu: DiscordEmulator, **kwargs: object) -> DiscordChannel:
    kwargs.setdefault("idle_flush_s", None)
    return DiscordChannel(client, emu.channel_id, **kwargs)  # type: ignore[arg-type]


async def _stream(channel: TurnChannel, text: str, piece: int = 17) -> None:
    for start in range(0, len(text), piece):
        await channel.deliver(text[start : start + piece])
    await channel.finish_pass()


@pytest.mark.asyncio
async def test_long_streamed_reply_arrives_as_paragraph_messages() -> None:
    # covers D1
    paragraphs = [_paragraph(i) for i in range(7)]
    text = "\n\n".join(paragraphs)
    async with emulated_discord() as (emu, client):
        channel = _make(client, emu)
        await _stream(channel, text)

        contents = [r.json["content"] for r in emu.sent()]
        assert len(contents) >= 3
        assert all(len(c) <= 2000 for c in contents)
        for content in contents:
            assert all(part in paragraphs for part in content.split("\n\n"))
        assert [m.message_id for m in channel.delivered] == [
            int(m["id"]) for m in emu.channel_messages()
        ]
        assert channel.delivered_text == text


@pytest.mark.asyncio
async def test_code_block_split_across_messages_keeps_fences_balanced() -> None:
    # covers D1
    code = "\n".join(f"print('line {n}')  # explain {n}" for n in range(150))
    text = f"Run this:\n\n```python\n{code}\n```\n\nThat's it."
    async with emulated_discord() as (emu, client):
        await _stream(_make(client, emu), text, piece=50)
        contents = [r.json["content"] for r in emu.sent()]
        code_messages = [c for c in contents if "print(" in c]
        assert len(code_messages) >= 2
        for content in code_messages:
            assert content.startswith("```python\n")
            assert content.count("```") % 2 == 0
            assert len(content) <= 2000


@pytest.mark.asyncio
async def test_streamed_messages_allow_no_mentions() -> None:
    # covers D1
    async with emulated_discord() as (emu, client):
        channel = _make(client, emu)
        await _stream(channel, f"@everyone look, <@{emu.alice_id}> said hi.\n\nAnd <@&123>.")
        await channel.post_notice(Notice.of("still_working"))
        for request in emu.sent():
            mentions = request.json["allowed_mentions"]
            assert mentions["parse"] == []
            assert not mentions.get("users")
            assert not mentions.get("roles")
            assert not mentions.get("replied_user")


@pytest.mark.asyncio
async def test_queued_turn_replies_to_its_trigger_only_with_its_first_message() -> None:
    # covers S2
    async with emulated_discord() as (emu, client):
        trigger = emu.add_message(emu.channel_id, emu.alice_id, "tell me a story")
        channel = _make(client, emu, reply_to=int(trigger["id"]))
        await _stream(channel, "\n\n".join(_paragraph(i) for i in range(5)))

        sent = emu.sent()
        assert len(sent) >= 2
        assert sent[0].json["message_reference"]["message_id"] == int(trigger["id"])
        assert sent[0].json["message_reference"]["fail_if_not_exists"] is False
        assert all("message_reference" not in r.json for r in sent[1:])
        assert emu.channel_messages()[1]["referenced_message"]["id"] == trigger["id"]


@pytest.mark.asyncio
async def test_scene_turn_sets_no_reply_target() -> None:
    # covers S2
    async with emulated_discord() as (emu, client):
        emu.add_message(emu.channel_id, emu.alice_id, "everyone, introduce yourselves")
        scene = _make(client, emu, reply_to=None)
        await _stream(scene, "I'm the first persona.\n\n" + _paragraph(1, 300))
        assert emu.sent()
        assert all("message_reference" not in r.json for r in emu.sent())


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_rate_limited_send_is_retried_and_delivered(looptime: float) -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.rate_limited(3.0))
        channel = _make(client, emu)
        start = float(looptime)
        await _stream(channel, "One.\n\nTwo.")
        assert [r.status for r in emu.requests_to(SEND)] == [429, 200]
        assert float(looptime) - start >= 3.0
        assert channel.delivered_text == "One.\n\nTwo."
        assert channel.failure is None


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_many_messages_respect_the_channel_bucket() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        emu.enable_buckets(limit=5, window_s=5.0)
        channel = _make(client, emu)
        await _stream(channel, "\n\n".join(_paragraph(i, 300) for i in range(12)), piece=400)
        assert len(emu.sent()) >= 10
        assert emu.requests_to(SEND, status=429) == []


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_server_error_after_retries_is_reported_without_the_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # covers D2
    caplog.set_level(logging.DEBUG)
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, *[Fault.server_error(500)] * 5)
        channel = _make(client, emu)
        await channel.deliver("This will not arrive.")
        with pytest.raises(DeliveryError) as raised:
            await channel.finish_pass()

        assert raised.value.status == 500
        assert "500" in str(raised.value)
        assert channel.failure is raised.value
        assert channel.delivered == []
        with pytest.raises(DeliveryError):
            await channel.deliver("more")
        assert any("failed" in r.getMessage() for r in caplog.records)
        assert all(emu.token not in r.getMessage() for r in caplog.records)
        assert emu.token not in str(raised.value)


@pytest.mark.asyncio
async def test_forbidden_send_is_reported_at_once() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.forbidden())
        channel = _make(client, emu)
        await channel.deliver("No permission here.")
        with pytest.raises(DeliveryError) as raised:
            await channel.finish_pass()
        assert raised.value.status == 403 and raised.value.code == 50013
        assert len(emu.requests_to(SEND)) == 1


@pytest.mark.asyncio
async def test_nothing_is_sent_after_a_failed_message() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.forbidden())
        channel = _make(client, emu, flush_paragraphs=True)
        await channel.deliver("First.\n\nSecond.\n\nThird")
        with pytest.raises(DeliveryError):
            await channel.finish_pass()
        assert len(emu.requests_to(SEND)) == 1


@pytest.mark.asyncio
async def test_cleanup_deletes_every_delivered_message() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        trigger = emu.add_message(emu.channel_id, emu.alice_id, "question")
        channel = _make(client, emu, reply_to=int(trigger["id"]))
        await _stream(channel, "\n\n".join(_paragraph(i, 200) for i in range(5)))
        ids = [m.message_id for m in channel.delivered]
        assert len(ids) >= 2

        deleted = await channel.cleanup()

        assert deleted == len(ids)
        assert sorted(int(r.params["message_id"]) for r in emu.requests_to(DELETE)) == sorted(ids)
        assert [m["id"] for m in emu.channel_messages()] == [trigger["id"]]
        assert channel.delivered == [] and channel.delivered_text == ""
        # the replacement attempt's first message replies to the trigger again (S2)
        await _stream(channel, "A better answer.")
        assert emu.sent()[-1].json["message_reference"]["message_id"] == int(trigger["id"])


@pytest.mark.asyncio
async def test_cleanup_tolerates_messages_already_gone() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        channel = _make(client, emu)
        await _stream(channel, "One.")
        emu.messages[emu.channel_id].clear()
        assert await channel.cleanup() == 1


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_send_on_the_wire_is_recorded_even_if_the_caller_is_cancelled() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.delay(2.0))
        channel = _make(client, emu)
        await channel.deliver("Slow message.")
        finishing = asyncio.create_task(channel.finish_pass())
        await emu.wait_for(lambda r: r.route == SEND, answered=False)
        finishing.cancel()
        await asyncio.wait({finishing})
        await channel.aclose()
        assert [m.content for m in channel.delivered] == ["Slow message."]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_idle_stream_flushes_complete_paragraphs(looptime: float) -> None:
    # covers D1
    async with emulated_discord() as (emu, client):
        channel = DiscordChannel(client, emu.channel_id, idle_flush_s=5.0)
        await channel.deliver("The first thought is complete.\n\nThe second is still co")
        await asyncio.sleep(4.0)
        assert emu.sent() == []
        await emu.wait_for(lambda r: r.route == SEND)
        assert float(looptime) >= 5.0
        assert [r.json["content"] for r in emu.sent()] == ["The first thought is complete."]
        await channel.deliver("ming.")
        await channel.finish_pass()
        assert [r.json["content"] for r in emu.sent()][-1] == "The second is still coming."


@pytest.mark.asyncio
async def test_notice_is_an_embed_with_title_and_description() -> None:
    # covers T1, S12 (notices reach the channel)
    async with emulated_discord() as (emu, client):
        trigger = emu.add_message(emu.channel_id, emu.alice_id, "hi")
        channel = _make(client, emu, reply_to=int(trigger["id"]))
        await channel.post_notice(Notice.of("timeout_first_token"))
        body = emu.sent()[-1].json
        assert "content" not in body or not body["content"]
        embed = body["embeds"][0]
        assert embed["title"] == Notice.of("timeout_first_token").title
        assert embed["description"] == Notice.of("timeout_first_token").description
        assert body["message_reference"]["message_id"] == int(trigger["id"])
        assert channel.delivered == [] and len(channel.notices) == 1


@pytest.mark.asyncio
async def test_failed_notice_is_raised_to_the_caller() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.forbidden())
        with pytest.raises(DeliveryError):
            await _make(client, emu).post_notice(Notice.of("max_iterations"))


@pytest.mark.asyncio
async def test_fetch_reactors_is_one_rest_call() -> None:
    # covers R6
    async with emulated_discord() as (emu, client):
        bob = emu.add_user("bob")  # no global name: the username is used
        message = emu.add_message(emu.channel_id, emu.alice_id, "vote!")
        emu.add_reaction(int(message["id"]), "👍", emu.alice_id)
        emu.add_reaction(int(message["id"]), "👍", int(bob["id"]))
        emu.add_reaction(int(message["id"]), "party:1234567890123456789", int(bob["id"]))
        channel = _make(client, emu)

        before = len(emu.requests)
        assert await channel.fetch_reactors(message["id"], "👍", 10) == ["Alice", "bob"]
        assert len(emu.requests) == before + 1
        assert emu.requests[-1].query["limit"] == "10"
        assert await channel.fetch_reactors(message["id"], "<:party:1234567890123456789>", 10) == [
            "bob"
        ]
        assert await channel.fetch_reactors(message["id"], "👍", 1) == ["Alice"]


@pytest.mark.asyncio
async def test_fetch_reactors_degrades_to_no_names_on_failure() -> None:
    # covers R6
    async with emulated_discord() as (emu, client):
        emu.inject(
            "GET /channels/{channel_id}/messages/{message_id}/reactions/{emoji}", Fault.forbidden()
        )
        assert await _make(client, emu).fetch_reactors("123", "👍", 5) == []
