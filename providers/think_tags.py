"""A leading `<think>…</think>` block in the reply is reasoning, never reply text (P4).

DeepSeek-R1-style models on servers that do not split reasoning out (llama.cpp with
`--reasoning-format none`, vLLM without a reasoning parser, many gateways) write their chain
of thought into `content` between `<think>` and `</think>`. Only a block at the very start
of the reply counts (after whitespace): the tags may arrive split over any number of
chunks, and a block that is never closed is reasoning to the end, so the reply is empty and
the engine falls back rather than posting thoughts. A `<think>` later in the reply is text
the model wrote about the tag, and is left alone.
"""

from __future__ import annotations

from typing import Literal

from fsm import ProviderEvent, ReasoningDelta, TextDelta

OPEN = "<think>"
CLOSE = "</think>"
_State = Literal["start", "inside", "after", "done"]


class ThinkTags:
    """A stream filter (`stream_filters.StreamFilter`) that moves a leading think block from
    the text channel to the reasoning channel."""

    def __init__(self) -> None:
        self._state: _State = "start"
        self._held = ""

    def feed(self, event: ProviderEvent) -> list[ProviderEvent]:
        if self._state == "done":
            return [event]
        if not isinstance(event, TextDelta):
            if isinstance(event, ReasoningDelta):
                return [event]
            return [*self._release(), event]
        if self._state == "start":
            return self._start(event.text)
        if self._state == "inside":
            return self._inside(event.text)
        return self._after(event.text)

    def finish(self) -> list[ProviderEvent]:
        return self._release()

    def _start(self, text: str) -> list[ProviderEvent]:
        self._held += text
        stripped = self._held.lstrip()
        if not stripped or (OPEN.startswith(stripped) and stripped != OPEN):
            return []  # blank so far, or the opening tag still arriving
        if stripped.startswith(OPEN):
            self._state, self._held = "inside", ""
            return self._inside(stripped[len(OPEN):])
        self._state = "done"
        held, self._held = self._held, ""
        return [TextDelta(held)]

    def _inside(self, text: str) -> list[ProviderEvent]:
        pending = self._held + text
        end = pending.find(CLOSE)
        if end >= 0:
            self._state, self._held = "after", ""
            thought = [ReasoningDelta(pending[:end])] if end else []
            return [*thought, *self._after(pending[end + len(CLOSE):])]
        keep = _partial_suffix(pending, CLOSE)
        self._held = pending[len(pending) - keep:] if keep else ""
        shown = pending[:len(pending) - keep]
        return [ReasoningDelta(shown)] if shown else []

    def _after(self, text: str) -> list[ProviderEvent]:
        """The blank line between the block and the answer is neither."""
        rest = text.lstrip()
        if not rest:
            return []
        self._state = "done"
        return [TextDelta(rest)]

    def _release(self) -> list[ProviderEvent]:
        """The stream moved on (a call, the end): a held partial opening tag was text, a
        held partial closing tag inside an unclosed block was reasoning."""
        held, self._held = self._held, ""
        if self._state == "start":
            self._state = "done"
            return [TextDelta(held)] if held else []
        return [ReasoningDelta(held)] if held else []


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that could begin `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0
