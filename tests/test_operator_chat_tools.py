"""The terminal chat offers the bot's tools (docs/spec.md M11): `python -m turn_engine` with a
provider and an MCP server (tests/mcp_toolbox.py over stdio) against a loopback model server
that streams a real OpenAI tool-call delta, then text; the tool runs on the MCP server and
the model's next request carries its result. A tool call the model writes as text is never
printed as the reply. Real processes, real time; timeouts only bound a hang."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from turn_engine.chat_tools import TOOL_CALL_AS_TEXT, ToolCallText

from engine_support import ROOT

TOOLBOX = str(ROOT / "tests" / "mcp_toolbox.py")


def _sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


def _text(text: str) -> bytes:
    return _sse({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})


CALL_ADD = _sse(
    {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function",
         "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})


@asynccontextmanager
async def model_answering(*bodies: bytes) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """An OpenAI-compatible streaming endpoint on loopback answering `bodies` in turn (what
    a real server sends: chat.completion.chunk events); yields its URL and the requests."""
    requests: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        requests.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(bodies[min(len(requests), len(bodies)) - 1])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", requests
    finally:
        await runner.cleanup()


async def _chat(tmp_path: Path, url: str, typed: bytes) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TURN_")}
    env.update(PYTHONPATH=str(ROOT), TURN_LOG__LEVEL="WARNING",
               TURN_JOURNALS__DIR=str(tmp_path / "j"), TURN_DATA_DIR=str(tmp_path / "data"),
               TURN_PROVIDER=json.dumps({"kind": "openai", "model": "m", "base_url": url + "/v1"}),
               TURN_MCP_SERVERS=json.dumps({"toolbox": {
                   "command": sys.executable, "args": [TOOLBOX],
                   "allowed_tools": ["add", "shout"]}}))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "turn_engine", cwd=tmp_path, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(typed), 120)
    assert proc.returncode == 0, err.decode()
    return out.decode(), err.decode()


@pytest.mark.asyncio
async def test_the_chat_runs_an_mcp_tool_the_model_calls(tmp_path: Path) -> None:
    # covers M11: the same tools as the bot, the call run on the MCP server, its result in
    # the next request
    async with model_answering(CALL_ADD, _text("2 + 3 = 5.")) as (url, requests):
        out, err = await _chat(tmp_path, url, b"what is 2 + 3?\n/quit\n")
    offered = [tool["function"]["name"] for tool in requests[0]["tools"]]
    assert offered == ["peek_profile_picture", "process_gif", "process_youtube_link",
                       "reveal_message_metadata", "add", "shout"]
    assert "Tools: peek_profile_picture, process_gif" in err
    tool_messages = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 1 and '"content": "5"' in tool_messages[0]["content"]
    assert "bot> 2 + 3 = 5." in out


@pytest.mark.asyncio
async def test_a_tool_call_written_as_text_is_not_printed_as_the_reply(tmp_path: Path) -> None:
    # covers M11: a server that did not parse the model's <tool_call> sends it as text
    raw = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    async with model_answering(_text(raw)) as (url, _requests):
        out, err = await _chat(tmp_path, url, b"add 1 and 2\n/quit\n")
    assert "<tool_call>" not in out and '"arguments"' not in out
    assert TOOL_CALL_AS_TEXT in err


def test_tool_call_text_is_taken_out_across_chunk_boundaries() -> None:
    # covers M11: a block split anywhere is held back, the text around it kept
    text = "Let me check. <tool_call>{\"name\": \"add\"}</tool_call> Done < not a tag"
    for cut in range(1, len(text)):
        seen = ToolCallText()
        shown = seen.feed(text[:cut]) + seen.feed(text[cut:]) + seen.flush()
        assert shown == "Let me check.  Done < not a tag", cut
        assert seen.take_seen()
    plain = ToolCallText()
    assert plain.feed("a <tool") + plain.flush() == "a <tool"
    assert not plain.take_seen()
