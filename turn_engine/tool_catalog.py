"""All the tools a turn may offer: the built-in enrichment tools, the Python hooks' tools and
the MCP servers' tools, as one `ToolRegistry` per turn.

The registry is rebuilt only when something changed (a server listed new tools, a reload
changed the selection) and then shared by every turn that starts until the next change; a
turn keeps the registry it started with. Names are unique: a later tool with a name already
taken (built-ins first, then hooks, then servers in their configured order) is left out with
one log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fsm import Tool, ToolRegistry

from .operator_settings import McpServerSettings

if TYPE_CHECKING:
    from .mcp_tools import McpServer

log = logging.getLogger(__name__)


class ToolCatalog:
    """The bot's tools and the MCP servers behind some of them."""

    def __init__(self, builtins: Sequence[Tool] = (), hooks: Sequence[Tool] = (), *,
                 log_dir: Path | None = None) -> None:
        self._builtins = list(builtins)
        self._hooks = list(hooks)
        self._log_dir = log_dir
        self.servers: dict[str, McpServer] = {}
        self._registry: ToolRegistry | None = None
        self._started = False
        self._closing: set[asyncio.Task[None]] = set()

    def registry(self) -> ToolRegistry:
        """The tools as they are now (the same object until something changes)."""
        if self._registry is None:
            self._registry = self._build()
        return self._registry

    def set_builtins(self, tools: Sequence[Tool]) -> None:
        self._builtins = list(tools)
        self._changed()

    def _changed(self) -> None:
        self._registry = None

    def _build(self) -> ToolRegistry:
        registry = ToolRegistry()
        for tool in [*self._builtins, *self._hooks,
                     *(t for server in self.servers.values() for t in server.tools)]:
            if registry.get(tool.name) is not None:
                log.warning("tool %s left out: another tool already has that name (give the "
                            "MCP server a prefix)", tool.name)
                continue
            registry.register(tool)
        return registry

    # ---- MCP servers

    def configure(self, servers: Mapping[str, McpServerSettings]) -> None:
        """The servers to run (enabled ones only): new ones are started, removed or
        changed ones stopped (a changed one is started again with its new settings)."""
        wanted = {name: s for name, s in servers.items() if s.enabled}
        for name in list(self.servers):
            if name not in wanted or self.servers[name].settings != wanted[name]:
                self._retire(self.servers.pop(name))
        for name, settings in wanted.items():
            if name not in self.servers:
                # The SDK is imported only when a server is configured: it brings its own
                # dependencies (OpenTelemetry's API among them) into the process.
                from .mcp_tools import McpServer

                server = McpServer(name, settings, log_dir=self._log_dir,
                                   on_tools=self._changed)
                self.servers[name] = server
                if self._started:
                    server.start()
        self._changed()

    def _retire(self, server: McpServer) -> None:
        """Stop a server that is no longer configured, without holding up the caller."""
        if server.state == "stopped" and not self._started:
            return
        task = asyncio.get_running_loop().create_task(server.aclose(),
                                                      name=f"mcp-stop-{server.name}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def start(self, wait: bool = True) -> None:
        """Start every server; with `wait`, return once each has started or failed once."""
        self._started = True
        for server in self.servers.values():
            server.start()
        if wait and self.servers:
            await asyncio.gather(*(s.wait_started() for s in self.servers.values()))

    async def aclose(self) -> None:
        self._started = False
        servers = list(self.servers.values())
        await asyncio.gather(*(s.aclose() for s in servers), *self._closing)
