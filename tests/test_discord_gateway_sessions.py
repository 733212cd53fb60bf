"""The emulated gateway held to Discord's gateway documentation where sessions end: the
client beats on its own and a connection whose beats stop is closed; a session silent past
its timeout cannot be resumed, nor one closed with 4007 or 4009; IDENTIFY is limited by
`max_concurrency` and the daily session starts; the close codes for bad shards, versions,
intents and payloads; RESUME at `resume_gateway_url`; zstd-stream and zlib-stream transport
compression; intents for typing, voice-state and poll events; what a bot may not view is
not sent. Pages: https://discord.com/developers/docs/events/gateway and
https://discord.com/developers/docs/topics/opcodes-and-status-codes. Every test covers D2;
the session tests D8 and the compression test D11 of the emulator side too."""

from __future__ import annotations

import asyncio
import itertools
import json
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import discord
import pytest
import zstandard

from discord_io.testing import (
    DiscordEmulator,
    block_event_loop,
    connected_discord,
    emulated_discord,
)
from discord_io.testing import permissions as perms
from discord_io.testing.gateway import (
    GATEWAY_PATH,
    HEARTBEAT,
    HEARTBEAT_INTERVAL_MS,
    IDENTIFY,
    RESUME,
    RESUME_PATH,
)
from discord_io.testing.gateway_events import (
    DECODE_ERROR,
    GUILD_MESSAGE_TYPING,
    INVALID_API_VERSION,
    INVALID_INTENTS,
    INVALID_SEQ,
    INVALID_SESSION,
    NORMAL_CLOSURE,
    NOT_AUTHENTICATED,
    SESSION_TIMED_OUT,
    SHARDING_REQUIRED,
    UNKNOWN_OPCODE,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

INTERVAL_S = HEARTBEAT_INTERVAL_MS / 1000


def content_client() -> discord.Client:
    intents = discord.Intents.default()
    intents.message_content = True
    return discord.Client(intents=intents)


class Seen:
    def __init__(self) -> None:
        self.messages: list[str] = []
        self.resumed = 0

    def attach(self, _emu: DiscordEmulator, client: discord.Client) -> None:
        async def on_message(message: discord.Message) -> None:
            self.messages.append(message.content)

        async def on_resumed() -> None:
            self.resumed += 1

        client.event(on_message)
        client.event(on_resumed)


async def settle() -> None:
    await asyncio.sleep(0.5)


@asynccontextmanager
async def raw_socket(emu: DiscordEmulator, *, path: str = GATEWAY_PATH,
                     query: str = "v=10&encoding=json") -> AsyncIterator[
                         aiohttp.ClientWebSocketResponse]:
    """A bare websocket to the emulated gateway, HELLO read."""
    base = emu.gateway.url.removesuffix(GATEWAY_PATH)
    async with aiohttp.ClientSession() as http, http.ws_connect(
            f"{base}{path}?{query}") as ws:
        yield ws


def identify(emu: DiscordEmulator, **extra: Any) -> dict[str, Any]:
    return {"op": IDENTIFY, "d": {"token": emu.token, "intents": 513,
                                  "properties": {"os": "linux", "browser": "t", "device": "t"},
                                  **extra}}


async def closed_with(ws: aiohttp.ClientWebSocketResponse) -> int | None:
    while True:
        message = await ws.receive()
        if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                            aiohttp.WSMsgType.CLOSING):
            return ws.close_code


async def test_the_client_beats_on_its_own_and_the_gateway_never_asks() -> None:
    # covers D2 (Sending Heartbeats: the app sends a heartbeat every heartbeat_interval)
    async with connected_discord(client_factory=content_client) as (emu, client):
        start = len(emu.gateway.payloads(HEARTBEAT))
        await asyncio.sleep(3 * INTERVAL_S + 1)
        beats = emu.gateway.payloads(HEARTBEAT)[start:]
        assert len(beats) == 3
        gaps = [b.at - a.at for a, b in itertools.pairwise(beats)]
        assert all(abs(gap - INTERVAL_S) < 0.5 for gap in gaps)
        assert client.latency != float("inf")
        assert emu.gateway.closes == []


