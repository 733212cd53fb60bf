"""A loopback HTTP server that replays a recorded response, timing directives included.

Every request (any method, any path) gets the same recorded body, so one server stands in
for any provider endpoint. Lines starting with `:@` are directives, acted on and not sent:

- `:@pause N` sleeps N seconds before the rest is sent;
- `:@hang` stops sending but keeps the connection open until the client leaves.

Everything else is sent byte for byte, line endings included, one write per line so the
client sees realistic chunking. The end of the script closes the connection. The server
records each request and notices when a client disconnects early, which is how tests prove
that an abort really closed the connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiohttp import web

SSE_CONTENT_TYPE = "text/event-stream"


@dataclass(frozen=True, slots=True)
class Send:
    data: bytes


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class Hang:
    pass


Step = Send | Pause | Hang


def parse_script(data: bytes) -> list[Step]:
    """Split a recording into sends and directives; a bad directive raises ValueError."""
    steps: list[Step] = []
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        if not line.startswith(b":@"):
            steps.append(Send(line))
            continue
        name, _, argument = line[2:].decode("utf-8", errors="replace").strip().partition(" ")
        if name == "hang":
            steps.append(Hang())
        elif name == "pause":
            try:
                seconds = float(argument)
            except ValueError:
                raise ValueError(
                    f"line {number}: ':@pause' needs seconds, got {argument!r}"
                ) from None
            if seconds < 0:
                raise ValueError(f"line {number}: ':@pause' needs a non-negative duration")
            steps.append(Pause(seconds))
        else:
            raise ValueError(f"line {number}: unknown replay directive ':@{name}'")
    return steps


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class ReplayServer:
    """`async with ReplayServer(script) as server:` then send requests to `server.url`."""

    def __init__(
        self,
        script: bytes | Sequence[Step],
        *,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        content_type: str = SSE_CONTENT_TYPE,
    ) -> None:
        self.steps: list[Step] = parse_script(script) if isinstance(script, bytes) else list(script)
        self._status = status
        self._headers = dict(headers or {})
        self._content_type = content_type
        self.requests: list[RecordedRequest] = []
        self.completed = 0
        """Responses sent to the end of the script."""
        self.disconnected = 0
        """Responses cut short because the client went away."""
        self.client_gone = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self._port = int(self._runner.addresses[0][1])

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ReplayServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(
            RecordedRequest(
                request.method,
                request.path,
                dict(request.query),
                dict(request.headers),
                await request.read(),
            )
        )
        response = web.StreamResponse(
            status=self._status,
            headers={"Content-Type": self._content_type, "Cache-Control": "no-cache"},
        )
        response.headers.update(self._headers)
        response.force_close()
        try:
            await response.prepare(request)
            for step in self.steps:
                if isinstance(step, Send):
                    await response.write(step.data)
                elif isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                else:
                    await asyncio.get_running_loop().create_future()
            await response.write_eof()
        except asyncio.CancelledError:
            if request.transport is None or request.transport.is_closing():
                self._client_left()
            raise
        except ConnectionError:
            self._client_left()
            return response
        self.completed += 1
        return response

    def _client_left(self) -> None:
        self.disconnected += 1
        self.client_gone.set()
