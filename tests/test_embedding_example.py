"""The embedding example (docs/embedding.md, examples/embedded_bot.py) runs: a discord.py bot
of its own, started with `client.start()` through the emulated gateway as its `main()` runs it,
answers a mention the gateway dispatches, through the public API, with the real
OpenAI-compatible adapter against a loopback server (covers S2, D1, G1).
Also: the public API is importable from the packages and they ship `py.typed`."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from types import ModuleType
from typing import Any

import pytest

import fsm
from discord_io.testing import connected_discord
from providers import ProviderConfig
from providers.replay_server import ReplayServer

from engine_support import ROOT

FIXTURE = ROOT / "tests" / "fixtures" / "sse" / "openai" / "plain_text.sse"
EXPECTED = json.loads((ROOT / "tests" / "fixtures" / "sse" / "expected.json").read_text())
SEND = "POST /channels/{channel_id}/messages"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("embedded_bot",
                                                  ROOT / "examples" / "embedded_bot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_the_example_bot_answers_a_mention_through_the_engine() -> None:
    # covers S2 (a queued turn replies to its trigger), D1, G1 with one attempt
    example = _example()
    async with ReplayServer(FIXTURE.read_bytes()) as model_server:
        model = ProviderConfig(kind="openai", base_url=f"{model_server.url}/v1", model="m")
        async with connected_discord(client_factory=lambda: example.EngineReplyBot(model)) \
                as (emu, client):
            bot: Any = client  # the example's EngineReplyBot, loaded from its file
            trigger = await emu.gateway.message_create(
                emu.channel_id, emu.alice_id, f"<@{emu.bot_id}> hello there",
                mentions=[emu.bot_id])
            await emu.wait_for(lambda r: r.route == SEND)
            async with asyncio.timeout(5):  # the loop's (virtual) clock
                while not bot.results:  # the turn returns just after its last send
                    await asyncio.sleep(0)
        [result] = bot.results
        assert result.status == "completed", result
        [sent] = [r.json for r in emu.requests_to(SEND, status=200)]
        assert sent["content"] == EXPECTED["openai"]["plain_text"]["text"]
        assert str(sent["message_reference"]["message_id"]) == str(trigger["id"])
        [asked] = model_server.requests
        assert asked.json()["messages"][-1]["content"].endswith("hello there")
        assert str(emu.channel_id) not in bot.locks  # released after the turn


def test_the_public_api_is_exported_and_typed() -> None:
    # covers no SPEC behaviour: the packaging rule of issue 13 (a stable surface, py.typed)
    for name in fsm.__all__:
        assert getattr(fsm, name) is not None, name
    assert {"Turn", "TurnConfig", "Provider", "TurnChannel", "FunctionTool",
            "TurnResult", "run_generation_turn"} <= set(fsm.__all__)
    for package in ("fsm", "providers", "discord_io", "turn_engine"):
        assert (ROOT / package / "py.typed").is_file(), package
