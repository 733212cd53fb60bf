"""The bot as a process of its own, for the signal tests: the Discord emulator and a model
that streams one paragraph and then hangs, both on loopback in this process, and
`turn_engine.bot.serve` answering a mention, on the event loop argv[2] names as the bot's
runner makes it (D55). Prints STREAMING once the model has the request, then waits for
SIGTERM or SIGINT like the real bot; exits with serve's status."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from discord_io.testing import DiscordEmulator
from discord_io.testing.emulator import pointed_at
from providers.replay_server import Hang, ReplayServer, Send
from turn_engine.bot import build_client, serve
from turn_engine.event_loop import EventLoopChoice, run_on_event_loop
from turn_engine.logging_setup import setup_logging
from turn_engine.settings import AppSettings

CHUNK = {"choices": [{"index": 0, "delta": {"content": "Delivered.\n\n"},
                      "finish_reason": None}]}


async def main(journals: Path) -> int:
    async with ReplayServer([Send(f"data: {json.dumps(CHUNK)}\n\n".encode()), Hang()]) as model:
        emu = DiscordEmulator()
        await emu.start()
        with pointed_at(emu):
            settings = AppSettings.model_validate({
                "discord_token": emu.token, "journals": {"dir": str(journals)},
                "data_dir": str(journals.parent / "data"),
                "provider": {"kind": "openai", "model": "local", "base_url": model.url + "/v1"}})
            client = build_client()
            serving = asyncio.create_task(serve(settings, client=client))
            while not client.is_ready():
                await asyncio.sleep(0.05)
            await emu.gateway.message_create(emu.channel_id, emu.alice_id,
                                             f"<@{emu.bot_id}> hello", mentions=[emu.bot_id])
            while not model.requests:
                await asyncio.sleep(0.05)
            print("STREAMING", flush=True)
            code = await serving
        await emu.stop()
    return code


if __name__ == "__main__":
    setup_logging()
    choice: EventLoopChoice = "asyncio" if sys.argv[2] == "asyncio" else "uvloop"
    sys.exit(run_on_event_loop(main(Path(sys.argv[1])), choice))