async def test_a_stall_past_a_beat_closes_the_connection_and_the_client_resumes() -> None:
    # covers D8 (Sending Heartbeats: "If your app fails to send a heartbeat event in time,
    # your connection will be closed and you will be forced to Resume")
    seen = Seen()
    async with connected_discord(client_factory=content_client, setup=seen.attach) as (
            emu, _client):
        block_event_loop(2 * INTERVAL_S)  # shorter than the session's timeout
        await emu.gateway.wait_for(lambda: seen.resumed == 1)
        assert NORMAL_CLOSURE in [code for _, code in emu.gateway.closes]
        [resume] = emu.gateway.payloads(RESUME)
        assert emu.gateway.connection_paths()[resume.connection - 1] == RESUME_PATH
        assert len(emu.gateway.payloads(IDENTIFY)) == 1


async def test_a_session_silent_past_its_timeout_is_not_resumed_and_its_events_are_lost(
) -> None:
    # covers D8 (Resuming: "It's possible your app won't reconnect in time to Resume, in
    # which case it will receive an Invalid Session (opcode 9) event")
    seen = Seen()
    async with connected_discord(client_factory=content_client, setup=seen.attach) as (
            emu, _client):
        first = emu.gateway.live_session()
        assert first is not None
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "before")
        await settle()
        # the client stalls: the gateway closes the connection, a message comes meanwhile,
        # and the stall outlasts the session
        first.connection.zombie = True  # type: ignore[union-attr]
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "in the gap")
        block_event_loop(emu.gateway.session_timeout_s + INTERVAL_S)
        await emu.gateway.wait_for_payload(IDENTIFY, count=2)
        await emu.gateway.wait_for(lambda: (s := emu.gateway.live_session()) is not None
                                   and s is not first and s.connection is not None)
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "after")
        await settle()
        assert seen.messages == ["before", "after"]
        assert first.invalid and [name for _, name in first.lost] == ["MESSAGE_CREATE"]
        [resume] = emu.gateway.payloads(RESUME)
        assert emu.gateway.connection_paths()[resume.connection - 1] == RESUME_PATH


@pytest.mark.parametrize("code", [INVALID_SEQ, SESSION_TIMED_OUT])
async def test_after_4007_or_4009_a_resume_is_refused(code: int) -> None:
    # covers D8 (Close Event Codes: 4007 "Reconnect and start a new session", 4009 "Your
    # session timed out. Reconnect and start a new one.")
    async with connected_discord(client_factory=content_client) as (emu, _client):
        first = emu.gateway.live_session()
        await emu.gateway.close(0, code)
        await emu.gateway.wait_for_payload(IDENTIFY, count=2)
        assert first is not None and first.invalid
        assert len(emu.gateway.payloads(RESUME)) == 1  # discord.py tries; it is refused
        assert emu.gateway.live_session() is not first


async def test_a_resume_with_a_sequence_never_sent_is_closed_4007() -> None:
    # covers D2 (Close Event Codes: 4007 Invalid seq)
    async with emulated_discord() as (emu, _client), raw_socket(emu) as ws:
        await ws.receive_json()
        await ws.send_json(identify(emu))
        ready = await ws.receive_json()
        session_id = ready["d"]["session_id"]
        async with raw_socket(emu, path=RESUME_PATH) as again:
            await again.receive_json()
            await again.send_json({"op": RESUME, "d": {"token": emu.token,
                                                       "session_id": session_id, "seq": 999}})
            assert await closed_with(again) == INVALID_SEQ


async def test_identify_beyond_max_concurrency_gets_invalid_session_and_starts_are_counted(
) -> None:
    # covers D2 (Identifying: "If your app exceeds this limit, Discord will respond with a
    # Invalid Session (opcode 9)"; Session Start Limit Object)
    async with emulated_discord() as (emu, client):
        before = (await client.http.get_bot_gateway())[2]
        async with raw_socket(emu) as one, raw_socket(emu) as two:
            await one.receive_json()
            await two.receive_json()
            await one.send_json(identify(emu, shard=[0, 2]))
            assert (await one.receive_json())["t"] == "READY"
            await two.send_json(identify(emu, shard=[1, 2]))
            assert (await two.receive_json())["op"] == INVALID_SESSION
        limit = emu.gateway.bot_gateway()["session_start_limit"]
        assert limit["max_concurrency"] == 1
        assert limit["remaining"] == 999 and before["remaining"] == 1000


