"""Replaying a recorded journal on the real engine and saying how it differs.

A journal holds every input the engine's decisions depend on, timed as the engine's clock
saw it (docs/scenarios.md). Replay plays those inputs on a virtual clock — the recorded
clock: every input lands at its recorded microsecond — and requires the same transitions at
the same times and the same result, exactly: no tolerance. The first difference is
reported as a sentence about the turn (which transition, which field of the result), not a
JSON path alone.
"""

from __future__ import annotations

import json
from typing import Any

from ..scenarios.format import split_journal
from ..scenarios.runner import play, run_virtual

__all__ = ["first_difference", "replay_difference", "replay_on_loop"]


def replay_difference(data: Any, source: str) -> str | None:
    """None when the journal replays to the same transitions and result (virtual clock)."""
    return run_virtual(lambda: replay_on_loop(data, source))


async def replay_on_loop(data: Any, source: str) -> str | None:
    """`replay_difference` on the running loop, whose clock must be virtual and start at 0."""
    scenario, transitions, result = split_journal(data, source)
    played = await play(scenario)
    diff = transitions_difference(transitions, played.transitions)
    if diff:
        return diff
    diff = first_difference(result, played.result.as_dict(), "result")
    if diff:
        return f"the result differs: {diff}"
    return None


def _describe(line: Any) -> str:
    if not isinstance(line, dict):
        return _show(line)
    return (f"{line.get('event', '?')} {line.get('from', '?')} → {line.get('to', '?')} "
            f"at {_seconds(line.get('t'))}")


def _seconds(t: Any) -> str:
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        return f"{t:.6f} s"
    return _show(t)


def transitions_difference(recorded: list[Any], replayed: list[dict[str, Any]]) -> str | None:
    """The first transition where the replay parts from the recording, in words."""
    for index, (want, got) in enumerate(zip(recorded, replayed, strict=False)):
        if want == got:
            continue
        number = index + 1
        if isinstance(want, dict) and {k: v for k, v in want.items() if k != "t"} \
                == {k: v for k, v in got.items() if k != "t"}:
            return (f"transition {number} ({got['event']} {got['from']} → {got['to']}): "
                    f"recorded at {_seconds(want.get('t'))}, replayed at "
                    f"{_seconds(got.get('t'))} (journal[{index}].t)")
        return (f"transition {number}: recorded {_describe(want)}, but the replay took "
                f"{_describe(got)} (journal[{index}])")
    if len(recorded) > len(replayed):
        last = f" after {_describe(replayed[-1])}" if replayed else " before any transition"
        return (f"the replay ended{last}; the recording goes on with "
                f"{_describe(recorded[len(replayed)])} ({len(recorded)} transitions recorded, "
                f"{len(replayed)} replayed)")
    if len(replayed) > len(recorded):
        return (f"the recording ends after {len(recorded)} transitions; the replay goes on "
                f"with {_describe(replayed[len(recorded)])}")
    return None


def first_difference(expected: Any, actual: Any, where: str = "") -> str | None:
    """A readable description of the first place two JSON values differ (exact: a time
    one microsecond off is a difference)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in list(expected) + [k for k in actual if k not in expected]:
            if key not in actual:
                return f"{where}.{key}: recorded {_show(expected[key])}, replay has none"
            if key not in expected:
                return f"{where}.{key}: not recorded, replay has {_show(actual[key])}"
            diff = first_difference(expected[key], actual[key], f"{where}.{key}")
            if diff:
                return diff
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        for index, (a, b) in enumerate(zip(expected, actual, strict=False)):
            diff = first_difference(a, b, f"{where}[{index}]")
            if diff:
                return diff
        if len(expected) != len(actual):
            return f"{where}: recorded {len(expected)} entries, replay has {len(actual)}"
        return None
    if type(expected) is not type(actual) and not _same_number(expected, actual):
        return f"{where or 'value'}: recorded {_show(expected)}, replay has {_show(actual)}"
    if expected != actual:
        return f"{where or 'value'}: recorded {_show(expected)}, replay has {_show(actual)}"
    return None


def _same_number(a: Any, b: Any) -> bool:
    """1 and 1.0 are one JSON number."""
    numbers = (int, float)
    return (isinstance(a, numbers) and isinstance(b, numbers)
            and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:117] + "..."
