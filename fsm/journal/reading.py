"""Reading the project's JSON files (scenarios and journals) defensively: one line naming the
file and place for anything unreadable, and refusal of what no recorder writes (integers of
absurd length, non-finite numbers) instead of a traceback further on. Below both the scenario
format and the review tools, so each reads files the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["MAX_INTEGER_DIGITS", "ScenarioError", "decode_json", "loads", "read_journal",
           "read_json", "read_text"]


class ScenarioError(ValueError):
    """A malformed scenario or journal; the message is one line naming file and field."""


def read_text(path: Path) -> str:
    """The file's text, or a ScenarioError naming the file."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not UTF-8 text") from None


MAX_INTEGER_DIGITS = 30
"""No recorder writes a longer integer (ids are strings, counts and times are small)."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits, more than "
                         f"{MAX_INTEGER_DIGITS}")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:20]}{'…' if len(text) > 20 else ''} is out of range")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def loads(text: str) -> Any:
    """`json.loads` that refuses what a journal never holds: huge integers, non-finite
    numbers (ValueError)."""
    return json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                      parse_constant=_refuse_constant)


def decode_json(text: str, where: str) -> Any:
    """Parse JSON text; any failure, absurd nesting and huge numbers included, is one
    ScenarioError naming `where`."""
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: "
                            f"{exc.msg}") from None
    except RecursionError:
        raise ScenarioError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as exc:
        raise ScenarioError(f"{where}: unreadable JSON ({exc})") from None


def read_json(path: Path) -> Any:
    return decode_json(read_text(path), str(path))


def read_journal(path: Path) -> Any:
    """A journal file: one JSON document, or JSON Lines as `run-scenario` prints them."""
    text = read_text(path)
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        first_error = exc
    except (RecursionError, ValueError):
        return decode_json(text, str(path))
    lines: list[Any] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if number == 1 and not line.lstrip().startswith("{"):
            raise ScenarioError(f"{path}: invalid JSON at line {first_error.lineno} column "
                                f"{first_error.colno}: {first_error.msg}")
        lines.append(decode_json(line, f"{path}: line {number}"))
    if not lines:
        raise ScenarioError(f"{path}: empty file, not a journal")
    return lines
