"""The bot with its operator's side (models and personas per channel, a real SQLite store,
tools, usage), started as production starts it against the Discord emulator, and slash
commands with options and autocomplete sent through the emulated gateway.

A bot can be stopped and a new one started against the same emulator and store file: what a
restart keeps is then seen through the gateway as a user sees it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway_support import CALLBACK, DELIVERY_TIMEOUT_S, Harness

from discord_io.testing import DiscordEmulator
from discord_io.testing.emulator import pointed_at, running_client
from fsm.engine.generation import Attempt
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import ScriptedProvider
from turn_engine.bot import TurnBot, build_client
from turn_engine.operator_settings import ManageSettings, UsageSettings
from turn_engine.operator_side import OperatorConfig, OperatorSide
from turn_engine.persona_library import NamedPersona
from turn_engine.settings_store import SettingsStore
from turn_engine.sqlite_store import SqliteStore
from turn_engine.tool_catalog import ToolCatalog

MANAGE_GUILD = 1 << 5
MANAGE_MESSAGES = 1 << 13
DEFAULT_PROMPT = "You are the default persona."

Passes = list[list[dict[str, Any]]]


def answers(*texts: str, usage: tuple[int, int] | None = None) -> Passes:
    """One pass per text, each completing; with `usage`, each reports those tokens."""
    passes: Passes = []
    for text in texts:
        steps: list[dict[str, Any]] = [{"at": 1, "text": text}]
        if usage is not None:
            steps.append({"at": 1.5, "usage": {"input_tokens": usage[0],
                                               "output_tokens": usage[1]}})
        steps.append({"at": 2, "end": "completed"})
        passes.append(steps)
    return passes


@dataclass
class OperatorHarness:
    h: Harness
    side: OperatorSide
    providers: dict[str, ScriptedProvider]
    replies: list[str] = field(default_factory=list)

    @property
    def emu(self) -> DiscordEmulator:
        return self.h.emu

    async def command(self, name: str, options: Mapping[str, str | int] | None = None, *,
                      user: int | None = None, permissions: int = 0,
                      channel: int | None = None) -> str:
        """A user runs `/name` with `options`; the text of the bot's (ephemeral) answer."""
        payload = self.payload(name, options, user=user, permissions=permissions,
                               channel=channel)
        await self._dispatch(payload)
        [answer] = await self.emu.wait_for(
            lambda r: r.route == CALLBACK and r.params.get("interaction_id") == payload["id"],
            timeout=DELIVERY_TIMEOUT_S)
        body = answer.json
        assert body["type"] == 4 and body["data"]["flags"] & 64, body  # ephemeral
        return str(body["data"]["content"])

    async def autocomplete(self, name: str, option: str, typed: str, *,
                           user: int | None = None) -> list[str]:
        """A user types `typed` into `/name`'s `option`; the choices the bot offers."""
        payload = self.payload(name, {option: typed}, user=user)
        payload["type"] = 4
        payload["data"]["options"][0]["focused"] = True
        await self._dispatch(payload)
        [answer] = await self.emu.wait_for(
            lambda r: r.route == CALLBACK and r.params.get("interaction_id") == payload["id"],
            timeout=DELIVERY_TIMEOUT_S)
        assert answer.json["type"] == 8, answer.json
        return [choice["value"] for choice in answer.json["data"]["choices"]]

    def payload(self, name: str, options: Mapping[str, str | int] | None, *,
                user: int | None = None, permissions: int = 0,
                channel: int | None = None) -> dict[str, Any]:
        return command_payload(self.emu, name, options, user=user, permissions=permissions,
                               channel=channel)

    async def _dispatch(self, payload: dict[str, Any]) -> None:
        await dispatch_interaction(self.emu, payload)

    def bot_replies(self) -> list[str]:
        return [str(m["content"]) for m in self.h.bot_messages() if m.get("content")]


def command_payload(emu: DiscordEmulator, name: str,
                    options: Mapping[str, str | int] | None, *, user: int | None = None,
                    permissions: int = 0, channel: int | None = None) -> dict[str, Any]:
    """INTERACTION_CREATE for `/name` with `options` (strings and integers), as Discord sends
    it (the application command's `data.options`)."""
    channel_id = channel if channel is not None else emu.channel_id
    in_guild = emu.channels[channel_id].get("guild_id") is not None
    payload = emu.slash_command_payload(name, channel_id=channel_id, user_id=user,
                                        guild=in_guild, permissions=permissions)
    if options:
        payload["data"]["options"] = [
            {"name": key, "type": 4 if isinstance(value, int) else 3, "value": value}
            for key, value in options.items()]
    return payload


async def dispatch_interaction(emu: DiscordEmulator, payload: dict[str, Any]) -> None:
    guild = payload.get("guild_id")
    await emu.gateway.dispatch("INTERACTION_CREATE", payload,
                               guild_id=int(guild) if guild is not None else None)


@asynccontextmanager
async def operator_discord() -> AsyncIterator[DiscordEmulator]:
    """A started emulator (one shard) with bob as a second member; discord.py pointed at it."""
    emu = DiscordEmulator()
    emu.gateway.shards = 1
    emu.add_user("bob")
    await emu.start()
    failed = False
    try:
        with pointed_at(emu):
            yield emu
    except BaseException:
        failed = True
        raise
    finally:
        await emu.stop(check=not failed)


def scripted(models: Mapping[str, Passes]) -> dict[str, ScriptedProvider]:
    return {name: ScriptedProvider(parse_scenario({"passes": passes}).passes)
            for name, passes in models.items()}


@asynccontextmanager
async def operator_bot(
    emu: DiscordEmulator, store_path: Path, models: Mapping[str, Passes], *,
    personas: Mapping[str, NamedPersona] | None = None, manage: ManageSettings | None = None,
    usage: UsageSettings | None = None, catalog: ToolCatalog | None = None,
    store: SettingsStore | None = None, default_prompt: Callable[[], str] = lambda: DEFAULT_PROMPT,
    **bot_options: Any,
) -> AsyncIterator[OperatorHarness]:
    """A bot whose models are scripted providers (labelled `scripted:NAME`), its choices in
    the SQLite file `store_path` (or `store`), started through the gateway; closed on exit."""
    providers = scripted(models)
    config = OperatorConfig(
        models={name: [Attempt(p, f"scripted:{name}")] for name, p in providers.items()},
        personas=dict(personas or {}), default_prompt=default_prompt,
        manage=manage or ManageSettings(), usage=usage or UsageSettings())
    if store is None:
        store = SqliteStore(store_path)
        await store.open()
    side = OperatorSide(config, store, catalog if catalog is not None else ToolCatalog())
    client = build_client()
    bot = TurnBot(client, config.models["default"], operator=side, **bot_options)
    bot.attach()

    async def setup_hook() -> None:
        await bot.start()

    client.setup_hook = setup_hook  # type: ignore[method-assign]
    bob = next(int(u["id"]) for u in emu.users.values() if u["username"] == "bob")
    try:
        async with running_client(emu, client):
            harness = Harness(emu, client, bot, providers["default"], 0, 0, bob)
            yield OperatorHarness(harness, side, providers)
    finally:
        await bot.aclose()


async def until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(DELIVERY_TIMEOUT_S):
        while not done():
            await asyncio.sleep(0.01)
