"""Where the bot and the terminal chat keep turn journals, and for how long.

Journals hold what users wrote, so they are kept within the operator's retention (a count,
an age, a total size) and can be turned off altogether. Pruning runs after each write and
removes the oldest journals first; it only ever touches `*.json` files of its directory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsm.engine.turn import Turn
from fsm.review.journal import JournalRecorder, journal_document, write_journal

from .settings import JournalSettings

log = logging.getLogger(__name__)


class JournalStore:
    """Writes journals into one directory and prunes it to the retention settings."""

    def __init__(self, settings: JournalSettings, *, clock: Callable[[], float] = time.time
                 ) -> None:
        self.settings = settings
        self.directory = Path(settings.dir)
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def write_turn(self, name: str, turn: Turn, recorder: JournalRecorder) -> Path | None:
        """The turn's journal as `name`.json; None when journals are off or it failed."""
        if not self.enabled:
            return None
        document = journal_document(recorder.scenario(), turn.transitions,
                                    turn.result().as_dict())
        return self.write(name, document)

    def write(self, name: str, document: dict[str, Any]) -> Path | None:
        if not self.enabled:
            return None
        path = self.directory / f"{name}.json"
        try:
            write_journal(path, document)
        except OSError as exc:
            log.warning("journal %s not written: %s", path.name, exc.strerror)
            return None
        self.prune()
        return path

    def prune(self) -> int:
        """Remove the oldest journals beyond the retention; returns how many went."""
        try:
            entries = sorted(((p.stat(), p) for p in self.directory.glob("*.json")),
                             key=lambda e: (e[0].st_mtime, e[1].name))
        except OSError:
            return 0
        keep_after = (self._clock() - self.settings.max_age_days * 86_400
                      if self.settings.max_age_days is not None else None)
        total = sum(stat.st_size for stat, _ in entries)
        count = len(entries)
        removed = 0
        for stat, path in entries:
            too_old = keep_after is not None and stat.st_mtime < keep_after
            too_many = self.settings.max_files is not None and count > self.settings.max_files
            too_big = self.settings.max_bytes is not None and total > self.settings.max_bytes
            if not (too_old or too_many or too_big):
                break
            try:
                path.unlink()
            except OSError as exc:
                log.warning("journal %s not pruned: %s", path.name, exc.strerror)
                continue
            removed += 1
            count -= 1
            total -= stat.st_size
        return removed


def scenario_history(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dialogue items in the scenario format's `history` shape, for the turn's journal."""
    return [
        {"id": item["message_id"], "author": item.get("author", ""),
         "author_id": item.get("author_id"), "content": item.get("content", ""),
         "at": item.get("sent_at", ""), "reply_to": item.get("reply_to"),
         "reactions": [{"emoji": r["emoji"], "count": r.get("count", 0)}
                       for r in item.get("reactions") or []]}
        for item in items if item.get("type") == "dialogue"
    ]
