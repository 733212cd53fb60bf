"""One bot worker process for the Redis backend's process tests: the real `TurnBot` with a
scripted model, logged in to the Discord emulator the test runs, sharing channels through
redis-server with the other workers.

The test drives it over stdin, one JSON line each: {"op": "message"|"interaction", "payload":
...} is handed to discord.py's parser as the gateway would hand it (the test chooses which
worker receives each event, as a gateway proxy or two sessions of one shard during a deploy
would, which one emulated gateway session per shard cannot); {"op": "quit"} shuts it down.
It reports on stdout, one JSON line each: ready, a message submitted, turn start and end (at
the system-wide monotonic time, so the test compares workers), and the backend's warnings.
Its journals go to the folder the test names.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import discord

from discord_io.redis_backend.fence import fencing_trace
from discord_io.redis_backend.lease import LeaseTimings
from fsm.engine.generation import Attempt
from fsm.engine.locks import ChannelLock
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import ScriptedProvider
from turn_engine.bot import TurnBot
from turn_engine.scale_out import attach_scale_out


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, "at": time.monotonic(), **fields}) + "\n")
    sys.stdout.flush()


class EmitWarnings(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        emit("log", logger=record.name, message=record.getMessage())


async def main(config: dict[str, Any]) -> None:
    discord.http.Route.BASE = config["emulator"]
    client = discord.Client(intents=discord.Intents.default(), http_trace=fencing_trace())
    await client.login(config["token"])
    provider = ScriptedProvider(parse_scenario({"passes": config["passes"]}).passes)
    bot = TurnBot(client, [Attempt(provider, "scripted")], journal_dir=Path(config["journals"]))
    run_turn = bot.run_turn

    async def reported_turn(message: discord.Message, lock: ChannelLock) -> None:
        emit("start", message=str(message.id), channel=str(message.channel.id),
             owner=lock.owner)
        before = len(bot.results)
        try:
            await run_turn(message, lock)
        finally:
            status = bot.results[-1].status if len(bot.results) > before else "none"
            emit("end", message=str(message.id), channel=str(message.channel.id),
                 status=status)

    bot.run_turn = reported_turn  # type: ignore[method-assign]
    admit = bot.on_message

    async def on_message(message: discord.Message) -> None:
        await admit(message)
        emit("submitted", message=str(message.id))

    bot.on_message = on_message  # type: ignore[method-assign]
    timings = LeaseTimings(ttl_s=config["ttl_s"], renew_every_s=config["renew_every_s"])
    attach_scale_out(bot, config["redis"], worker_id=config["worker"], timings=timings)
    bot.attach()
    await bot.start()
    emit("ready", worker=config["worker"])
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command = json.loads(line)
            if command["op"] == "message":
                client._connection.parse_message_create(command["payload"])
            elif command["op"] == "interaction":
                client._connection.parse_interaction_create(command["payload"])
            elif command["op"] == "quit":
                break
    finally:
        await bot.shutdown(1.0)
        await client.close()
        emit("closed")


if __name__ == "__main__":
    handler = EmitWarnings(level=logging.WARNING)
    logging.getLogger("discord_io.redis_backend").addHandler(handler)
    logging.getLogger("discord_io.redis_backend").setLevel(logging.WARNING)
    asyncio.run(main(json.loads(sys.argv[1])))
