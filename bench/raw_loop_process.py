"""The floor of the full-bot benchmark: the bot a user would write by hand — plain discord.py
and aiohttp, no engine — streaming the same reply into the same channels (BENCHMARKS.md 7).

On a mention it shows "typing" while it works, reads the channel's last 20 messages for the
prompt, streams the model's answer over aiohttp (OpenAI's SSE: one `data:` line a chunk,
`json.loads` each), cuts a message at the last paragraph break once 2,000 characters are
buffered and sends it, then sends the rest. No journal, no kill, no queue, no access lists:
what it leaves out favours it. It records its sends' calls and its turns' ends like
`full_bot_process`, and writes them with its CPU time as JSON on SIGTERM.

`python -m bench.raw_loop_process CONFIG_JSON` (written by `bench.full_bot`).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

import aiohttp
import discord

from .common import run_async
from .full_bot_process import prepared, write_result
from .profiling import profile_async

LIMIT = 2000


def _cut(buffer: str) -> tuple[str, str]:
    """A message's worth from the front of `buffer` (at the last paragraph break inside the
    limit, else at the limit), and what is left."""
    at = buffer.rfind("\n\n", 0, LIMIT)
    if at <= 0:
        at = LIMIT
    return buffer[:at].strip(), buffer[at:].lstrip()


async def _answer(session: aiohttp.ClientSession, url: str, message: discord.Message,
                  ends: list[dict[str, Any]]) -> None:
    channel = message.channel
    async with channel.typing():
        history = [m async for m in channel.history(limit=20)]
        prompt = [{"role": "user", "content": m.content} for m in reversed(history)]
        buffer = ""
        body = {"model": "bench", "stream": True, "messages": prompt}
        async with session.post(f"{url}/chat/completions", json=body) as response:
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                for choice in json.loads(line[6:]).get("choices", ()):
                    buffer += choice.get("delta", {}).get("content") or ""
                while len(buffer) > LIMIT:
                    text, buffer = _cut(buffer)
                    await channel.send(text)
        if buffer.strip():
            await channel.send(buffer.strip())
    ends.append({"at": time.monotonic(), "status": "completed", "channel": str(channel.id)})


def main() -> int:
    config, calls = prepared()
    ends: list[dict[str, Any]] = []

    async def serve() -> None:
        intents = discord.Intents(guilds=True, guild_messages=True, message_content=True)
        client = discord.AutoShardedClient(intents=intents)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def on_message(message: discord.Message) -> None:
                if client.user is not None and client.user in message.mentions:
                    await _answer(session, config["provider_url"], message, ends)

            client.event(on_message)
            running = asyncio.create_task(client.start(config["token"]))
            await stop.wait()
            await client.close()
            await asyncio.wait({running}, timeout=5)

    profile: dict[str, Any] | None = None
    if config.get("profile"):  # the floor's profile, beside the bot's (BENCHMARKS.md 7g)
        profile = profile_async(serve, per=max(1, int(config["turns"])), top=20,
                                timer=time.process_time)
    else:
        run_async(serve)
    write_result(config, ends, calls, profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
