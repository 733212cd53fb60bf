"""Starting and stopping the bot as an operator does (O1, O2, O7, O8): the whole
`serve()` — REST login, the gateway, the provider over real HTTP — against the Discord
emulator and a loopback model server, in virtual time. Each start-up failure is one line
naming what to do; the invite URL asks for exactly the permissions docs/discord.md lists;
a stop request with a reply streaming ends it Stopped (S7, D3) with its text and journal
kept, and `serve` returns 0; the turn-end log line has what an operator needs."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import discord
import pytest

from discord_io.testing import DiscordEmulator
from discord_io.testing.emulator import pointed_at
from providers.replay_server import Hang, ReplayServer, Send
from turn_engine.bot import build_client, serve
from turn_engine.logging_setup import setup_logging
from turn_engine.settings import AppSettings
from turn_engine.shutdown import StopRequest
from turn_engine.startup import (
    PERMISSIONS,
    StartupError,
    describe_failure,
    invite_url,
    ready_line,
)

from engine_support import ROOT
from providers_support import sse


def virtual_time(test: Any) -> Any:
    """An asyncio test on looptime's virtual clock."""
    return pytest.mark.asyncio(pytest.mark.looptime(test))

SEND = "POST /channels/{channel_id}/messages"


def _chunk(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def _settings(token: str, model_url: str, journals: Path, **extra: Any) -> AppSettings:
    provider = {"kind": "openai", "model": "local", "base_url": model_url + "/v1"}
    return AppSettings.model_validate({
        "discord_token": token, "provider": provider,
        "journals": {"dir": str(journals)}, "gc": {"enabled": False},
        "data_dir": str(journals / "data"), **extra})


@asynccontextmanager
async def emulator() -> AsyncIterator[DiscordEmulator]:
    emu = DiscordEmulator()
    await emu.start()
    try:
        with pointed_at(emu):
            yield emu
    finally:
        await emu.stop()


async def _ready(client: discord.Client) -> None:
    """Until the client has had READY (before its login it cannot even be asked)."""
    while True:
        try:
            await client.wait_until_ready()
        except RuntimeError:
            await asyncio.sleep(0.05)
        else:
            return


async def _failure(settings: AppSettings) -> str:
    with pytest.raises(StartupError) as caught:
        await asyncio.wait_for(serve(settings, stop=StopRequest()), 120)
    line = str(caught.value)
    assert "\n" not in line
    return line


@virtual_time
async def test_a_rejected_token_is_one_line(tmp_path: Path) -> None:
    # covers O2: a bad token is refused with what to do, not a traceback
    async with emulator() as emu:
        line = await _failure(_settings("not-the-token", "http://127.0.0.1:9", tmp_path))
        assert line.startswith("Discord rejected the token (401 Unauthorized)")
        assert "TURN_DISCORD_TOKEN" in line and "not-the-token" not in line
        assert emu.requests[0].route == "GET /users/@me"


@virtual_time
async def test_a_missing_privileged_intent_is_one_line(tmp_path: Path) -> None:
    # covers O2: close code 4014 from the gateway names the intent to turn on
    async with emulator() as emu:
        emu.gateway.granted_intents = 0
        line = await _failure(_settings(emu.token, "http://127.0.0.1:9", tmp_path))
        assert line.startswith("Discord refused the gateway connection (4014")
        assert "Message Content Intent" in line


@virtual_time
async def test_discord_unreachable_is_one_line(tmp_path: Path) -> None:
    # covers O2: nothing listening where Discord should be
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    previous = discord.http.Route.BASE
    discord.http.Route.BASE = f"http://127.0.0.1:{port}/api/v10"
    try:
        line = await _failure(_settings("a-token", "http://127.0.0.1:9", tmp_path))
    finally:
        discord.http.Route.BASE = previous
    assert line.startswith("Discord is unreachable (")


def test_other_failures_map_to_lines_and_unknown_ones_do_not() -> None:
    # covers O2: the remaining mappings of discord.py's exceptions
    class Response:
        status, reason = 503, "Service Unavailable"

    http = describe_failure(discord.HTTPException(Response(), "down"))  # type: ignore[arg-type]
    assert http is not None and http.startswith("Discord answered HTTP 503")
    assert describe_failure(ValueError("a bug")) is None


def test_the_invite_url_asks_for_exactly_the_documented_permissions() -> None:
    # covers O1: docs/discord.md and the start-up URL agree
    text = (ROOT / "docs" / "discord.md").read_text()
    block = text.split("<!-- permissions:")[1].split("<!-- end permissions -->")[0]
    documented = set(re.findall(r"\(`([a-z_]+)`\)", block))
    assert discord.Permissions(**dict.fromkeys(documented, True)) == PERMISSIONS
    url = invite_url(1234)
    assert f"permissions={PERMISSIONS.value}" in url and "client_id=1234" in url
    assert "scope=bot+applications.commands" in url
    # a member's permission (to type /kill), not the bot's: Discord's permissions table
    assert not PERMISSIONS.use_application_commands


@virtual_time
async def test_start_prints_the_invite_and_a_stop_request_exits_cleanly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # covers O1 and O8: invite URL at start-up; stop with nothing running
    caplog.set_level(logging.INFO)
    async with emulator() as emu:
        stop = StopRequest()
        client = build_client()
        settings = _settings(emu.token, "http://127.0.0.1:9", tmp_path)
        serving = asyncio.create_task(serve(settings, stop=stop, client=client))
        await asyncio.wait_for(_ready(client), 60)
        stop.request("SIGTERM")
        assert await asyncio.wait_for(serving, 60) == 0
        assert client.is_closed()
    assert f"invite the bot with: {invite_url(emu.application_id)}" in caplog.text


@contextmanager
def operator_log() -> Iterator[io.StringIO]:
    """What the main job's log handler writes, with discord.py's once-per-process voice
    warnings armed again (an earlier client in this process has spent them)."""
    stream = io.StringIO()
    armed = discord.VoiceClient.warn_nacl, discord.VoiceClient.warn_dave
    discord.VoiceClient.warn_nacl = discord.VoiceClient.warn_dave = True
    handler = setup_logging("INFO", "WARNING", stream=stream)
    try:
        yield stream
    finally:
        logging.getLogger().removeHandler(handler)
        discord.VoiceClient.warn_nacl, discord.VoiceClient.warn_dave = armed


@virtual_time
async def test_a_good_start_says_who_where_and_that_kill_is_registered(tmp_path: Path) -> None:
    # covers O13: one ready line after the gateway's READY and guilds, naming the bot, its
    # server count and /kill; discord.py's voice warnings (the bot has no voice) are gone
    with operator_log() as log:
        async with emulator() as emu:
            emu.add_guild("second guild")
            stop = StopRequest()
            client = build_client()
            serving = asyncio.create_task(serve(
                _settings(emu.token, "http://127.0.0.1:9", tmp_path), stop=stop, client=client))
            await asyncio.wait_for(_ready(client), 60)
            assert [r.route for r in emu.requests].count(
                "PUT /applications/{application_id}/commands") == 1
            stop.request("SIGTERM")
            assert await asyncio.wait_for(serving, 60) == 0
    lines = log.getvalue().splitlines()
    name = emu.bot["username"]
    ready = [line for line in lines if "connected as" in line]
    assert [line.split(" ", 1)[1] for line in ready] == [
        f"INFO turn_engine.bot: connected as {name} ({emu.bot_id}) in 2 servers; "
        "/kill registered"], lines
    assert not [line for line in lines if " WARNING " in line], lines


def test_the_ready_line_says_when_kill_was_not_registered() -> None:
    # covers O13: a refused registration is said on the ready line too
    client = SimpleNamespace(user=SimpleNamespace(name="turnbot", id=5), guilds=[object()])
    assert ready_line(client, False) == (  # type: ignore[arg-type]
        "connected as turnbot (5) in 1 server; /kill NOT registered (see the warning above)")


@virtual_time
async def test_stopping_with_a_reply_streaming_keeps_its_text_and_journal(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # covers S7, D3 at shutdown (O8) and the turn-end log line (item 7)
    caplog.set_level(logging.INFO)
    script = [Send(sse(_chunk("Delivered before the stop.\n\n"))), Hang()]
    async with ReplayServer(script) as model, emulator() as emu:
        stop = StopRequest()
        client = build_client()
        serving = asyncio.create_task(
            serve(_settings(emu.token, model.url, tmp_path), stop=stop, client=client))
        await asyncio.wait_for(_ready(client), 60)
        await emu.gateway.message_create(emu.channel_id, emu.alice_id,
                                         f"<@{emu.bot_id}> tell me", mentions=[emu.bot_id])
        await emu.wait_for(lambda r: r.route == SEND, timeout=60)  # the idle flush sent it
        stop.request("SIGTERM")
        assert await asyncio.wait_for(serving, 60) == 0
        [sent] = [r.json["content"] for r in emu.requests_to(SEND, status=200)]
        assert sent == "Delivered before the stop."
        assert emu.deleted == []
    [journal] = tmp_path.glob("*.json")
    result = json.loads(journal.read_text())["result"]
    assert result["status"] == "stopped_by_user"
    assert "Delivered before the stop." in result["delivered_text"]
    [line] = [r.getMessage() for r in caplog.records if "turn end" in r.getMessage()]
    assert re.fullmatch(
        rf"turn end channel={emu.channel_id} turn=\d+ state=Stopped status=stopped_by_user "
        r"passes=1 duration=\d+\.\ds tokens=unknown model=openai:local", line), line


@virtual_time
async def test_the_settings_reach_the_running_bot(tmp_path: Path) -> None:
    # covers O3 and O4 end to end: access lists and tools off, from settings
    answer = sse(_chunk("Hi!"), {"choices": [{"index": 0, "delta": {},
                                              "finish_reason": "stop"}]}) + b"data: [DONE]\n\n"
    async with ReplayServer([Send(answer)]) as model, emulator() as emu:
        bob = int(emu.add_user("bob")["id"])
        emu.guilds[emu.guild_id]["members"].append(bob)
        settings = _settings(emu.token, model.url, tmp_path,
                             access={"blocked_users": [bob]}, tools={"enabled": False})
        stop = StopRequest()
        client = build_client()
        serving = asyncio.create_task(serve(settings, stop=stop, client=client))
        await asyncio.wait_for(_ready(client), 60)
        await emu.gateway.message_create(emu.channel_id, bob, f"<@{emu.bot_id}> me too",
                                         mentions=[emu.bot_id])
        await emu.gateway.message_create(emu.channel_id, emu.alice_id, f"<@{emu.bot_id}> hi",
                                         mentions=[emu.bot_id])
        await emu.wait_for(lambda r: r.route == SEND, timeout=60)
        stop.request("SIGTERM")
        assert await asyncio.wait_for(serving, 60) == 0
    [request] = model.requests
    body = request.json()
    assert "tools" not in body
    assert "me too" not in json.dumps(body)  # the blocked user is not even history
