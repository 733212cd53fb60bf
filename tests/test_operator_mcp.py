"""Tools from real MCP servers (tests/mcp_toolbox.py, written with the official SDK) over
stdio and streamable HTTP on loopback, as engine tools (docs/spec.md M1, M2): their schemas,
allow-lists, errors, malformed results, oversized results, crashes and restarts with
back-off, a server that is not installed. Real processes run in real time (a virtual clock
would fast-forward through the real waits for their bytes); the back-off runs in virtual
time, where nothing real is awaited."""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import uvicorn

from fsm.engine.flags import TurnFlags
from fsm.engine.tools import ToolRegistry, ToolResult
from turn_engine.mcp_tools import BACKOFF_MAX_S, McpServer
from turn_engine.operator_settings import McpServerSettings
from turn_engine.tool_catalog import ToolCatalog

from engine_support import ROOT

pytestmark = pytest.mark.asyncio

TOOLBOX = str(ROOT / "tests" / "mcp_toolbox.py")
BOUND_S = 60.0


def stdio_settings(**options: object) -> McpServerSettings:
    return McpServerSettings.model_validate({"command": sys.executable, "args": [TOOLBOX],
                                             **options})


@asynccontextmanager
async def running(settings: McpServerSettings, tmp_path: Path,
                  name: str = "toolbox") -> AsyncIterator[McpServer]:
    server = McpServer(name, settings, log_dir=tmp_path)
    server.start()
    try:
        await asyncio.wait_for(server.wait_started(), BOUND_S)
        yield server
    finally:
        await server.aclose()


async def call(server: McpServer, name: str, args: dict[str, object] | None = None
               ) -> ToolResult | str:
    registry = ToolRegistry(server.tools)
    tool = registry.get(name)
    assert tool is not None, registry.names()
    parsed = registry.parse_args(tool, args or {})
    if isinstance(parsed, str):
        return parsed
    return await asyncio.wait_for(tool.run(parsed, None), BOUND_S)  # type: ignore[arg-type]


async def test_a_stdio_servers_tools_become_engine_tools_with_their_schemas(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # covers M1: names, descriptions and the server's JSON schemas; a tool whose schema is not
    # valid JSON Schema is left out with one line naming it
    caplog.set_level(logging.WARNING, "turn_engine.mcp_tools")
    async with running(stdio_settings(), tmp_path) as server:
        assert server.state == "running"
        names = [tool.name for tool in server.tools]
        assert names == ["add", "shout", "fail", "hang", "crash", "big", "malformed", "picture"]
        [add] = [s for s in ToolRegistry(server.tools).schemas(TurnFlags()) if s["name"] == "add"]
        assert add == {"name": "add", "description": "Add two integers.", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}}
        [line] = [r.getMessage() for r in caplog.records if "broken_schema" in r.getMessage()]
        assert line.startswith("mcp server toolbox: tool broken_schema skipped: not valid JSON "
                               "Schema at properties/x/type: ")
        assert await call(server, "add", {"a": 2, "b": 40}) == ToolResult.ok({
            "content": "42"})


async def test_allowed_tools_and_a_prefix(tmp_path: Path) -> None:
    # covers M1: the per-server allow-list, and a prefix that keeps two servers apart
    settings = stdio_settings(allowed_tools=["shout", "fail"], prefix="box")
    async with running(settings, tmp_path) as server:
        assert [tool.name for tool in server.tools] == ["box_shout", "box_fail"]
        assert await call(server, "box_shout", {"text": "hi"}) == ToolResult.ok(
            {"content": "HI!"})


async def test_every_failure_is_a_result_the_model_can_read(tmp_path: Path) -> None:
    # covers M1: an error result, a malformed result, arguments that break the schema, an
    # image it cannot show, an oversized result cut like the built-ins' results
    async with running(stdio_settings(max_result_chars=1000), tmp_path) as server:
        assert await call(server, "fail") == ToolResult.fail("the disk is full")
        assert await call(server, "malformed") == ToolResult.fail(
            "the MCP server toolbox returned a malformed result")
        assert await call(server, "add", {"a": "two"}) == (
            "invalid arguments for add: arguments: 'b' is a required property; a: 'two' is "
            "not of type 'integer'")
        assert await call(server, "picture") == ToolResult.ok(
            {"content": "<image image/png, 9 bytes: not shown>"})
        big = await call(server, "big")
        assert isinstance(big, ToolResult) and big.success
        assert big.data["content"] == "x" * 1000 + "\n[cut: 49000 more characters]"
        assert server.state == "running" and server.starts == 1


async def test_a_crash_is_a_failed_call_and_the_server_is_started_again(tmp_path: Path) -> None:
    # covers M2: the process exits mid-call; the model reads a failure, the supervisor starts
    # the server again, and the next call works
    async with running(stdio_settings(), tmp_path) as server:
        crashed = await call(server, "crash")
        assert crashed == ToolResult.fail(
            "the MCP server toolbox closed the connection during the call; it is being "
            "restarted")
        async with asyncio.timeout(BOUND_S):
            while not (server.state == "running" and server.starts == 2):
                await asyncio.sleep(0.05)
        assert await call(server, "add", {"a": 1, "b": 1}) == ToolResult.ok({"content": "2"})