@pytest.mark.parametrize(("query", "payload", "code"), [
    ("v=9&encoding=json", None, INVALID_API_VERSION),
    ("v=10&encoding=json", "identify-bad-intents", INVALID_INTENTS),
    ("v=10&encoding=json", {"op": 99, "d": None}, UNKNOWN_OPCODE),
    ("v=10&encoding=json", "not json", DECODE_ERROR),
    ("v=10&encoding=json", {"op": 8, "d": {"guild_id": "1"}}, NOT_AUTHENTICATED),
])
async def test_bad_versions_intents_and_payloads_are_closed_with_their_codes(
        query: str, payload: Any, code: int) -> None:
    # covers D2 (Close Event Codes 4001, 4002, 4003, 4012, 4013)
    async with emulated_discord() as (emu, _client), raw_socket(emu, query=query) as ws:
        if payload is not None:
            await ws.receive_json()
            if payload == "identify-bad-intents":
                await ws.send_json(identify(emu, intents=1 << 30))
            elif isinstance(payload, str):
                await ws.send_str(payload)
            else:
                await ws.send_json(payload)
        assert await closed_with(ws) == code


async def test_too_many_guilds_for_one_shard_is_4011() -> None:
    # covers D2 (Close Event Codes: 4011 Sharding required)
    def crowd(emu: DiscordEmulator, _client: discord.Client) -> None:
        emu.add_guild("another")
        emu.gateway.max_guilds_per_shard = 1

    with pytest.raises(discord.ConnectionClosed) as closed:
        async with connected_discord(client_factory=content_client, setup=crowd):
            pass
    assert closed.value.code == SHARDING_REQUIRED


async def test_discord_py_gets_zstd_stream_frames() -> None:
    # covers D11 (Transport Compression › zstd-stream: one context for the connection,
    # each websocket message a whole gateway message)
    seen = Seen()
    async with connected_discord(client_factory=content_client, setup=seen.attach) as (
            emu, _client):
        connection = emu.gateway.live_session().connection  # type: ignore[union-attr]
        assert connection is not None and connection.compressor is not None
        assert connection.compressor.name == "zstd-stream"
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, "compressed")
        await settle()
        assert seen.messages == ["compressed"]


@pytest.mark.parametrize("compress", ["zstd-stream", "zlib-stream"])
async def test_compressed_frames_decode_with_one_context_per_connection(compress: str) -> None:
    # covers D11 (Transport Compression: zlib-stream ends each message with Z_SYNC_FLUSH)
    async with emulated_discord() as (emu, _client), raw_socket(
            emu, query=f"v=10&encoding=json&compress={compress}") as ws:
        if compress == "zlib-stream":
            inflate = zlib.decompressobj()
            decode = inflate.decompress
        else:
            decode = zstandard.ZstdDecompressor().decompressobj().decompress
        hello = await ws.receive_bytes()
        assert json.loads(decode(hello))["op"] == 10
        if compress == "zlib-stream":
            assert hello.endswith(b"\x00\x00\xff\xff")
        await ws.send_json(identify(emu))
        ready = json.loads(decode(await ws.receive_bytes()))
        guild = json.loads(decode(await ws.receive_bytes()))
        assert (ready["t"], guild["t"]) == ("READY", "GUILD_CREATE")


async def test_typing_voice_and_poll_events_need_their_intents() -> None:
    # covers D2 (Gateway Intents: TYPING_START under GUILD_MESSAGE_TYPING, VOICE_STATE_UPDATE
    # under GUILD_VOICE_STATES, MESSAGE_POLL_VOTE_ADD under GUILD_MESSAGE_POLLS)
    async with connected_discord(client_factory=content_client) as (emu, _client):
        await emu.gateway.typing_start(emu.channel_id, emu.alice_id)
        await emu.gateway.voice_state_update(emu.alice_id, emu.channel_id)
        await emu.gateway.poll_vote_add(emu.channel_id, emu.next_id(), emu.alice_id)
        assert [emu.gateway.delivered[n] for n in (
            "TYPING_START", "VOICE_STATE_UPDATE", "MESSAGE_POLL_VOTE_ADD")] == [1, 1, 1]
    lean = discord.Intents(guilds=True, guild_messages=True, message_content=True)
    async with connected_discord(client_factory=lambda: discord.Client(intents=lean)) as (
            emu, _client):
        assert not emu.gateway.live_session().intents & GUILD_MESSAGE_TYPING  # type: ignore
        await emu.gateway.typing_start(emu.channel_id, emu.alice_id)
        await emu.gateway.voice_state_update(emu.alice_id, emu.channel_id)
        await emu.gateway.poll_vote_add(emu.channel_id, emu.next_id(), emu.alice_id)
        assert [emu.gateway.delivered[n] for n in (
            "TYPING_START", "VOICE_STATE_UPDATE", "MESSAGE_POLL_VOTE_ADD")] == [0, 0, 0]


