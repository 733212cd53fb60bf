"""Tools from MCP servers (the official `mcp` SDK): each server's tools become engine tools.

A server is a command spoken to over stdio or a streamable-HTTP URL (`mcp_servers` in the
settings). `McpServer` supervises one: it connects and lists the tools once at start, keeps
the connection in one task of its own (the SDK's cancel scopes must open and close in one
task), notices when the connection ends (a crashed process, a closed stream), and starts it
again with back-off (1 s doubling to 60 s, back to 1 s after a minute of health) until the
bot stops. Its tools stay offered while it restarts: a call then fails with a line the model
can read, as does every other failure (an error result, a hang past the engine's per-tool
timeout, a malformed result, a lost connection) — never a crashed turn (docs/spec.md M1).

A tool's input schema is the server's own JSON Schema, checked when listed (a schema that is
not valid JSON Schema drops that tool with one log line) and enforced on every call's
arguments before they are sent. Results are cut at `max_result_chars`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TextIO

import anyio
import httpx2
import jsonschema
from mcp import Client, MCPError, StdioServerParameters
from mcp.client import Transport
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CONNECTION_CLOSED, CallToolResult
from mcp_types import Tool as McpToolInfo
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from fsm import EnrichmentKind, LoopPolicy, ToolContext, ToolResult

from .operator_settings import McpServerSettings
from .tool_schema import TOOL_NAME, schema_problem

log = logging.getLogger(__name__)

BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 60.0
HEALTHY_AFTER_S = 60.0
STOP_GRACE_S = 5.0

State = Literal["starting", "running", "restarting", "stopped"]


# ---- schemas and arguments -------------------------------------------------------------------


def arguments_model(tool_name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A pydantic model whose JSON schema is the server's own and whose validation is the
    server's schema (so `ToolRegistry.parse_args` reports bad arguments to the model)."""
    declared = copy.deepcopy(schema)
    declared.setdefault("type", "object")
    validator = jsonschema.validators.validator_for(declared)(declared)

    def replace(out: dict[str, Any], _cls: type[BaseModel]) -> None:
        out.clear()
        out.update(copy.deepcopy(declared))

    class McpArguments(BaseModel):
        model_config = ConfigDict(extra="allow", json_schema_extra=replace)

        @model_validator(mode="before")
        @classmethod
        def _valid(cls, data: Any) -> Any:
            errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
            if errors:
                raise PydanticCustomError("json_schema", "{problems}", {"problems": "; ".join(
                    f"{'.'.join(str(p) for p in err.path)}: {err.message}" if err.path
                    else err.message for err in errors[:5])})
            return data

    McpArguments.__name__ = f"{tool_name}_arguments"
    return McpArguments


# ---- results ---------------------------------------------------------------------------------


def result_for_model(result: CallToolResult, max_chars: int) -> ToolResult:
    """The tool result the model sees: the text of the content blocks (other media named,
    not shown), the structured content when it fits, cut at `max_chars`."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(str(getattr(block, "text", "")))
        elif kind in ("image", "audio"):
            size = len(str(getattr(block, "data", ""))) * 3 // 4
            parts.append(f"<{kind} {getattr(block, 'mime_type', '')}, {size} bytes: not shown>")
        elif kind == "resource_link":
            parts.append(f"<resource {getattr(block, 'uri', '')}>")
        elif kind == "resource":
            resource = getattr(block, "resource", None)
            text = getattr(resource, "text", None)
            parts.append(str(text) if text is not None
                         else f"<resource {getattr(resource, 'uri', '')}: binary, not shown>")
        else:
            parts.append(f"<{kind or 'unknown'} content: not shown>")
    text = "\n".join(parts)
    if result.is_error:
        return ToolResult.fail(_cut(text, max_chars) or "the tool reported an error")
    data: dict[str, Any] = {"content": text}
    if result.structured_content is not None:
        data["structured_content"] = result.structured_content
        if len(json.dumps(data, default=str)) > max_chars:
            del data["structured_content"]
    data["content"] = _cut(text, max_chars)
    return ToolResult.ok(data)


def _cut(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    note = f"\n[cut: {len(text) - max_chars} more characters]"
    return text[:max_chars] + note


# ---- the engine's side of one tool -----------------------------------------------------------


@dataclass(frozen=True)
class McpTool:
    """One tool of an MCP server, as the engine's `Tool` contract has it."""

    name: str
    description: str
    args_model: type[BaseModel]
    server: McpServer
    remote_name: str
    loop: LoopPolicy = "next_pass"
    guard: EnrichmentKind | None = None

    async def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        return await self.server.call(self.remote_name, args.model_dump(mode="json"))


# ---- one server ------------------------------------------------------------------------------


