"""The bot as a process of its own for the live-reload tests: the Discord emulator and a
model that answers every request, both on loopback in this process, and
`turn_engine.bot.serve` with the settings of `turn.toml` in the working directory (the
provider and the token come from the environment, which a reload does not change).

Reads commands on stdin, one per line, and answers each on stdout once the bot has:
`ask TEXT` (a mention; prints `REPLY {"system": ...}`, the operator's part of the system
prompt the model got) and `persona NAME` (/persona NAME for the whole server, by a member
with Manage Server; prints `ANSWER text`). At the end of stdin it waits for SIGTERM like the
real bot and exits with serve's status. Prints READY once the bot is connected."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from operator_support import MANAGE_GUILD, command_payload, dispatch_interaction

from discord_io.testing import DiscordEmulator
from discord_io.testing.emulator import pointed_at
from fsm.engine.user_text import CHAT_FRAMING
from providers.replay_server import ReplayServer, Send
from turn_engine.bot import build_client, serve
from turn_engine.logging_setup import setup_logging
from turn_engine.settings import load_settings

CALLBACK = "POST /interactions/{interaction_id}/{token}/callback"
ANSWER = [{"choices": [{"index": 0, "delta": {"content": "Answered."}, "finish_reason": None}]},
          {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]


def _body() -> bytes:
    return b"".join(f"data: {json.dumps(event)}\n\n".encode() for event in ANSWER) + \
        b"data: [DONE]\n\n"


async def _until(done: Any) -> None:
    async with asyncio.timeout(60):
        while not done():
            await asyncio.sleep(0.02)


async def _commands(emu: DiscordEmulator, model: ReplayServer) -> None:
    while line := await asyncio.to_thread(sys.stdin.readline):
        verb, _, rest = line.strip().partition(" ")
        if verb == "ask":
            asked, sent = len(model.requests), len(emu.sent())
            await emu.gateway.message_create(emu.channel_id, emu.alice_id,
                                             f"<@{emu.bot_id}> {rest}", mentions=[emu.bot_id])
            await _until(lambda asked=asked, sent=sent: len(model.requests) > asked
                         and len(emu.sent()) > sent)
            messages = model.requests[-1].json()["messages"]
            system = next((m["content"] for m in messages if m["role"] == "system"), "")
            persona = system.removesuffix(CHAT_FRAMING).rstrip("\n")  # the operator's part
            print("REPLY " + json.dumps({"system": persona}), flush=True)
        elif verb == "persona":
            payload = command_payload(emu, "persona", {"name": rest, "where": "server"},
                                      permissions=MANAGE_GUILD)
            await dispatch_interaction(emu, payload)
            [answer] = await emu.wait_for(
                lambda r, wanted=payload["id"]: r.route == CALLBACK
                and r.params.get("interaction_id") == wanted,
                timeout=60)
            print("ANSWER " + str(answer.json["data"]["content"]), flush=True)


async def main() -> int:
    setup_logging()
    async with ReplayServer([Send(_body())]) as model:
        emu = DiscordEmulator()
        await emu.start()
        with pointed_at(emu):
            os.environ["TURN_DISCORD_TOKEN"] = emu.token
            os.environ["TURN_PROVIDER"] = json.dumps(
                {"kind": "openai", "model": "local", "base_url": model.url + "/v1"})
            client = build_client()
            serving = asyncio.create_task(serve(load_settings(), client=client))
            await _until(client.is_ready)
            print("READY", flush=True)
            await _commands(emu, model)
            code = await serving
        await emu.stop(check=False)
    return code


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
