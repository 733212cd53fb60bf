"""Journals encoded by orjson where it writes what the standard library would.

The bot writes a journal per turn, and encoding them was a tenth of its CPU with the
standard library's C encoder (BENCHMARKS.md 7f); orjson does it in a fraction of that. Where
it cannot write the same content, the caller's standard-library encoder does, so the two
read back equal: orjson refuses a lone surrogate, an integer beyond 64 bits and a key that
is not a string (`None` here), and it writes dataclasses and datetimes as `default` says
(their repr, as before) rather than its own way. What differs is only the layout (two-space
indents, `1e-7` for `1e-07`) and two cases a turn's own records never hold: a non-finite
float becomes `null` (the standard library's `NaN` made a journal that `read_journal`
refuses), and a plain `Enum` member or a `UUID` is written as its value, not its repr.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

__all__ = ["orjson_bytes"]

_OPTIONS = (orjson.OPT_APPEND_NEWLINE | orjson.OPT_PASSTHROUGH_DATACLASS
            | orjson.OPT_PASSTHROUGH_DATETIME)


def orjson_bytes(document: Any, default: Callable[[Any], Any], *,
                 indent: bool = False) -> bytes | None:
    """`document` as one line of UTF-8 JSON (two-space indented with `indent`) ending in a
    newline, `default` giving what it cannot write itself; None where orjson cannot write
    what the standard library would."""
    options = (_OPTIONS | orjson.OPT_INDENT_2) if indent else _OPTIONS
    try:
        return orjson.dumps(document, default=default, option=options)
    except orjson.JSONEncodeError:
        return None
