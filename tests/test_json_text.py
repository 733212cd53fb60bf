"""Provider streams decoded by orjson with the standard library's results (D56): every text
decodes to the value `json.loads` gives it, and where `json.loads` refuses, the same
exception with the same message. Generated JSON values (integers past 64 bits, NaN and
Infinity, lone surrogates, deep nesting) and generated damage to them, compared one by one,
and the SSE decoder's answers for what orjson alone would get wrong."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from providers import json_text
from providers.sse import SSEEvent, json_payload

pytestmark = pytest.mark.spec("D56")

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(), st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1, 10**18, 10**19]),
    st.text(), st.sampled_from(["\ud83d", "\ude00", "half \ud83d", "😀"]))
_VALUES = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=12)


def _outcome(decode: Any, text: str) -> tuple[str, str]:
    """What decoding gives, comparable across decoders (repr tells 1 from 1.0, -0.0 from 0.0
    and writes NaN the same each time)."""
    try:
        return "value", repr(decode(text))
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=400, deadline=None)
@given(_VALUES, st.booleans(), st.integers(min_value=0, max_value=3))
def test_generated_json_decodes_as_the_standard_library_decodes_it(
        value: Any, ascii_only: bool, damage: int) -> None:
    # covers D56: values, NaN/Infinity, lone surrogate escapes, 64-bit edges, and damaged text
    text = json.dumps(value, ensure_ascii=ascii_only)
    if damage == 1:
        text = text[: len(text) // 2]
    elif damage == 2:
        text = text + ","
    elif damage == 3:
        text = " " + text.replace("0", "00", 1)
    assert _outcome(json_text.loads, text) == _outcome(json.loads, text)


@pytest.mark.parametrize("text", [
    '{"n": 123456789012345678901234567890}', '{"n": -9223372036854775809}',
    '{"n": 18446744073709551616}', '{"x": NaN, "y": -Infinity}', '{"s": "\\ud83d"}',
    '{"n": 1e999}', "[" * 2000 + "]" * 2000, '{"n": 1' + "0" * 5000 + "}", '{"a": 1',
    "", '{"a": 1, "a": 2}', '{"n": -0}', '{"f": 0.1000000000000000055511151231257827}'])
def test_what_orjson_alone_reads_otherwise_is_read_as_json_reads_it(text: str) -> None:
    # covers D56: the cases where orjson by itself would lose a digit, refuse, or differ
    assert _outcome(json_text.loads, text) == _outcome(json.loads, text)


def test_orjson_alone_would_turn_a_huge_integer_into_a_float() -> None:
    # covers D56: why long digit runs go to the standard library (the previous test's reason)
    assert isinstance(orjson.loads("123456789012345678901234567890"), float)
    assert json_text.loads("123456789012345678901234567890") == 123456789012345678901234567890


def test_the_sse_decoder_keeps_what_the_standard_library_read_and_its_messages() -> None:
    # covers D56 through the adapters' decoder: a lone surrogate escape and NaN are read
    # (the stream's own handling of them follows), malformed JSON keeps its message
    event = SSEEvent('{"s": "half \\ud83d", "n": NaN, "id": 12345678901234567890123}')
    payload = json_payload(event)
    assert isinstance(payload, dict)
    assert payload["s"] == "half \ud83d" and math.isnan(payload["n"])
    assert payload["id"] == 12345678901234567890123
    error = json_payload(SSEEvent('{"a": 1'))
    assert not isinstance(error, dict)
    assert error.message == ("malformed JSON in SSE 'message' event: Expecting ',' delimiter "
                             "at line 1 column 8; data begins '{\"a\": 1'")
