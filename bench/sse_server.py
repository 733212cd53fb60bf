"""A loopback OpenAI-compatible streaming server for the HTTP benchmark, run as its own
process (`python -m bench.sse_server CHUNKS`) so its work is not on the measured client's
core. Every POST gets `CHUNKS` `chat.completion.chunk` events, one write each, then a stop
chunk, a usage chunk and `[DONE]`. It prints its port, serves 127.0.0.1 only, and exits when
its standard input closes or after `MAX_LIFETIME_S`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from .common import ROOT
from .workload import chunk_texts

MAX_LIFETIME_S = 900.0


def sse(payload: dict[str, object] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def events(chunks: int) -> list[bytes]:
    """The response body, one SSE event per item, as an OpenAI server sends it."""
    created = 1_700_000_000
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": created,
            "model": "bench"}
    out = [sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "finish_reason": None}]})]
    out += [sse({**base, "choices": [{"index": 0, "delta": {"content": text},
                                      "finish_reason": None}]})
            for text in chunk_texts(chunks)]
    out.append(sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    out.append(sse({**base, "choices": [], "usage": {"prompt_tokens": 12,
                                                     "completion_tokens": chunks,
                                                     "total_tokens": chunks + 12}}))
    out.append(sse("[DONE]"))
    return out


async def serve(chunks: int) -> None:
    body = events(chunks)

    async def handle(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        for item in body:
            await response.write(item)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    stdin_closed = loop.run_in_executor(None, sys.stdin.read)
    try:
        await asyncio.wait_for(stdin_closed, MAX_LIFETIME_S)
    except TimeoutError:
        pass
    finally:
        await runner.cleanup()


@contextmanager
def running(chunks: int) -> Iterator[str]:
    """Start the server in its own process; yields its base URL (`.../v1`)."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.sse_server", str(chunks)],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        line = proc.stdout.readline()
        if not line.strip().isdigit() or time.monotonic() > deadline:
            raise RuntimeError(f"SSE server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line)}/v1"
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
