"""The REST emulator itself, driven by real discord.py: login, routes, scripted faults (D2)."""

from __future__ import annotations

import io

import aiohttp
import discord
import pytest

from discord_io.testing import DiscordEmulator, Fault, emulated_discord

SEND = "POST /channels/{channel_id}/messages"


@pytest.mark.asyncio
async def test_login_without_gateway_and_route_base_restored() -> None:
    # covers D2 (the harness every Discord test stands on)
    before = discord.http.Route.BASE
    async with emulated_discord() as (emu, client):
        assert emu.base_url == discord.http.Route.BASE
        assert client.user is not None and client.user.id == emu.bot_id
        me = emu.requests_to("GET /users/@me")[0]
        assert me.headers["Authorization"] == f"Bot {emu.token}"
        channel = await client.fetch_channel(emu.channel_id)
        assert isinstance(channel, discord.TextChannel)
    assert before == discord.http.Route.BASE


@pytest.mark.asyncio
async def test_wrong_token_is_refused() -> None:
    # covers D2
    emu = DiscordEmulator(token="right")
    await emu.start()
    previous = discord.http.Route.BASE
    discord.http.Route.BASE = emu.base_url
    client = discord.Client(intents=discord.Intents.none())
    try:
        with pytest.raises(discord.LoginFailure):
            await client.login("wrong")
    finally:
        await client.close()
        discord.http.Route.BASE = previous
        await emu.stop()


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_route_429_is_retried_after_retry_after(looptime: float) -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.rate_limited(7.5))
        start = float(looptime)
        message = await client.get_partial_messageable(emu.channel_id).send("hi")
        assert [r.status for r in emu.requests_to(SEND)] == [429, 200]
        retried = emu.requests_to(SEND)[1]
        assert retried.at - start >= 7.5
        assert message.content == "hi"


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_global_429_holds_other_routes_too(looptime: float) -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, Fault.rate_limited(4.0, is_global=True))
        channel = client.get_partial_messageable(emu.channel_id)
        start = float(looptime)
        await channel.send("first")
        await channel.typing()
        typing = emu.requests_to("POST /channels/{channel_id}/typing")
        assert typing[0].at - start >= 4.0


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_bucket_headers_make_discord_py_wait_instead_of_hitting_429(
    looptime: float,
) -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        emu.enable_buckets(limit=5, window_s=5.0)
        channel = client.get_partial_messageable(emu.channel_id)
        start = float(looptime)
        for n in range(12):
            await channel.send(f"message {n}")
        assert len(emu.sent()) == 12
        assert emu.requests_to(SEND, status=429) == []
        assert float(looptime) - start >= 10.0  # 12 sends at 5 per 5 s need two full waits


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_server_errors_are_retried_then_raised() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        emu.inject(SEND, *[Fault.server_error(502)] * 5)
        with pytest.raises(discord.DiscordServerError):
            await client.get_partial_messageable(emu.channel_id).send("lost")
        assert [r.status for r in emu.requests_to(SEND)] == [502] * 5


@pytest.mark.asyncio
async def test_json_content_type_is_exact_and_optional_keys_are_omitted() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        sent = await client.get_partial_messageable(emu.channel_id).send("x")
        stored = emu.channel_messages()[-1]
        assert stored["id"] == str(sent.id)
        assert stored["edited_timestamp"] is None  # nullable but required, as Discord sends it
        assert "message_reference" not in stored
        assert "webhook_id" not in stored


@pytest.mark.asyncio
async def test_file_uploads_are_recorded_with_their_payload() -> None:
    # covers D2
    async with emulated_discord() as (emu, client):
        channel = client.get_partial_messageable(emu.channel_id)
        file = discord.File(io.BytesIO(b"hello file"), filename="note.txt")
        message = await channel.send("with a file", file=file)
        (request,) = emu.sent()
        assert request.json["content"] == "with a file"
        assert [(f.filename, f.size) for f in request.files] == [("note.txt", 10)]
        assert message.attachments[0].filename == "note.txt"


@pytest.mark.asyncio
async def test_an_upload_is_served_under_the_channel_it_was_posted_in() -> None:
    # covers D1's emulator surface: an attachment's CDN path names its own channel, and the
    # CDN serves its bytes there
    async with emulated_discord() as (emu, _client):
        other = emu.add_text_channel("other")
        upload = emu.add_attachment("a.txt", "text/plain", b"hi", channel_id=other)
        assert f"/attachments/{other}/" in upload["url"]
        async with aiohttp.ClientSession() as http, http.get(upload["url"]) as answer:
            assert answer.status == 200 and await answer.read() == b"hi"
