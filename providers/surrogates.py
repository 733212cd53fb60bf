"""Text events that split a surrogate pair: an emoji cut across two stream events.

A provider that escapes non-BMP characters in JSON (`"\ud83d"` in one event, `"\ude00"` in
the next) hands Python two lone surrogates. Nothing downstream can encode those (UTF-8 and
UTF-16 both refuse them), so one emoji would fail a whole reply. This filter holds a high
surrogate left at the end of a text event until the next event of the same kind completes
the pair, and replaces any surrogate that stays alone with U+FFFD.
"""

from __future__ import annotations

import dataclasses
import re

from fsm import KeepAlive, ProviderEvent, ReasoningDelta, TextDelta, Usage

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
_TextEvent = TextDelta | ReasoningDelta


def well_formed(text: str) -> str:
    """`text` with surrogate pairs joined into their character and lone ones replaced."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _is_high(char: str) -> bool:
    return "\ud800" <= char <= "\udbff"


class SurrogatePairs:
    """A `StreamFilter`: text and reasoning events come out well formed, pairs whole."""

    def __init__(self) -> None:
        self._held: dict[type[_TextEvent], str] = {}

    def feed(self, event: ProviderEvent) -> list[ProviderEvent]:
        if isinstance(event, KeepAlive | Usage):
            return [event]  # liveness between the halves does not end the text
        if not isinstance(event, TextDelta | ReasoningDelta):
            return [*self.finish(), event]
        text = self._held.pop(type(event), "") + event.text
        if text and _is_high(text[-1]):
            self._held[type(event)] = text[-1]
            text = text[:-1]
        return [dataclasses.replace(event, text=well_formed(text))] if text else []

    def finish(self) -> list[ProviderEvent]:
        """A half that no event completed becomes U+FFFD."""
        held, self._held = self._held, {}
        return [kind(REPLACEMENT) for kind in held]