class _WatchedRead:
    """The transport's read stream, telling `lost` when it ends (the server went away)."""

    def __init__(self, inner: Any, lost: asyncio.Event) -> None:
        self._inner = inner
        self._lost = lost

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._lost.set()
            raise

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedRead:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc_val: BaseException | None, exc_tb: TracebackType | None) -> bool | None:
        self._lost.set()
        result: bool | None = await self._inner.__aexit__(exc_type, exc_val, exc_tb)
        return result


@contextlib.asynccontextmanager
async def _watched(transport: Transport, lost: asyncio.Event) -> AsyncIterator[Any]:
    async with transport as (read, write):
        yield _WatchedRead(read, lost), write


@dataclass(eq=False)
class McpServer:
    """One configured server, supervised: started once, restarted with back-off, stopped
    with the bot. `on_tools` is told whenever its list of tools changes."""

    name: str
    settings: McpServerSettings
    log_dir: Path | None = None
    on_tools: Callable[[], None] = lambda: None
    tools: list[McpTool] = field(default_factory=list)
    state: State = "stopped"
    starts: int = 0
    problem: str | None = None
    """Why the server is not running, when it is not (one line)."""
    _client: Client | None = field(default=None, repr=False)
    _lost: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _stop: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _first: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, repr=False)
    _errlog: TextIO | None = field(default=None, repr=False)

    def start(self) -> None:
        if self._task is None:
            self.state = "starting"
            self._task = asyncio.create_task(self._supervise(), name=f"mcp-{self.name}")

    async def wait_started(self) -> None:
        """Until the first start has succeeded or failed."""
        await self._first.wait()

    async def aclose(self) -> None:
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), STOP_GRACE_S)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.state = "stopped"

    async def call(self, remote_name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call one of the server's tools; every failure is a result the model can read."""
        client = self._client
        if self.state == "stopped":
            return ToolResult.fail(f"the MCP server {self.name} is stopped")
        if client is None or self._lost.is_set():
            why = f": {self.problem}" if self.problem else ""
            return ToolResult.fail(f"the MCP server {self.name} is not running{why}; it is "
                                   "being restarted, try again later")
        try:
            result = await client.call_tool(remote_name, arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._lost.set()
                return ToolResult.fail(f"the MCP server {self.name} closed the connection "
                                       "during the call; it is being restarted")
            return ToolResult.fail(f"the MCP server {self.name} refused the call: {exc}")
        except ValidationError:
            log.warning("mcp server %s: %s returned a malformed result", self.name, remote_name)
            return ToolResult.fail(f"the MCP server {self.name} returned a malformed result")
        except Exception as exc:
            leaf = _leaf(exc)
            log.warning("mcp server %s: %s failed: %s", self.name, remote_name, _describe(leaf))
            if _is_connection_error(leaf):
                self._lost.set()
            return ToolResult.fail(f"the MCP server {self.name} failed: {_describe(leaf)}")
        if not isinstance(result, CallToolResult):
            return ToolResult.fail(f"the MCP server {self.name} returned a malformed result")
        return result_for_model(result, self.settings.max_result_chars)

    # ---- supervision

    async def _supervise(self) -> None:
        delay = BACKOFF_INITIAL_S
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            self._lost = asyncio.Event()
            self.starts += 1
            up_since: float | None = None
            try:
                async with contextlib.AsyncExitStack() as stack:
                    async with asyncio.timeout(self.settings.start_timeout_s):
                        client = await stack.enter_async_context(
                            Client(_watched(self._transport(), self._lost), mode="auto"))
                        listing = await self._list_tools(client)
                    self._client = client
                    self._publish(listing)
                    self.state, self.problem = "running", None
                    up_since = loop.time()
                    log.info("mcp server %s: running, %d tool(s)", self.name, len(self.tools))
                    self._first.set()
                    await self._until_lost_or_stopped()
                    self._client = None
            except Exception as exc:
                self._note_failure(exc)
            finally:
                self._client = None
                self._close_errlog()
            if self._stop.is_set():
                break
            if up_since is not None:
                self.problem = self.problem or "the connection ended"
                log.warning("mcp server %s: %s; restarting in %.0f s", self.name, self.problem,
                            delay if loop.time() - up_since < HEALTHY_AFTER_S
                            else BACKOFF_INITIAL_S)
                if loop.time() - up_since >= HEALTHY_AFTER_S:
                    delay = BACKOFF_INITIAL_S
            self._first.set()
            self.state = "restarting"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            delay = min(delay * 2, BACKOFF_MAX_S)
        self.state = "stopped"

    async def _until_lost_or_stopped(self) -> None:
        lost = asyncio.ensure_future(self._lost.wait())
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({lost, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            stop.cancel()
        if self._lost.is_set() and not self._stop.is_set():
            self.problem = "the connection ended (the server exited or closed it)"

    def _note_failure(self, exc: BaseException) -> None:
        line = _start_problem(self.settings, self.name, exc, self._log_path())
        if line != self.problem:
            log.error("mcp server %s: %s; its tools are unavailable until it starts (retrying "
                      "with back-off)", self.name, line)
        self.problem = line

    def _transport(self) -> Transport:
        s = self.settings
        if s.url is not None:
            headers = {k: v.get_secret_value() for k, v in s.headers.items()}
            http = httpx2.AsyncClient(headers=headers,
                                      timeout=httpx2.Timeout(30.0, read=300.0))
            return _owning(streamable_http_client(s.url, http_client=http), http)
        assert s.command is not None
        params = StdioServerParameters(
            command=s.command, args=list(s.args), cwd=s.cwd,
            env={k: v.get_secret_value() for k, v in s.env.items()} or None)
        return stdio_client(params, errlog=self._open_errlog())

    def _log_path(self) -> Path | None:
        if self.log_dir is None or self.settings.command is None:
            return None
        return self.log_dir / f"mcp-{self.name}.log"

    def _open_errlog(self) -> TextIO:
        """The server's stderr goes to its own log file (its tracebacks are not the bot's
        log), or nowhere when the bot keeps no files."""
        path = self._log_path()
        self._close_errlog()
        if path is None:
            self._errlog = open(  # noqa: SIM115 - closed when the connection ends
                "/dev/null", "w", encoding="utf-8")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._errlog = path.open("a", encoding="utf-8")
        return self._errlog

    def _close_errlog(self) -> None:
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    async def _list_tools(self, client: Client) -> list[McpToolInfo]:
        found: list[McpToolInfo] = []
        cursor: str | None = None
        for _ in range(100):  # a server whose pages never end cannot hang the start
            page = await client.list_tools(cursor=cursor)
            found.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return found

    def _publish(self, listing: list[McpToolInfo]) -> None:
        tools: list[McpTool] = []
        allowed = self.settings.allowed_tools
        for info in listing:
            if allowed is not None and info.name not in allowed:
                continue
            tool = self._tool(info)
            if tool is not None:
                tools.append(tool)
        if allowed is not None:
            missing = sorted(set(allowed) - {info.name for info in listing})
            if missing:
                log.warning("mcp server %s: allowed_tools names %s, which it does not have",
                            self.name, ", ".join(missing))
        old = [(t.name, t.description, t.args_model.model_json_schema()) for t in self.tools]
        new = [(t.name, t.description, t.args_model.model_json_schema()) for t in tools]
        self.tools = tools
        if old != new:
            self.on_tools()

    def _tool(self, info: McpToolInfo) -> McpTool | None:
        name = f"{self.settings.prefix}_{info.name}" if self.settings.prefix else info.name
        if not TOOL_NAME.match(name):
            log.warning("mcp server %s: tool %r skipped: a tool name may only have letters, "
                        "digits, _ and - (at most 64; set a shorter prefix)", self.name,
                        name[:80])
            return None
        problem = schema_problem(info.input_schema)
        if problem is not None:
            log.warning("mcp server %s: tool %s skipped: %s", self.name, info.name, problem)
            return None
        return McpTool(
            name=name, description=(info.description or info.title or info.name)[:1024],
            args_model=arguments_model(name, info.input_schema), server=self,
            remote_name=info.name, loop=self.settings.loop.get(info.name, "next_pass"))


@contextlib.asynccontextmanager
async def _owning(transport: Transport, http: httpx2.AsyncClient) -> AsyncIterator[Any]:
    async with http, transport as streams:
        yield streams


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _is_connection_error(exc: BaseException) -> bool:
    return isinstance(exc, (httpx2.TransportError, ConnectionError, anyio.BrokenResourceError,
                            anyio.ClosedResourceError))


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _start_problem(settings: McpServerSettings, name: str, exc: BaseException,
                   log_path: Path | None) -> str:
    """One line saying why a server did not start, and what to check."""
    leaf = _leaf(exc)
    see = f" (its stderr is in {log_path})" if log_path is not None else ""
    if isinstance(leaf, TimeoutError):
        return f"did not start within {settings.start_timeout_s:g} s{see}"
    if isinstance(leaf, FileNotFoundError) or (
            isinstance(leaf, OSError) and leaf.errno == errno.ENOENT):
        return (f"cannot start {settings.command!r}: command not found (is it installed? "
                f"check mcp_servers.{name}.command)")
    if isinstance(leaf, PermissionError):
        return f"cannot start {settings.command!r}: not executable"
    if isinstance(leaf, httpx2.TransportError):
        return f"cannot reach {settings.url} ({_describe(leaf)})"
    if isinstance(leaf, httpx2.HTTPStatusError):
        return f"{settings.url} answered HTTP {leaf.response.status_code}"
    if isinstance(leaf, MCPError) and leaf.code == CONNECTION_CLOSED:
        return f"exited or closed the connection while starting{see}"
    return f"failed to start: {_describe(leaf)}{see}"
