"""A tiny discord.py bot of its own that answers mentions with the turn engine.

It uses only the public API (`fsm`, `providers`, `discord_io`): one `DiscordChannel` per
reply, one channel lock per channel, and a generation turn over one OpenAI-compatible model.
docs/embedding.md walks through it. Run it against a real server:

    DISCORD_TOKEN=... MODEL_BASE_URL=http://127.0.0.1:8080/v1 MODEL=llama \
        .venv/bin/python examples/embedded_bot.py
"""

from __future__ import annotations

import os

import aiohttp
import discord

from discord_io import DiscordChannel
from fsm import (
    Attempt,
    ChannelLockRegistry,
    GenerationResult,
    TurnConfig,
    TurnRequest,
    run_generation_turn,
)
from providers import ProviderConfig, build_provider


class EngineReplyBot(discord.Client):
    """Replies to every message that mentions it; one turn per channel at a time."""

    def __init__(self, model: ProviderConfig, *, config: TurnConfig | None = None) -> None:
        intents = discord.Intents.default()
        intents.message_content = True
        super().__init__(intents=intents)
        self.model = model
        self.config = config or TurnConfig()
        self.locks = ChannelLockRegistry()
        self.results: list[GenerationResult] = []
        self._session: aiohttp.ClientSession | None = None

    async def setup_hook(self) -> None:
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        await super().close()
        if self._session is not None:
            await self._session.close()

    async def on_message(self, message: discord.Message) -> None:
        me = self.user
        if me is None or message.author.id == me.id or me not in message.mentions:
            return
        lock = self.locks.try_acquire(str(message.channel.id), str(message.id))
        if lock is None:
            await message.reply("Still answering the last message here.")
            return
        assert self._session is not None
        channel = DiscordChannel(self, message.channel.id, reply_to=message.id)
        try:
            request = TurnRequest(
                context_items=[{"role": "user", "content": message.clean_content}],
                system_prompt="You are a helpful Discord bot.",
                trigger_message_id=str(message.id), queued=True, owner=me.name,
            )
            attempt = Attempt(build_provider(self.model, self._session), self.model.model)
            self.results.append(await run_generation_turn(
                [attempt], channel=channel, locks=self.locks, lock=lock, request=request,
                config=self.config))
        finally:
            await channel.aclose()
            self.locks.release(lock)


def main() -> None:
    model = ProviderConfig(kind="openai", base_url=os.environ["MODEL_BASE_URL"],
                           model=os.environ.get("MODEL", "default"))
    EngineReplyBot(model).run(os.environ["DISCORD_TOKEN"])


if __name__ == "__main__":
    main()
