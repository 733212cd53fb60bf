"""Rewrites of an adapter's event stream that every provider needs: one event in, the events
it becomes out, plus what is owed at the end. The adapter chains them (`SSEProvider.stream`).
"""

from __future__ import annotations

from typing import Protocol

from fsm import ProviderEvent, TextDelta


class StreamFilter(Protocol):
    def feed(self, event: ProviderEvent) -> list[ProviderEvent]: ...

    def finish(self) -> list[ProviderEvent]:
        """Events held back when the stream ends without another event to release them."""
        ...


class LeadingBlank:
    """Holds whitespace-only text at the start of a reply until visible text follows.

    A reply of whitespace only shows nothing on Discord, so it must end as an empty
    response (the engine falls back on it), not as a completed answer: held blanks that no
    visible text ever follows are dropped, and the engine sees no text at all. Blanks that
    precede visible text are released with it, unchanged; only the start of the reply is
    held, and nothing else is ever delayed."""

    def __init__(self) -> None:
        self._held: list[str] = []
        self._seen_text = False

    def feed(self, event: ProviderEvent) -> list[ProviderEvent]:
        if self._seen_text or not isinstance(event, TextDelta):
            return [event]
        if not event.text.strip():
            self._held.append(event.text)
            return []
        self._seen_text = True
        held, self._held = "".join(self._held), []
        return [TextDelta(held + event.text)] if held else [event]

    def finish(self) -> list[ProviderEvent]:
        self._held = []
        return []


def run_filters(filters: list[StreamFilter], event: ProviderEvent) -> list[ProviderEvent]:
    events = [event]
    for stream_filter in filters:
        events = [out for item in events for out in stream_filter.feed(item)]
    return events


def finish_filters(filters: list[StreamFilter]) -> list[ProviderEvent]:
    """Each filter's held events, passed through the filters after it."""
    events: list[ProviderEvent] = []
    for position, stream_filter in enumerate(filters):
        released = stream_filter.finish()
        for later in filters[position + 1:]:
            released = [out for item in released for out in later.feed(item)]
        events.extend(released)
    return events
