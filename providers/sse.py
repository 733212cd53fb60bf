"""An incremental Server-Sent Events parser: bytes in, events and comments out.

Network chunks split lines (and UTF-8 characters) anywhere, so the parser buffers bytes and
only decodes complete lines. It follows the WHATWG event-stream rules (LF, CRLF or CR line
ends, `data` lines joined with newlines, one optional space after the colon), with two
deliberate differences: a final event that lacks its blank line is still dispatched at EOF,
because servers that close the connection right after the last `data:` line are common; and
an `error:` line (llama.cpp's server reports failures such as a context overflow as
`error: {...}` before `data: [DONE]`) is read as the data of an event named `error` instead
of being ignored as an unknown field, so the failure is not lost.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from fsm import ProviderError

from . import json_text

_BOM = "\ufeff"
_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event. `event` is "message" when the stream named no type."""

    data: str
    event: str = "message"
    id: str | None = None


@dataclass(frozen=True, slots=True)
class SSEComment:
    """A `:` line. Servers send these as keep-alives, so they are liveness, not noise."""

    text: str


SSEItem = SSEEvent | SSEComment


class SSEParser:
    """Feed raw bytes with `feed`, call `close` at EOF; both return what became complete."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[str] = []
        self._event = ""
        self._last_id: str | None = None
        self._first_line = True
        self._scanned = 0

    def feed(self, chunk: bytes) -> list[SSEItem]:
        self._buffer.extend(chunk)
        out: list[SSEItem] = []
        for line in self._complete_lines():
            self._process_line(line, out)
        return out

    def close(self) -> list[SSEItem]:
        """Flush at EOF: a trailing partial line and an undelimited final event."""
        out: list[SSEItem] = []
        if self._buffer:
            tail = bytes(self._buffer).rstrip(b"\r")
            self._buffer.clear()
            self._process_line(tail.decode("utf-8", errors="replace"), out)
        self._dispatch(out)
        return out

    def _complete_lines(self) -> list[str]:
        lines: list[str] = []
        buf = self._buffer
        start = 0
        for match in _LINE_END.finditer(buf, self._scanned):
            if match.end() == len(buf) and match.group() == b"\r":
                break  # a CR at the chunk edge may be the first half of a CRLF
            lines.append(buf[start : match.start()].decode("utf-8", errors="replace"))
            start = match.end()
        del buf[:start]
        self._scanned = max(0, len(buf) - 1)
        return lines

    def _process_line(self, line: str, out: list[SSEItem]) -> None:
        if self._first_line:
            self._first_line = False
            line = line.removeprefix(_BOM)
        if not line:
            self._dispatch(out)
            return
        if line.startswith(":"):
            out.append(SSEComment(line[1:].removeprefix(" ")))
            return
        name, colon, value = line.partition(":")
        if colon:
            value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "error":
            self._event = "error"
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._last_id = value

    def _dispatch(self, out: list[SSEItem]) -> None:
        if self._data:
            out.append(SSEEvent("\n".join(self._data), self._event or "message", self._last_id))
        self._data = []
        self._event = ""


def json_payload(event: SSEEvent) -> dict[str, Any] | ProviderError:
    """Decode an event's data as a JSON object, or explain (without a traceback) why not.
    orjson decodes it, with the standard library's results and messages (`json_text`)."""
    try:
        value = json_text.loads(event.data)
    except json.JSONDecodeError as exc:
        return ProviderError(
            kind="provider_stream_error",
            type="malformed_event",
            message=(
                f"malformed JSON in SSE '{event.event}' event: {exc.msg} at line {exc.lineno} "
                f"column {exc.colno}; data begins {event.data[:80]!r}"
            ),
        )
    except (RecursionError, ValueError) as exc:  # absurd nesting, a 5,000-digit number
        return ProviderError(
            kind="provider_stream_error",
            type="malformed_event",
            message=(
                f"unreadable JSON in SSE '{event.event}' event ({type(exc).__name__}); "
                f"data begins {event.data[:80]!r}"
            ),
        )
    if not isinstance(value, dict):
        return ProviderError(
            kind="provider_stream_error",
            type="malformed_event",
            message=(
                f"SSE '{event.event}' event data is JSON {type(value).__name__}, expected an "
                f"object; data begins {event.data[:80]!r}"
            ),
        )
    return value