async def test_a_server_not_installed_is_one_clear_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # covers M2: the command does not exist; the bot goes on, the tool is unavailable
    caplog.set_level(logging.ERROR, "turn_engine.mcp_tools")
    settings = McpServerSettings(command="no-such-mcp-server-anywhere")
    async with running(settings, tmp_path, name="weather") as server:
        assert server.state == "restarting" and server.tools == []
        [line] = [r.getMessage() for r in caplog.records]
        assert line == ("mcp server weather: cannot start 'no-such-mcp-server-anywhere': command "
                        "not found (is it installed? check mcp_servers.weather.command); its "
                        "tools are unavailable until it starts (retrying with back-off)")


@pytest.mark.looptime
async def test_restarts_back_off_from_one_second_to_a_minute(tmp_path: Path) -> None:
    # covers M2: the waits between starts double from 1 s and stay at 60 s; one log line per
    # kind of failure, not one per attempt
    loop = asyncio.get_running_loop()
    server = McpServer("weather", McpServerSettings(command="no-such-mcp-server-anywhere"),
                       log_dir=tmp_path)
    started = loop.time()
    server.start()
    attempts: list[float] = []
    while len(attempts) < 9:
        await asyncio.sleep(0.01)
        while server.starts > len(attempts):
            attempts.append(round(loop.time() - started))
    await server.aclose()
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps == [1, 2, 4, 8, 16, 32, BACKOFF_MAX_S, BACKOFF_MAX_S]
    assert server.state == "stopped"


# ---- streamable HTTP --------------------------------------------------------------------------


class HttpToolbox:
    """The toolbox as a streamable-HTTP server on a loopback port of its own, stoppable and
    startable again on the same port."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server: uvicorn.Server | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        from mcp_toolbox import http_app

        self.server = uvicorn.Server(uvicorn.Config(http_app(), log_level="warning",
                                                    lifespan="on"))
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.task = asyncio.create_task(self.server.serve(sockets=[sock]))
        async with asyncio.timeout(BOUND_S):
            while not self.server.started:
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self.server is not None and self.task is not None:
            self.server.should_exit = True
            await self.task
            self.server = self.task = None

    async def __aenter__(self) -> HttpToolbox:
        self.sock.close()
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def test_a_streamable_http_server_and_its_restart(tmp_path: Path) -> None:
    # covers M1, M2: the same tools over HTTP; the server goes away (a failed call, not a
    # crash), comes back on its port, and the client reconnects by itself
    async with HttpToolbox() as http:
        settings = McpServerSettings(url=http.url, allowed_tools=["add"])
        async with running(settings, tmp_path, name="remote") as server:
            assert [t.name for t in server.tools] == ["add"]
            assert await call(server, "add", {"a": 3, "b": 4}) == ToolResult.ok(
                {"content": "7"})
            await http.stop()
            gone = await call(server, "add", {"a": 3, "b": 4})
            assert isinstance(gone, ToolResult) and not gone.success
            assert gone.error is not None and gone.error.startswith("the MCP server remote ")
            await http.start()
            async with asyncio.timeout(BOUND_S):
                while True:
                    again = await call(server, "add", {"a": 5, "b": 5})
                    if again == ToolResult.ok({"content": "10"}):
                        break
                    await asyncio.sleep(0.2)
            assert server.starts >= 2


async def test_the_catalog_starts_changes_and_stops_its_servers(tmp_path: Path) -> None:
    # covers M2, M1: a reload's new settings restart a changed server, start a new one, stop
    # a removed one; names stay unique across servers; everything stops with the bot
    catalog = ToolCatalog(log_dir=tmp_path)
    catalog.configure({"one": stdio_settings(allowed_tools=["add"]),
                       "two": stdio_settings(allowed_tools=["add", "shout"])})
    await asyncio.wait_for(catalog.start(), BOUND_S)
    assert catalog.registry().names() == ["add", "shout"]  # two's add is left out: taken
    first = catalog.servers["one"]
    catalog.configure({"one": stdio_settings(allowed_tools=["fail"]),
                       "three": stdio_settings(allowed_tools=["big"], prefix="x")})
    assert "two" not in catalog.servers and catalog.servers["one"] is not first
    await asyncio.wait_for(asyncio.gather(*(s.wait_started() for s in
                                            catalog.servers.values())), BOUND_S)
    assert catalog.registry().names() == ["fail", "x_big"]
    servers = list(catalog.servers.values())
    await catalog.aclose()
    assert [s.state for s in [*servers, first]] == ["stopped", "stopped", "stopped"]
    assert await call(servers[0], "fail") == ToolResult.fail("the MCP server one is stopped")


@pytest.mark.looptime
async def test_a_server_that_never_answers_at_start_times_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # covers M2: a program that does not speak MCP; after start_timeout_s (virtual: nothing
    # real is awaited once it runs) one line, and the bot goes on without its tools
    caplog.set_level(logging.ERROR, "turn_engine.mcp_tools")
    settings = McpServerSettings(command=sys.executable,
                                 args=["-c", "import time; time.sleep(600)"],
                                 start_timeout_s=30)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with running(settings, tmp_path, name="mute") as server:
        assert loop.time() - started >= 30
        assert server.state == "restarting" and server.tools == []
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"mcp server mute: did not start within 30 s (its stderr is in "
                           f"{tmp_path / 'mcp-mute.log'})")
