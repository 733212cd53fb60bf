"""The terminal chat's tools: the same as the bot's, so a tool-calling model is exercised end to
end before it meets Discord — the built-in enrichment tools (the operator's selection), with a
harmless stand-in where Discord would be needed (there are no users to look up, so a profile
picture is never found), the Python hooks' tools and the configured MCP servers.

A model whose server does not parse its tool calls writes them as text (`<tool_call>{...}
</tool_call>`, the Hermes format): `ToolCallText` keeps such blocks off the screen, and the
chat says once what happened instead of printing them as the reply."""

from __future__ import annotations

from discord_io.enrichment_tools import AvatarRef, EnrichmentTools
from discord_io.media_fetch import MediaFetcher

from .live_settings import select_tools
from .operator_build import build_catalog
from .settings import AppSettings
from .tool_catalog import ToolCatalog

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
TOOL_CALL_AS_TEXT = ("(the model wrote a tool call as text instead of calling the tool: its "
                     "server did not parse it; llama.cpp needs --jinja, and the model a chat "
                     "template with tools)")


async def no_users(user_id: int) -> AvatarRef | None:
    """The terminal has no Discord users: every profile-picture look-up finds nobody."""
    return None


def chat_catalog(settings: AppSettings, fetcher: MediaFetcher) -> ToolCatalog:
    builtins = select_tools(EnrichmentTools(fetcher, no_users).tools(), settings.tools)
    return build_catalog(settings, builtins)


class ToolCallText:
    """Streamed text with `<tool_call>...</tool_call>` blocks taken out, across chunk
    boundaries: a chunk that might begin a block is held back until it is clear."""

    def __init__(self) -> None:
        self._held = ""
        self._inside = False
        self.seen = False
        """A block was taken out since the last `take_seen`."""

    def feed(self, text: str) -> str:
        shown: list[str] = []
        data = self._held + text
        self._held = ""
        while data:
            if self._inside:
                end = data.find(CLOSE)
                if end < 0:
                    self._held = data[-(len(CLOSE) - 1):] if len(data) >= len(CLOSE) else data
                    return "".join(shown)
                data = data[end + len(CLOSE):]
                self._inside = False
                continue
            start = data.find(OPEN)
            if start >= 0:
                shown.append(data[:start])
                data = data[start + len(OPEN):]
                self._inside = self.seen = True
                continue
            keep = _partial_suffix(data, OPEN)
            shown.append(data[:len(data) - keep])
            self._held = data[len(data) - keep:]
            break
        return "".join(shown)

    def flush(self) -> str:
        """What is held back at the end of a pass: text that never became a block."""
        held, self._held = ("" if self._inside else self._held), ""
        self._inside = False
        return held

    def take_seen(self) -> bool:
        seen, self.seen = self.seen, False
        return seen


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
