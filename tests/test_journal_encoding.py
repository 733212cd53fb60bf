"""Journals written by orjson read back as the standard library's did (D57): the bot's
compact journals and the indented ones of the demo and `run-scenario`, for generated
documents (lone surrogates, integers past 64 bits, bytes, keys that are not strings,
dataclasses, datetimes, sets) and for the demo's real journals; a non-finite number is
written as null, so the journal stays readable (`read_journal` refuses NaN); what the reader
refuses stays refused in one line."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.journal import ScenarioError, jsonable, orjson_bytes, read_journal, serialize_journal
from fsm.journal.reading import MAX_INTEGER_DIGITS
from fsm.scenarios.demo import main as demo_main
from turn_engine.journals import encode_journal

pytestmark = pytest.mark.spec("D57")


@dataclasses.dataclass
class Point:
    x: int


def _stdlib_compact(document: Any) -> str:
    """What the bot's journal encoder wrote with the standard library alone."""
    try:
        return json.dumps(document, separators=(",", ":"), default=jsonable)
    except TypeError:
        return json.dumps(jsonable(document), separators=(",", ":"))


def _stdlib_indented(document: Any) -> str:
    """What the indented journal writer wrote with the standard library alone."""
    return json.dumps(jsonable(document), indent=1)


def _read(data: bytes, tmp_path: Path) -> str:
    """The journal as `read_journal` reads it back from its file (repr: 1 is not 1.0)."""
    path = tmp_path / "j.json"
    path.write_bytes(data)
    return repr(read_journal(path))


_INTEGERS = st.one_of(st.integers(min_value=-2**70, max_value=2**70),
                      st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63 - 1,
                                       10**MAX_INTEGER_DIGITS - 1]))
_LEAVES = st.one_of(
    st.none(), st.booleans(), st.floats(allow_nan=False, allow_infinity=False), _INTEGERS,
    st.text(),
    st.sampled_from(["\ud83d", "half \ude00", "😀", "\x00", "\u2028"]),
    st.binary(max_size=80), st.just(Point(3)), st.just(datetime.datetime(2026, 1, 2, 3, 4)),
    st.just({"a", 1} - {"a"}))
_KEYS = st.one_of(st.text(max_size=5), st.integers(max_value=5), st.just(("t", 1)))
_DOCUMENTS = st.dictionaries(st.text(max_size=5), st.recursive(
    _LEAVES, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(_KEYS, inner, max_size=3), max_leaves=10), max_size=4)


@settings(max_examples=300, deadline=None)
@given(_DOCUMENTS)
def test_generated_journals_read_back_as_the_standard_librarys(document: dict[str, Any]) -> None:
    # covers D57: equal content in both layouts, whichever encoder wrote it
    compact, indented = encode_journal(document), serialize_journal(document)
    assert compact.endswith(b"\n") and compact.count(b"\n") == 1
    assert repr(json.loads(compact)) == repr(json.loads(_stdlib_compact(document)))
    assert repr(json.loads(indented)) == repr(json.loads(_stdlib_indented(document)))


def test_the_demos_journals_read_back_as_the_standard_librarys(tmp_path: Path) -> None:
    # covers D57 on real turns: every example's journal, compact and indented
    assert demo_main(tmp_path / "demo") == 0
    journals = sorted((tmp_path / "demo").glob("*.json"))
    assert journals
    for path in journals:
        document = read_journal(path)
        for written, reference in ((encode_journal(document), _stdlib_compact(document)),
                                   (serialize_journal(document), _stdlib_indented(document))):
            assert orjson_bytes(document, jsonable) is not None  # orjson wrote it
            assert _read(written, tmp_path) == repr(json.loads(reference))


@pytest.mark.parametrize("extra", [{}, {"cut": "half \ud83d"}, {"big": 2**70}],
                         ids=["orjson", "lone-surrogate", "past-64-bits"])
def test_a_non_finite_number_is_written_as_null_and_the_journal_reads(
        extra: dict[str, Any], tmp_path: Path) -> None:
    # covers D57: NaN and the infinities are null in both layouts and on both encoders'
    # paths (the standard library's `NaN` made a journal the reader refuses)
    document = {"tool": {"score": math.nan, "range": [-math.inf, math.inf]}, **extra}
    expected = {"tool": {"score": None, "range": [None, None]}, **extra}
    for written in (encode_journal(document), serialize_journal(document)):
        assert _read(written, tmp_path) == repr(expected)


def test_what_the_reader_refuses_stays_refused_in_one_line(tmp_path: Path) -> None:
    # covers D57 with the defensive reading: an integer longer than any recorder's is
    # written exactly (orjson cannot; the standard library does) and refused on reading,
    # naming the file; one within the bound reads back exactly
    path = tmp_path / "j.json"
    path.write_bytes(encode_journal({"n": 10**MAX_INTEGER_DIGITS}))
    with pytest.raises(ScenarioError, match=rf"^{path}: unreadable JSON \(an integer of 31 "):
        read_journal(path)
    path.write_bytes(encode_journal({"n": -(10**MAX_INTEGER_DIGITS - 1)}))
    assert read_journal(path) == {"n": -(10**MAX_INTEGER_DIGITS - 1)}
