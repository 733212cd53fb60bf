"""The incremental SSE parser: network chunks may split a stream anywhere (S5: every chunk
is processed as it arrives), and comments are liveness, not content (S4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsm.engine.provider import ProviderError
from providers.sse import SSEComment, SSEEvent, SSEItem, SSEParser, json_payload

STREAM = (
    ": keepalive\n"
    "event: message_start\n"
    "id: 7\n"
    'data: {"a": 1}\n'
    "\n"
    "data: line one\n"
    "data: line two\n"
    "data:no-space\n"
    "\n"
    "retry: 1000\n"
    "unknown-field: ignored\n"
    "event: empty\n"
    "\n"
    "data: héllo ✓\n"
    "\n"
)
EXPECTED: list[SSEItem] = [
    SSEComment("keepalive"),
    SSEEvent('{"a": 1}', "message_start", "7"),
    SSEEvent("line one\nline two\nno-space", "message", "7"),
    SSEEvent("héllo ✓", "message", "7"),
]


def parse(chunks: list[bytes]) -> list[SSEItem]:
    parser = SSEParser()
    items: list[SSEItem] = []
    for chunk in chunks:
        items.extend(parser.feed(chunk))
    items.extend(parser.close())
    return items


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_line_endings(eol: str) -> None:
    """covers S5: LF, CRLF and CR streams parse identically."""
    assert parse([STREAM.replace("\n", eol).encode()]) == EXPECTED


@given(st.data())
def test_any_chunking_gives_the_same_events(data: st.DataObject) -> None:
    """covers S5: splitting the bytes anywhere (inside a CRLF, inside a UTF-8 character)
    changes nothing."""
    eol = data.draw(st.sampled_from(["\n", "\r\n", "\r"]))
    raw = STREAM.replace("\n", eol).encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=12)))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    assert parse(chunks) == EXPECTED


def test_final_event_without_blank_line_is_dispatched_at_eof() -> None:
    """covers S13: a server that closes right after the last data line loses nothing."""
    assert parse([b"data: first\n\ndata: last"]) == [SSEEvent("first"), SSEEvent("last")]
    assert parse([b"data: last\r"]) == [SSEEvent("last")]


def test_byte_order_mark_and_comment_only_stream() -> None:
    """covers S4: a BOM is dropped; a stream of comments yields only comments."""
    assert parse([b"\xef\xbb\xbf: ping\n\n:\n"]) == [SSEComment("ping"), SSEComment("")]


def test_event_without_data_is_not_dispatched() -> None:
    """covers S4: an `event:` line alone (no data) is not an event."""
    assert parse([b"event: ping\n\ndata: x\n\n"]) == [SSEEvent("x")]


def test_malformed_json_is_a_clear_error() -> None:
    """covers S8: bad JSON names the event, the decoder's complaint and the data."""
    error = json_payload(SSEEvent('{"choices": [', "message_delta"))
    assert isinstance(error, ProviderError)
    assert (error.kind, error.type) == ("provider_stream_error", "malformed_event")
    assert error.message.startswith("malformed JSON in SSE 'message_delta' event: ")
    assert """data begins '{"choices": ['""" in error.message


def test_json_that_is_not_an_object_is_an_error() -> None:
    """covers S8: a JSON scalar or list where an object belongs is reported as such."""
    error = json_payload(SSEEvent("42"))
    assert isinstance(error, ProviderError)
    assert "is JSON int, expected an object" in error.message
    assert json_payload(SSEEvent('{"ok": true}')) == {"ok": True}
