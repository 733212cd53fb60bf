"""A loopback OpenAI-compatible model that streams at a model's pace, for the full-bot
benchmark: every POST to /v1/chat/completions gets `chunks` content chunks of the reply text,
one every `interval_s`, then a stop chunk, usage and `[DONE]` — many streams at once, each on
its own timers. It records when each request arrived (`arrivals`)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from .sse_server import sse


class PacedProvider:
    """The server and what it saw; `start()` returns the base URL (``.../v1``)."""

    def __init__(self, text: str, chunk_chars: int, interval_s: float) -> None:
        self.pieces = [text[i:i + chunk_chars] for i in range(0, len(text), chunk_chars)]
        self.interval_s = interval_s
        self.arrivals: list[float] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append(time.monotonic())
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk",
                "created": 1_700_000_000, "model": "bench"}
        await response.write(sse({**base, "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""},
             "finish_reason": None}]}))
        try:
            for piece in self.pieces:
                await asyncio.sleep(self.interval_s)
                await response.write(sse({**base, "choices": [
                    {"index": 0, "delta": {"content": piece}, "finish_reason": None}]}))
            await response.write(sse({**base, "choices": [
                {"index": 0, "delta": {}, "finish_reason": "stop"}]}))
            await response.write(sse({**base, "choices": [], "usage": {
                "prompt_tokens": 12, "completion_tokens": len(self.pieces),
                "total_tokens": len(self.pieces) + 12}}))
            await response.write(sse("[DONE]"))
            await response.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass  # the bot hung up (a /kill): nothing more to stream
        return response
