"""A real MCP server for the tests, written with the official SDK's low-level `Server` (so it
can also misbehave on purpose): `python tests/mcp_toolbox.py` speaks MCP over stdio, and
`http_app()` is the same server as a streamable-HTTP Starlette app for uvicorn on loopback.

Its tools: `add` and `shout` (ordinary), `fail` (an error result), `hang` (never answers),
`crash` (the process exits mid-call), `big` (a 50,000-character result), `malformed` (over
stdio, a result that is not a valid CallToolResult), `picture` (an image block), and `broken_schema`
(listed with an input schema that is not valid JSON Schema). With `MCP_TOOLBOX_CALLS` set,
each call's tool name is appended to that file, so a test knows the server has the call.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCResponse
from starlette.applications import Starlette

NUMBERS = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
           "required": ["a", "b"]}
TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
NOTHING: dict[str, Any] = {"type": "object", "properties": {}}
TOOLS = [
    types.Tool(name="add", description="Add two integers.", input_schema=NUMBERS),
    types.Tool(name="shout", description="Say the text in capitals.", input_schema=TEXT),
    types.Tool(name="fail", description="Always reports an error.", input_schema=NOTHING),
    types.Tool(name="hang", description="Never answers.", input_schema=NOTHING),
    types.Tool(name="crash", description="Exits the server.", input_schema=NOTHING),
    types.Tool(name="big", description="A very long answer.", input_schema=NOTHING),
    types.Tool(name="malformed", description="Answers nonsense.", input_schema=NOTHING),
    types.Tool(name="picture", description="Answers with an image.", input_schema=NOTHING),
    types.Tool(name="broken_schema", description="Its schema is not JSON Schema.",
               input_schema={"type": "object", "properties": {"x": {"type": "no-such-type"}}}),
]


def _note(name: str) -> None:
    calls = os.environ.get("MCP_TOOLBOX_CALLS")
    if calls:
        with open(calls, "a", encoding="utf-8") as out:
            out.write(name + "\n")


async def _list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
    _note(params.name)
    args = params.arguments or {}
    if params.name == "add":
        return _text(str(int(args["a"]) + int(args["b"])))
    if params.name == "shout":
        return _text(str(args["text"]).upper() + "!")
    if params.name == "fail":
        return types.CallToolResult(content=[types.TextContent(type="text",
                                                               text="the disk is full")],
                                    is_error=True)
    if params.name == "hang":
        await anyio.sleep_forever()
    if params.name == "crash":
        os._exit(3)
    if params.name == "big":
        return _text("x" * 50_000)
    if params.name == "malformed":
        return _text(MALFORMED)  # spoiled on its way out (`_Spoiling`)
    if params.name == "picture":
        return types.CallToolResult(content=[types.ImageContent(
            type="image", data="iVBORw0KGgo=", mime_type="image/png")])
    return types.CallToolResult(content=[types.TextContent(type="text", text="unknown tool")],
                                is_error=True)


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


MALFORMED = "this result is spoiled before it is sent"


class _Spoiling:
    """The stdio write stream, replacing the `malformed` tool's result on the wire with one
    that is no CallToolResult (the SDK's server would never send it; a broken server might)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def send(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, JSONRPCResponse) and MALFORMED in json.dumps(message.result):
            message.result = {"content": "not a list", "isError": "maybe"}
        await self._inner.send(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def __aenter__(self) -> _Spoiling:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


def server() -> Server[Any]:
    return Server("toolbox", on_list_tools=_list_tools, on_call_tool=_call_tool)


def http_app() -> Starlette:
    return server().streamable_http_app()


async def _stdio() -> None:
    app = server()
    async with stdio_server() as (read, write):
        await app.run(read, _Spoiling(write), app.create_initialization_options())


if __name__ == "__main__":
    sys.exit(asyncio.run(_stdio()))
