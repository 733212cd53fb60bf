"""The system prompt: a persona text or file, with `{date}` and `{time}` filled in per turn.

Only those two placeholders are replaced (plain text replacement, not `str.format`), so a
persona may contain any other braces. The file is re-read when its modification time
changes, so an operator can edit the persona without restarting the bot; a file that has
become unreadable keeps the last good text and logs a warning once.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

Clock = Callable[[], datetime.datetime]


def _now() -> datetime.datetime:
    return datetime.datetime.now().astimezone()


def render(template: str, now: datetime.datetime) -> str:
    return (template.replace("{date}", now.strftime("%A, %d %B %Y"))
            .replace("{time}", now.strftime("%H:%M %Z").strip()))


class Persona:
    """The system prompt of each turn."""

    def __init__(self, text: str, file: Path | None = None, *, clock: Clock = _now) -> None:
        self._text = text
        self._file = file
        self._clock = clock
        self._mtime: float | None = None
        self._warned = False
        if file is not None:
            self._text = file.read_text(encoding="utf-8")
            self._mtime = file.stat().st_mtime

    def _refresh(self) -> None:
        if self._file is None:
            return
        try:
            mtime = self._file.stat().st_mtime
            if mtime != self._mtime:
                self._text = self._file.read_text(encoding="utf-8")
                self._mtime = mtime
                self._warned = False
                log.info("persona file %s re-read", self._file.name)
        except (OSError, UnicodeDecodeError) as exc:
            if not self._warned:
                log.warning("persona file %s unreadable (%s); keeping the last text",
                            self._file.name, type(exc).__name__)
                self._warned = True

    def system_prompt(self) -> str:
        self._refresh()
        return render(self._text, self._clock())
