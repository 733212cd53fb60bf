"""MCP and Python-hook tools answering through the bot on the emulated gateway (docs/spec.md
M1, M2): a scripted model calls a real MCP server's tool (tests/mcp_toolbox.py over stdio),
reads the result in its next pass and answers; a hanging tool is stopped by the engine's
per-tool timeout (in virtual time once the server has the call) or by /kill, and the server
goes on serving; a tool's loop policy (T9) is honoured; a hook's FunctionTool runs like the
built-ins. Real processes, real time elsewhere."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from operator_support import OperatorHarness, operator_bot, operator_discord, until

from fsm.engine.config import TurnConfig
from turn_engine.operator_settings import McpServerSettings
from turn_engine.settings import ConfigurationError
from turn_engine.tool_catalog import ToolCatalog
from turn_engine.tool_hooks import load_hook_tools

from engine_support import ROOT

TOOLBOX = str(ROOT / "tests" / "mcp_toolbox.py")


def tool_then_text(tool: str, args: dict[str, Any], text: str) -> list[list[dict[str, Any]]]:
    return [[{"at": 0.01, "tool_call": {"name": tool, "args": args, "id": "c1"}},
             {"at": 0.02, "end": "completed"}],
            [{"at": 0.01, "text": text}, {"at": 0.02, "end": "completed"}]]


@asynccontextmanager
async def bot_with_toolbox(tmp_path: Path, passes: list[list[dict[str, Any]]],
                           **server: Any) -> AsyncIterator[OperatorHarness]:
    calls = tmp_path / "calls.txt"
    catalog = ToolCatalog(log_dir=tmp_path)
    catalog.configure({"toolbox": McpServerSettings.model_validate({
        "command": sys.executable, "args": [TOOLBOX],
        "env": {"MCP_TOOLBOX_CALLS": str(calls)}, **server})})
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", {"default": passes}, catalog=catalog,
            config=TurnConfig(tool_timeout_s=20)) as o:
        await until(lambda: bool(catalog.servers["toolbox"].tools))
        yield o


def calls_seen(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls.txt"
    return path.read_text().split() if path.exists() else []


@pytest.mark.asyncio
async def test_the_model_calls_an_mcp_tool_and_answers_with_its_result(tmp_path: Path) -> None:
    # covers M1: the tool is offered with the server's schema, runs on the server, and its
    # result is in the model's next pass
    passes = tool_then_text("add", {"a": 2, "b": 3}, "2 + 3 is 5.")
    async with bot_with_toolbox(tmp_path, passes) as o:
        await o.h.say("what is 2 + 3?")
        await o.h.idle()
        first, second = o.h.provider.requests
        offered = {tool["name"]: tool for tool in first.tools}
        assert offered["add"]["parameters"]["required"] == ["a", "b"]
        [entry] = second.function_history
        assert (entry.tool_name, entry.arguments, entry.success) == ("add", {"a": 2, "b": 3},
                                                                     True)
        assert entry.result == {"success": True, "data": {"content": "5"}}
        assert o.bot_replies() == ["2 + 3 is 5."]
        assert calls_seen(tmp_path) == ["add"]


@pytest.mark.asyncio
async def test_a_hanging_tool_times_out_and_the_model_is_told(tmp_path: Path) -> None:
    # covers M1, T5: the engine's per-tool timeout (20 s here, virtual once the server is
    # hanging) ends the call; the model reads a failure and answers; the server still serves
    passes = [*tool_then_text("hang", {}, "That tool did not answer.")[:1],
              [{"at": 0.01, "text": "That tool did not answer."}, {"at": 0.02, "end": "completed"}],
              *tool_then_text("add", {"a": 1, "b": 1}, "1 + 1 is 2.")]
    async with bot_with_toolbox(tmp_path, passes) as o:
        loop = asyncio.get_running_loop()
        await o.h.say("try the slow tool")
        await until(lambda: calls_seen(tmp_path) == ["hang"])
        with loop.looptime_enabled():
            await o.h.idle()
        entry = o.h.provider.requests[1].function_history[0]
        assert (entry.tool_name, entry.success) == ("hang", False)
        assert entry.result == {"success": False, "error": "hang timed out after 20 s"}
        assert o.bot_replies() == ["That tool did not answer."]
        await o.h.say("now add")
        await o.h.idle()
        assert o.bot_replies()[-1] == "1 + 1 is 2."
        assert calls_seen(tmp_path) == ["hang", "add"]


@pytest.mark.asyncio
async def test_kill_during_an_mcp_call_stops_the_turn_and_the_server_lives_on(
    tmp_path: Path,
) -> None:
    # covers M1, D3: /kill while the server works on the call; the turn ends Stopped and the
    # model never sees a result; the next turn's call works
    passes = [tool_then_text("hang", {}, "never said")[0],
              *tool_then_text("add", {"a": 20, "b": 22}, "It is 42.")]
    async with bot_with_toolbox(tmp_path, passes) as o:
        await o.h.say("hang please")
        await until(lambda: calls_seen(tmp_path) == ["hang"])
        assert (await o.h.kill_answer()).startswith("Stopping the reply in this channel.")
        await o.h.idle()
        assert o.h.bot.results[-1].status == "stopped_by_user"
        await o.h.say("now add")
        await o.h.idle()
        assert o.bot_replies() == ["It is 42."]
        assert o.h.bot.operator is not None
        assert o.h.bot.operator.catalog.servers["toolbox"].starts == 1


@pytest.mark.asyncio
async def test_a_tools_loop_policy_is_honoured(tmp_path: Path) -> None:
    # covers M1, T9: `shout` declared ends_turn: the turn completes after it, no second pass
    passes = [[{"at": 0.01, "text": "Shouting now."},
               {"at": 0.02, "tool_call": {"name": "shout", "args": {"text": "hi"}, "id": "c1"}},
               {"at": 0.03, "end": "completed"}]]
    async with bot_with_toolbox(tmp_path, passes, loop={"shout": "ends_turn"}) as o:
        await o.h.say("shout hi")
        await o.h.idle()
        assert o.h.provider.calls == 1
        assert o.h.bot.results[-1].status == "completed"
        assert calls_seen(tmp_path) == ["shout"]


@pytest.mark.asyncio
async def test_a_python_hooks_tool_answers_through_the_bot(tmp_path: Path) -> None:
    # covers M1: a module exposing FunctionTools (tests/hook_tools.py) is a tool source
    catalog = ToolCatalog(load_hook_tools(["hook_tools"]))
    passes = tool_then_text("roll_die", {"sides": 6}, "You rolled a 4.")
    async with operator_discord() as emu, operator_bot(
            emu, tmp_path / "s.sqlite3", {"default": passes}, catalog=catalog) as o:
        await o.h.say("roll a die")
        await o.h.idle()
        entry = o.h.provider.requests[1].function_history[0]
        assert entry.result == {"success": True, "data": {"sides": 6, "rolled": 4}}
        assert o.bot_replies() == ["You rolled a 4."]


def test_a_broken_hook_is_one_line_naming_it() -> None:
    # covers M1: a module that does not exist, an attribute that is not there, not a tool
    with pytest.raises(ConfigurationError) as refused:
        load_hook_tools(["no_such_module_here", "hook_tools:MISSING", "hook_tools:NOT_TOOLS"])
    assert refused.value.problems == [
        "tool_hooks (TURN_TOOL_HOOKS): no_such_module_here: cannot be imported "
        "(ModuleNotFoundError: No module named 'no_such_module_here')",
        "tool_hooks (TURN_TOOL_HOOKS): hook_tools:MISSING: the module has no 'MISSING'",
        "tool_hooks (TURN_TOOL_HOOKS): hook_tools:NOT_TOOLS: gives str, which is not a tool "
        "(a FunctionTool has a name, description, args_model, guard, loop and run)",
    ]