async def test_the_bot_is_sent_nothing_of_what_it_may_not_view() -> None:
    # covers D2 (Topics › Threads: "Clients will not be informed of a thread through the
    # gateway if they do not have permission to view that thread"; Guild Create's threads
    # are the active threads the user can view)
    def seed(emu: DiscordEmulator, _client: discord.Client) -> None:
        hidden = emu.add_text_channel("staff")
        emu.set_overwrite(hidden, emu.guild_id, deny=perms.VIEW_CHANNEL)
        emu.add_thread(emu.channel_id, "open")
        emu.add_thread(emu.channel_id, "secret", private=True)
        emu.add_thread(emu.channel_id, "old", archived=True)
        seeded["hidden"] = hidden

    seeded: dict[str, int] = {}
    seen = Seen()

    def setup(emu: DiscordEmulator, client: discord.Client) -> None:
        seed(emu, client)
        seen.attach(emu, client)

    async with connected_discord(client_factory=content_client, setup=setup) as (emu, client):
        [guild] = client.guilds
        assert seeded["hidden"] not in {c.id for c in guild.channels}
        assert [t.name for t in guild.threads] == ["open"]
        await emu.gateway.message_create(seeded["hidden"], emu.alice_id, "unseen")
        await settle()
        assert seen.messages == []


async def test_a_mention_adds_the_bot_to_a_private_thread_which_it_then_sees() -> None:
    # covers D2 (Topics › Threads › Gaining Access to Private Threads: "Whenever a user is
    # added to a private thread, the Gateway also sends a Thread Create event")
    seeded: dict[str, int] = {}
    seen = Seen()

    def setup(emu: DiscordEmulator, client: discord.Client) -> None:
        seeded["thread"] = emu.add_thread(emu.channel_id, "secret", private=True)
        seen.attach(emu, client)

    async with connected_discord(client_factory=content_client, setup=setup) as (emu, client):
        thread = seeded["thread"]
        await emu.gateway.message_create(thread, emu.alice_id, "just us")
        await emu.gateway.message_create(thread, emu.alice_id, f"<@{emu.bot_id}> hi",
                                         mentions=[emu.bot_id])
        await settle()
        assert seen.messages == [f"<@{emu.bot_id}> hi"]
        assert emu.bot_id in emu.thread_members[thread]
        known = client.get_channel(thread)
        assert isinstance(known, discord.Thread) and known.me is not None


async def test_the_bots_own_member_update_comes_without_the_members_intent() -> None:
    # covers D2 (Gateway Intents › Caveats: "Guild Member Update is sent for current-user
    # updates regardless of whether the GUILD_MEMBERS intent is set")
    async with connected_discord(client_factory=content_client) as (emu, client):
        role = emu.add_role("new")
        await emu.gateway.role_create(role)
        emu.member_roles[emu.bot_id].append(role)
        emu.member_roles[emu.alice_id].append(role)
        await emu.gateway.member_update(emu.bot_id)
        await emu.gateway.member_update(emu.alice_id)
        await settle()
        assert emu.gateway.delivered["GUILD_MEMBER_UPDATE"] == 1
        [guild] = client.guilds
        assert role in [r.id for r in guild.me.roles]


async def test_thread_list_sync_and_thread_delete_reach_the_clients_cache() -> None:
    # covers D2 (Topics › Threads › Gaining Access to Channels: THREAD_LIST_SYNC carries the
    # active threads of `channel_ids`; Thread Delete)
    async with connected_discord(client_factory=content_client) as (emu, client):
        hidden = emu.add_text_channel("was hidden")
        thread = emu.add_thread(hidden, "inside", members=[emu.bot_id])
        await emu.gateway.thread_list_sync(emu.guild_id, [hidden])
        await settle()
        [guild] = client.guilds
        synced = guild.get_thread(thread)
        assert synced is not None and [m.id for m in synced.members] == [emu.bot_id]
        await emu.gateway.thread_delete(thread)
        await settle()
        assert guild.get_thread(thread) is None
