"""What the SSE parser hands the provider decoders, field by field (SPEC S4, S5, S8, S13):
llama.cpp's `error:` lines, ids, fields without a colon or value, the spaces after a colon,
a byte-order mark only at the start, event names that last one event, and unreadable JSON
reported as an error the turn can end on."""

from __future__ import annotations

import pytest

from fsm.engine.provider import ProviderError
from providers.sse import SSEComment, SSEEvent, SSEItem, SSEParser, json_payload


def parse(*chunks: bytes) -> list[SSEItem]:
    parser = SSEParser()
    items: list[SSEItem] = []
    for chunk in chunks:
        items.extend(parser.feed(chunk))
    return items + parser.close()


def test_an_error_line_is_an_error_event_and_not_lost() -> None:
    """covers S8: llama.cpp reports a context overflow as `error: {...}` before [DONE]."""
    assert parse(b'error: {"code": 400}\n\ndata: [DONE]\n\n') == [
        SSEEvent('{"code": 400}', "error"), SSEEvent("[DONE]")]


def test_an_event_name_lasts_one_event() -> None:
    """covers S4"""
    assert parse(b"event: delta\ndata: 1\n\ndata: 2\n\n") == [
        SSEEvent("1", "delta"), SSEEvent("2", "message")]


def test_the_last_id_is_kept_and_one_with_a_nul_is_ignored() -> None:
    """covers S4"""
    assert parse(b"id: 1\ndata: a\n\nid: 2\x00x\ndata: b\n\nid\ndata: c\n\n") == [
        SSEEvent("a", id="1"), SSEEvent("b", id="1"), SSEEvent("c", id="")]


def test_a_field_without_a_colon_has_an_empty_value() -> None:
    """covers S4: a bare `data` line is an empty data line, as browsers read it"""
    assert parse(b"data\n\ndata\ndata: x\n\n") == [SSEEvent(""), SSEEvent("\nx")]


def test_only_one_space_after_the_colon_is_dropped() -> None:
    """covers S4"""
    assert parse(b"data:  two\n:  note\n:x\n\n") == [
        SSEComment(" note"), SSEComment("x"), SSEEvent(" two")]


def test_a_byte_order_mark_counts_only_at_the_start() -> None:
    """covers S4: later it is part of a field name no one knows"""
    assert parse(b"\xef\xbb\xbfdata: a\n\n\xef\xbb\xbfdata: b\n\ndata: c\n\n") == [
        SSEEvent("a"), SSEEvent("c")]


def test_a_trailing_cr_at_eof_ends_the_last_line() -> None:
    """covers S13"""
    assert parse(b"data: a\n\ndata: b\r") == [SSEEvent("a"), SSEEvent("b")]
    assert parse(b"data: a\r\r\n") == [SSEEvent("a")]


def test_lines_split_at_every_byte_arrive_whole() -> None:
    """covers S5: a CR, its LF and each line arrive in separate network chunks"""
    raw = b"data: one\r\n\r\ndata: two\r\rdata: three\n\n"
    assert parse(*(raw[i : i + 1] for i in range(len(raw)))) == [
        SSEEvent("one"), SSEEvent("two"), SSEEvent("three")]
    assert parse(raw[:9], raw[9:10], raw[10:]) == parse(raw)


@pytest.mark.parametrize("data", ["[" * 100_000, "1" + "0" * 5000])
def test_unreadable_json_is_a_stream_error_not_a_crash(data: str) -> None:
    """covers S8: absurd nesting or a 5,000-digit number ends the pass with an error"""
    error = json_payload(SSEEvent(data, "delta"))
    assert isinstance(error, ProviderError)
    assert (error.kind, error.type) == ("provider_stream_error", "malformed_event")
    assert "delta" in error.message


def test_json_that_is_not_an_object_is_a_stream_error() -> None:
    """covers S8"""
    error = json_payload(SSEEvent("[1, 2]"))
    assert isinstance(error, ProviderError)
    assert (error.kind, error.type) == ("provider_stream_error", "malformed_event")


def test_a_stream_that_begins_with_a_blank_line_loses_nothing() -> None:
    """covers S4, S5: a server's leading newline (a keep-alive) is an empty dispatch"""
    assert parse(b"\ndata: x\n\n") == [SSEEvent("x")]
    assert parse(b"\r\n", b"data: y\n\n") == [SSEEvent("y")]


def test_bytes_that_are_not_utf8_become_replacement_characters() -> None:
    """covers S5, S8: a broken byte never raises inside the stream; the decoder sees U+FFFD"""
    assert parse(b"data: a\xff\n\ndata: b\xfe") == [SSEEvent("a\ufffd"), SSEEvent("b\ufffd")]
