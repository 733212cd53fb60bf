"""Where the bot and the terminal chat keep turn journals, and for how long.

Journals hold what users wrote, so they are kept within the operator's retention (a count,
an age, a total size) and can be turned off altogether. Pruning runs after each write and
removes the oldest journals first; it only ever touches `*.json` files of its directory.

A bot writes a journal per turn, so neither writing nor pruning may cost more as the folder
fills: the store reads the folder once and then keeps its own index of the journals (oldest
first, with their count and bytes), updated by every write and removal; and a journal is one
line of compact JSON, which orjson writes (the standard library's C encoder where orjson
cannot write the same; the standard library's indented JSON takes its pure-Python path,
several times slower). Files removed by hand are dropped from the index when pruning
reaches them; the folder is read again after as many writes as it held journals (at least
`RESCAN_EVERY`) and on every explicit `prune()`, so files added or re-dated by hand are
seen too, at a cost per write that stays constant.

A reply (one generation turn: an attempt and its fallbacks) writes one journal per attempt,
named `{reply}-a{n}-{label}` where the reply id is `{UTC time}-{where}-{random}`: unique
across sessions and processes (the time and 32 random bits, not a counter that starts again
at 1), portable (letters, digits, `.`, `_` and `-` only: no `:` for Windows, shells and
URLs) and without repeated parts (V8). Every attempt's journal carries the reply's outcome
(`reply`: the attempts and their journals, which one answered, the notices the user saw), so
`inspect` and the review page find it whichever journal they open (V9).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fsm import GenerationResult, ToolRegistry, Turn
from fsm.journal import JournalRecorder, journal_document, jsonable, orjson_bytes

from .settings import JournalSettings

log = logging.getLogger(__name__)

RESCAN_EVERY = 1000
"""The fewest writes between two readings of the folder."""


def encode_journal(document: dict[str, Any]) -> bytes:
    """The journal as one line of UTF-8 JSON: by orjson where it writes what the standard
    library would (`fsm.journal.encoding`), by the standard library's C encoder (compact
    separators) otherwise. Bytes, non-finite floats and unknown objects are written as
    `jsonable` writes them; a lone surrogate (half an emoji cut by a provider) as its JSON
    escape, so the file stays valid UTF-8 and reads back unchanged."""
    fast = orjson_bytes(document, jsonable)
    if fast is not None:
        return fast
    try:
        return (_stdlib_json(document, ascii_only=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return (_stdlib_json(document, ascii_only=True) + "\n").encode("ascii")


def _stdlib_json(document: dict[str, Any], *, ascii_only: bool) -> str:
    try:
        return json.dumps(document, ensure_ascii=ascii_only, separators=(",", ":"),
                          default=jsonable, allow_nan=False)
    except (TypeError, ValueError):  # a key json cannot write (a tuple, say), a non-finite
        pass  # float: jsonable makes them a string and None
    return json.dumps(jsonable(document), ensure_ascii=ascii_only, separators=(",", ":"))


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
                         origin: Mapping[str, str | int] | None = None,
                         reply: Callable[[int], dict[str, Any]] | None = None) -> None:
        """Each turn's journal, built on the loop (it reads the turn's state) and encoded and
        written in a worker thread, so a big journal never holds the event loop (issue 12
        item 3). The thread finishes its writes even if the caller is cancelled meanwhile.
        `origin` (where the turns ran) goes into every one of them, and `reply(n)` the
        reply's outcome as the n-th of them records it."""
        if not self.enabled or not named:
            return
        documents = [(name, self.document(turn, recorder, origin,
                                          reply(n) if reply is not None else None))
                     for n, (name, turn, recorder) in enumerate(named, 1)]
        await asyncio.to_thread(self._write_all, documents)

    def _write_all(self, documents: list[tuple[str, dict[str, Any]]]) -> None:
        for name, document in documents:
            self.write(name, document)

    @staticmethod
    def document(turn: Turn, recorder: JournalRecorder,
                 origin: Mapping[str, str | int] | None = None,
                 reply: Mapping[str, Any] | None = None) -> dict[str, Any]:
        document = journal_document(recorder.scenario(), turn.transitions,
                                    turn.result().as_dict(), origin)
        if reply is not None:
            document["reply"] = dict(reply)
        return document

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


