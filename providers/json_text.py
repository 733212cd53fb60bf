"""JSON text decoded by orjson, with the standard library's results.

A streaming reply is hundreds of SSE events, each one JSON object; orjson decodes them in a
fraction of `json.loads`'s time (BENCHMARKS.md 7f). It is stricter and in one place lossy,
so the standard library decides wherever the two could differ: text orjson refuses (NaN and
Infinity, a lone surrogate escape, a number out of double range, nesting past 1,024 levels,
malformed JSON) goes to `json.loads`, which accepts or explains it exactly as before; and
text with a run of 19 or more digits goes there first, because orjson reads an integer
beyond 64 bits as a float. Everything else the two decode to equal values
(tests/test_json_text.py compares them on generated text).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

_LONG_DIGIT_RUN = re.compile(r"[0-9]{19}")
"""Any integer orjson may not hold exactly (every 18-digit one fits 64 bits signed)."""


def loads(text: str) -> Any:
    """`json.loads(text)`: the same value, or the same exception with the same message."""
    if _LONG_DIGIT_RUN.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)
