"""Where the bot and the terminal chat keep turn journals, and for how long.

Journals hold what users wrote, so they are kept within the operator's retention (a count,
an age, a total size) and can be turned off altogether. Pruning runs after each write and
removes the oldest journals first; it only ever touches `*.json` files of its directory.

A bot writes a journal per turn, so neither writing nor pruning may cost more as the folder
fills: the store reads the folder once and then keeps its own index of the journals (oldest
first, with their count and bytes), updated by every write and removal; and a journal is one
line of compact JSON, which the standard library's C encoder writes (indented JSON takes its
pure-Python path, several times slower). Files removed by hand are dropped from the index
when pruning reaches them; the folder is read again after as many writes as it held
journals (at least `RESCAN_EVERY`) and on every explicit `prune()`, so files added or
re-dated by hand are seen too, at a cost per write that stays constant.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsm.engine.turn import Turn
from fsm.review.journal import JournalRecorder, journal_document, jsonable

from .settings import JournalSettings

log = logging.getLogger(__name__)

RESCAN_EVERY = 1000
"""The fewest writes between two readings of the folder."""


def encode_journal(document: dict[str, Any]) -> bytes:
    """The journal as one line of UTF-8 JSON, by the C encoder (no indent, compact
    separators). Bytes and unknown objects are written as `jsonable` writes them; a lone
    surrogate (half an emoji cut by a provider) as its JSON escape, so the file stays valid
    UTF-8 and reads back unchanged."""
    try:
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"),
                          default=jsonable)
    except TypeError:  # a key json cannot write (a tuple, say): jsonable makes it a string
        document = jsonable(document)
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (json.dumps(document, ensure_ascii=True, separators=(",", ":"),
                           default=jsonable) + "\n").encode("ascii")


@dataclass(frozen=True, slots=True)
class _Entry:
    mtime: float
    size: int


class JournalIndex:
    """The journals of one folder, oldest first (by modification time, then name), with
    their count and total size: what retention needs, without reading the folder."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._heap: list[tuple[float, str]] = []
        """(mtime, name), oldest on top; an item whose entry has changed or gone is stale
        and skipped when it comes up."""
        self.count = 0
        self.total_bytes = 0

    @classmethod
    def of_folder(cls, directory: Path) -> JournalIndex:
        """The folder's `*.json` files as they are now (empty when it does not exist)."""
        index = cls()
        try:
            with os.scandir(directory) as listing:
                for item in listing:
                    if not item.name.endswith(".json"):
                        continue
                    try:
                        if item.is_file():
                            stat = item.stat()
                            index.add(item.name, stat.st_mtime, stat.st_size)
                    except OSError:
                        continue  # removed while listed
        except (FileNotFoundError, NotADirectoryError):
            pass
        return index

    def add(self, name: str, mtime: float, size: int) -> None:
        """A journal written (or written again) as `name`."""
        self.discard(name)
        self._entries[name] = _Entry(mtime, size)
        heapq.heappush(self._heap, (mtime, name))
        self.count += 1
        self.total_bytes += size

    def discard(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is not None:
            self.count -= 1
            self.total_bytes -= entry.size

    def oldest(self) -> tuple[str, float, int] | None:
        """The oldest journal's name, mtime and size, or None when there is none."""
        heap = self._heap
        while heap:
            mtime, name = heap[0]
            entry = self._entries.get(name)
            if entry is not None and entry.mtime == mtime:
                return name, mtime, entry.size
            heapq.heappop(heap)
        return None

    def pop_oldest(self) -> None:
        found = self.oldest()
        if found is not None:
            heapq.heappop(self._heap)
            self.discard(found[0])


class JournalStore:
    """Writes journals into one directory and prunes it to the retention settings."""

    def __init__(self, settings: JournalSettings, *, clock: Callable[[], float] = time.time
                 ) -> None:
        self.settings = settings
        self.directory = Path(settings.dir)
        self._clock = clock
        self._lock = threading.Lock()
        """Writes may come from worker threads: one index update at a time."""
        self._index: JournalIndex | None = None
        self._writes_since_scan = 0

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    async def save_turns(self, named: list[tuple[str, Turn, JournalRecorder]],
                         origin: Mapping[str, str | int] | None = None) -> None:
        """Each turn's journal, built on the loop (it reads the turn's state) and encoded and
        written in a worker thread, so a big journal never holds the event loop (issue 12
        item 3). The thread finishes its writes even if the caller is cancelled meanwhile.
        `origin` (where the turns ran) goes into every one of them."""
        if not self.enabled or not named:
            return
        documents = [(name, self.document(turn, recorder, origin))
                     for name, turn, recorder in named]
        await asyncio.to_thread(self._write_all, documents)

    def _write_all(self, documents: list[tuple[str, dict[str, Any]]]) -> None:
        for name, document in documents:
            self.write(name, document)

    @staticmethod
    def document(turn: Turn, recorder: JournalRecorder,
                 origin: Mapping[str, str | int] | None = None) -> dict[str, Any]:
        return journal_document(recorder.scenario(), turn.transitions, turn.result().as_dict(),
                                origin)

    def write(self, name: str, document: dict[str, Any]) -> Path | None:
        if not self.enabled:
            return None
        path = self.directory / f"{name}.json"
        try:
            stat = self._write_file(path, encode_journal(document))
        except OSError as exc:
            log.warning("journal %s not written: %s", path.name, exc.strerror)
            return None
        with self._lock:
            index = self._current_index()
            index.add(path.name, stat.st_mtime, stat.st_size)
            self._prune(index)
        return path

    def prune(self) -> int:
        """Read the folder again and remove the oldest journals beyond the retention;
        returns how many went."""
        with self._lock:
            self._index = JournalIndex.of_folder(self.directory)
            self._writes_since_scan = 0
            return self._prune(self._index)

    @staticmethod
    def _write_file(path: Path, data: bytes) -> os.stat_result:
        """Write whole or not at all (a hidden `.partial` renamed into place)."""
        partial = path.with_name(f".{path.name}.partial")
        try:
            partial.write_bytes(data)
        except FileNotFoundError:  # the first journal, or the folder removed by hand
            path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(data)
        partial.replace(path)
        return path.stat()

    def _current_index(self) -> JournalIndex:
        """The index, read from the folder at the first write and again after as many
        writes as it held journals: a constant cost per write, whatever the folder holds."""
        index = self._index
        if index is None or self._writes_since_scan >= max(RESCAN_EVERY, index.count):
            index = self._index = JournalIndex.of_folder(self.directory)
            self._writes_since_scan = 0
        self._writes_since_scan += 1
        return index

    def _prune(self, index: JournalIndex) -> int:
        settings = self.settings
        keep_after = (self._clock() - settings.max_age_days * 86_400
                      if settings.max_age_days is not None else None)
        removed = 0
        stuck: list[tuple[str, float, int]] = []
        """Journals that could not be removed: they still count, and are tried next time."""
        stuck_bytes = 0
        while (oldest := index.oldest()) is not None:
            name, mtime, size = oldest
            too_old = keep_after is not None and mtime < keep_after
            too_many = (settings.max_files is not None
                        and index.count + len(stuck) > settings.max_files)
            too_big = (settings.max_bytes is not None
                       and index.total_bytes + stuck_bytes > settings.max_bytes)
            if not (too_old or too_many or too_big):
                break
            index.pop_oldest()
            try:
                (self.directory / name).unlink()
            except FileNotFoundError:
                continue  # removed by hand: it no longer counts
            except OSError as exc:
                log.warning("journal %s not pruned: %s", name, exc.strerror)
                stuck.append(oldest)
                stuck_bytes += size
                continue
            removed += 1
        for name, mtime, size in stuck:
            index.add(name, mtime, size)
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