NAME_PART_CHARS = 48
_NOT_PORTABLE = re.compile(r"[^A-Za-z0-9._-]+")


def portable(text: str, limit: int = NAME_PART_CHARS) -> str:
    """`text` as a part of a file name that every system and shell takes as it is: runs of
    anything but letters, digits, `.`, `_` and `-` become one `_`, at most `limit` long, never
    empty and never starting with `.` or `-`."""
    part = _NOT_PORTABLE.sub("_", text).strip("._-")[:limit].rstrip("._-")
    return part or "x"


def new_reply_id(where: str, now: float | None = None) -> str:
    """`20260314T101502Z-{where}-{8 hex}`: sortable by time, unique across sessions and
    processes without a counter (V8)."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return f"{stamp:%Y%m%dT%H%M%SZ}-{portable(where)}-{secrets.token_hex(4)}"


@dataclass
class ReplyJournals:
    """The journals of one reply: each attempt is recorded as the generation turn starts it
    (`on_attempt`), and `save` writes them all with the reply's outcome (V8, V9)."""

    store: JournalStore | None
    """None: journals are not kept (the reply is still recorded, for its outcome)."""
    where: str
    """What the reply answers, for its id: `chat`, or the channel and message."""
    labels: Sequence[str]
    """The labels of the attempts, in the order the generation turn tries them."""
    tools: ToolRegistry
    history: list[dict[str, Any]] = field(default_factory=list)
    id: str = ""
    recorded: list[tuple[str, Turn, JournalRecorder]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.id:
            self.id = new_reply_id(self.where)

    def on_attempt(self, turn: Turn) -> None:
        """Record the attempt the generation turn is about to run."""
        n = len(self.recorded) + 1
        label = self.labels[n - 1] if n <= len(self.labels) else turn.turn_id
        name = f"{self.id}-a{n}-{portable(label)}"
        recorder = JournalRecorder(name, turn.config, self.tools, history=self.history,
                                   request=turn.request)
        turn.recorder = recorder
        self.recorded.append((name, turn, recorder))

    def outcome(self, result: GenerationResult | None, n: int) -> dict[str, Any]:
        """The reply's outcome as the journal of attempt `n` records it: every attempt with
        its journal, which one answered, the notices the user saw. With no result (the reply
        was cancelled or failed outside the engine), what the attempts' own turns say."""
        attempts: list[dict[str, Any]] = []
        for index, (name, turn, _recorder) in enumerate(self.recorded, 1):
            ended = turn.result()
            attempts.append({"attempt": index, "label": self._label(index, turn),
                             "journal": name, "status": ended.status, "state": ended.state,
                             "notices": list(ended.notices)})
        answered = None
        if result is not None and result.status == "completed" and attempts:
            answered = len(result.attempts)
        notices = list(result.notices) if result is not None else \
            [notice for a in attempts for notice in a["notices"]]
        return {
            "id": self.id, "attempt": n, "attempts": attempts, "answered_by": answered,
            "status": result.status if result is not None else
            (attempts[-1]["status"] if attempts else "error"),
            "notices": notices,
            "final_notice": (result.failure_notice_posted or result.deferred_notice_posted)
            if result is not None else None,
            "delivered_text": result.delivered_text if result is not None else "",
            "superseded_deleted": result.superseded_deleted if result is not None else 0,
            "finished": result is not None,
        }

    def _label(self, index: int, turn: Turn) -> str:
        return self.labels[index - 1] if index <= len(self.labels) else turn.turn_id

    async def save(self, result: GenerationResult | None,
                   origin: Mapping[str, str | int] | None = None) -> None:
        """Every attempt's journal, each with the reply's outcome."""
        if self.store is not None:
            await self.store.save_turns(self.recorded, origin,
                                        reply=lambda n: self.outcome(result, n))
