"""/kill as a real slash command, dispatched through the emulated gateway to a client started
with `client.start()`: stop the running turn, clear the queue, answer ephemerally."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import discord
import pytest
from discord import app_commands

from discord_io.channel_queue import ChannelQueue
from discord_io.kill_command import install_kill_command
from discord_io.testing import DiscordEmulator, connected_discord
from fsm.engine.locks import ChannelLock, ChannelLockRegistry

CALLBACK = "POST /interactions/{interaction_id}/{token}/callback"
EPHEMERAL = 64


def _installing(
    registry: ChannelLockRegistry, queue: ChannelQueue[str]
) -> Callable[[DiscordEmulator, discord.Client], None]:
    """connected_discord's setup: /kill on the client's tree, synced once it has logged in."""

    def setup(emu: DiscordEmulator, client: discord.Client) -> None:
        tree: app_commands.CommandTree[discord.Client] = app_commands.CommandTree(client)
        install_kill_command(tree, registry, queue)

        async def setup_hook() -> None:
            await tree.sync()

        client.setup_hook = setup_hook  # type: ignore[method-assign]

    return setup


async def _answer_to(emu: DiscordEmulator, payload: dict[str, object]) -> dict[str, object]:
    (answer,) = await emu.wait_for(lambda r: r.route == CALLBACK)
    assert answer.params["interaction_id"] == payload["id"]
    assert answer.status == 200
    body = answer.json
    assert isinstance(body, dict)
    return body


async def _invoke(emu: DiscordEmulator) -> dict[str, object]:
    """A user runs /kill in the guild channel; the gateway dispatches the interaction."""
    return await _answer_to(emu, await emu.gateway.interaction("kill"))


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_kill_stops_the_turn_clears_the_queue_and_answers_ephemerally(
    looptime: float,
) -> None:
    # covers D3, S7
    registry = ChannelLockRegistry()
    kills: list[str] = []
    stopped = asyncio.Event()
    ran: list[str] = []

    async def turn(message: str, lock: ChannelLock) -> None:
        ran.append(message)

        def kill(reason: str) -> None:
            kills.append(reason)
            stopped.set()

        registry.set_stream_kill(lock, kill)
        await stopped.wait()  # the pass is aborted by its kill handle

    queue: ChannelQueue[str] = ChannelQueue(registry, turn)
    async with connected_discord(setup=_installing(registry, queue)) as (emu, _client):
        assert [c["name"] for c in emu.commands[None]] == ["kill"]

        channel = str(emu.channel_id)
        for message in ("running", "queued-1", "queued-2"):
            queue.submit(channel, message)
        while ran != ["running"]:
            await asyncio.sleep(0)

        invoked_at = float(looptime)
        body = await _invoke(emu)

        assert body["type"] == 4
        data = body["data"]
        assert isinstance(data, dict)
        assert data["flags"] & EPHEMERAL
        assert data["content"] == "Stopping the reply in this channel. Dropped 2 queued messages."
        assert float(looptime) == invoked_at  # answered without waiting on anything
        assert kills == ["kill"]
        assert queue.pending(channel) == ()
        await queue.join(channel)
        assert ran == ["running"]
        assert channel not in registry


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_kill_with_nothing_running_says_so() -> None:
    # covers D3
    registry = ChannelLockRegistry()

    async def never(message: str, lock: ChannelLock) -> None:
        raise AssertionError("no turn should run")

    queue: ChannelQueue[str] = ChannelQueue(registry, never)
    async with connected_discord(setup=_installing(registry, queue)) as (emu, _client):
        body = await _invoke(emu)
        data = body["data"]
        assert isinstance(data, dict)
        assert data["content"] == "Nothing is running here."
        assert data["flags"] & EPHEMERAL


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_kill_works_in_a_dm() -> None:
    # covers D3
    registry = ChannelLockRegistry()

    async def never(message: str, lock: ChannelLock) -> None:
        raise AssertionError("no turn should run")

    queue: ChannelQueue[str] = ChannelQueue(registry, never)
    async with connected_discord(setup=_installing(registry, queue)) as (emu, _client):
        dm_channel = emu.add_dm_channel(emu.alice_id)
        lock = registry.try_acquire(str(dm_channel), "turn")
        assert lock is not None
        payload = emu.slash_command_payload("kill", channel_id=dm_channel, guild=False)
        assert await emu.gateway.dispatch("INTERACTION_CREATE", payload, guild_id=None)
        body = await _answer_to(emu, payload)
        data = body["data"]
        assert isinstance(data, dict)
        assert data["content"] == "Stopping the reply in this channel."
        assert lock.stop_requested
