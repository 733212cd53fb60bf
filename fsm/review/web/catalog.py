"""The review page's index of a folder of journals: one row per turn, filters and text search.

A production bot leaves thousands of journals in a folder, and a reviewer looks for a few:
the turns that timed out yesterday, the ones that called a tool, the one that said "cat". The
folder is rescanned on every listing (a stat per file), and a file is parsed again only when
its size or modification time changed, so journals written while the page is open show up.
A file that is not a readable journal is listed as a problem with a one-line reason, never
dropped silently, and never fails the listing (V5): every field is type-checked where it is
read, a file larger than the page's budget is not parsed, and a link that leads out of the
folder is not followed. A listing reads new files for a bounded time (`scan(budget_s)`) and
counts the rest as pending, so a folder of many large files never holds one request long.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from ...engine.table import TERMINAL
from ...journal import ScenarioError
from ..inspect import Journal, load_journal, outcome_of, reply_attempts, reply_of

JOURNAL_SUFFIXES = (".json", ".jsonl")
RUNNING = "(not terminal)"
"""The state filter's value for a journal that ended in no terminal state."""
PREVIEW_CHARS = 240
"""The list shows the start of a turn's delivered text; the turn's page shows all of it."""
NONE = "(none)"
"""The notice and tool filters' value for a turn that posted no notice or called no tool."""

_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)


class QueryError(ValueError):
    """A filter the page sent that cannot be applied; the message is one line."""


@dataclass(frozen=True, slots=True)
class Row:
    """What the list shows of one journal, and what its filters and search look at."""

    id: str
    name: str
    final_state: str
    status: str
    notices: tuple[str, ...]
    tools: tuple[str, ...]
    duration: float
    passes: int
    restarts: int
    recorded: datetime
    error: str
    text: str
    haystack: str
    reply: dict[str, Any] | None = None
    """The reply the turn is an attempt of (V9): id, attempt, attempts, answered_by,
    status, notices the user saw."""

    @property
    def group(self) -> str:
        """What the list groups by: the reply, or the turn itself."""
        return str(self.reply["id"]) if self.reply and self.reply.get("id") else self.id

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "final_state": self.final_state,
            "terminal": self.final_state in _TERMINAL_NAMES, "status": self.status,
            "outcome": outcome_of(self.status), "reply": self.reply,
            "notices": list(self.notices), "tools": list(self.tools),
            "duration": self.duration, "passes": self.passes, "restarts": self.restarts,
            "recorded": self.recorded.isoformat(timespec="seconds"), "error": self.error,
            "text": self.text if len(self.text) <= PREVIEW_CHARS
            else self.text[:PREVIEW_CHARS - 1] + "…",
        }


@dataclass(frozen=True, slots=True)
class Problem:
    """A file in the folder that could not be read as a journal."""

    id: str
    error: str


class NotListed(LookupError):
    """An id the folder does not list (or lists as a problem): nothing outside is read."""


class TooLarge(ValueError):
    """A journal over the page's size budget."""


def _strings(value: Any) -> list[str]:
    """The strings of a JSON list; anything else (a number where a list belongs, a list of
    objects) gives none."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _string(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _texts(value: Any) -> list[str]:
    """Every string inside a decoded JSON value (what the user and the model wrote)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _texts(v)]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v)]
    return []


def tools_of(journal: Journal) -> list[str]:
    """The tools the turn called, in order of first call, from its result."""
    result = journal.result
    names = _strings(result.get("function_history"))
    infos = result.get("pass_results")
    for info in infos if isinstance(infos, list) else []:
        if isinstance(info, dict):
            names += _strings(info.get("tool_calls"))
    return list(dict.fromkeys(n for n in names if n))


def row_of(journal: Journal, row_id: str, recorded: datetime) -> Row:
    """The list row of one parsed journal."""
    result = journal.result
    notices = _strings(result.get("notices"))
    deferred = result.get("deferred_notice")
    if isinstance(deferred, str) and deferred and deferred not in notices:
        notices.append(deferred)
    delivered = _string(result.get("delivered_text")) or _string(result.get("text"))
    error = _string(result.get("error"))
    passes = _count(result.get("passes"))
    tools = tools_of(journal)
    request = journal.scenario.get("request")
    reply = _reply(journal)
    if reply is not None:
        notices += [n for n in reply["notices"] if n not in notices]
    searched = [journal.name, delivered, error, *tools, *notices,
                *_texts(result.get("pass_results")), *_texts(journal.scenario.get("history")),
                *(_texts(request.get("prefill")) if isinstance(request, dict) else [])]
    return Row(
        id=row_id, name=journal.name, final_state=journal.final_state,
        status=_string(result.get("status")) or "?", notices=tuple(notices),
        tools=tuple(tools), duration=journal.duration,
        passes=passes if passes is not None else sum(
            1 for tr in journal.transitions if tr.event == "begin"),
        restarts=sum(1 for tr in journal.transitions if tr.event == "restart"),
        recorded=recorded, error=error, text=delivered,
        haystack="\n".join(searched).casefold(), reply=reply,
    )


def _reply(journal: Journal) -> dict[str, Any] | None:
    """What the list shows of the reply a turn is an attempt of, type-checked."""
    record = reply_of(journal)
    reply_id = record.get("id")
    if not isinstance(reply_id, str) or not reply_id:
        return None
    attempt, answered = _count(record.get("attempt")), _count(record.get("answered_by"))
    return {"id": reply_id, "attempt": attempt, "attempts": len(reply_attempts(record)),
            "answered_by": answered, "status": _string(record.get("status")) or "?",
            "outcome": outcome_of(record.get("status")),
            "notices": _strings(record.get("notices")),
            "final_notice": _string(record.get("final_notice"))}


@dataclass(frozen=True, slots=True)
class Query:
    """The list's filters; empty fields filter nothing."""

    state: str = ""
    status: str = ""
    notice: str = ""
    tool: str = ""
    min_duration: float | None = None
    max_duration: float | None = None
    since: date | None = None
    until: date | None = None
    text: str = ""

    FIELDS = ("state", "status", "notice", "tool", "min_duration", "max_duration", "since",
              "until", "q")

    @classmethod
    def parse(cls, params: dict[str, str]) -> Query:
        """From the page's query string; a bad value raises QueryError naming it."""
        unknown = sorted(set(params) - set(cls.FIELDS))
        if unknown:
            raise QueryError(f"unknown filter {unknown[0]!r}; filters are "
                             f"{', '.join(cls.FIELDS)}")

        def seconds(name: str) -> float | None:
            raw = params.get(name, "").strip()
            if not raw:
                return None
            try:
                value = float(raw)
            except ValueError:
                raise QueryError(f"{name}: {raw!r} is not a number of seconds") from None
            if not value >= 0:
                raise QueryError(f"{name}: {raw!r} is not a number of seconds")
            return value

        def day(name: str) -> date | None:
            raw = params.get(name, "").strip()
            if not raw:
                return None
            try:
                return date.fromisoformat(raw)
            except ValueError:
                raise QueryError(f"{name}: {raw!r} is not a date (YYYY-MM-DD)") from None

        return cls(state=params.get("state", "").strip(), status=params.get("status", "").strip(),
                   notice=params.get("notice", "").strip(), tool=params.get("tool", "").strip(),
                   min_duration=seconds("min_duration"), max_duration=seconds("max_duration"),
                   since=day("since"), until=day("until"), text=params.get("q", "").strip())

    def matches(self, row: Row) -> bool:
        if self.state:
            state = row.final_state if row.final_state in _TERMINAL_NAMES else RUNNING
            if state != self.state:
                return False
        if self.status and row.status != self.status:
            return False
        if self.notice and not _listed(self.notice, row.notices):
            return False
        if self.tool and not _listed(self.tool, row.tools):
            return False
        if self.min_duration is not None and row.duration < self.min_duration:
            return False
        if self.max_duration is not None and row.duration > self.max_duration:
            return False
        day = row.recorded.date()
        if self.since is not None and day < self.since:
            return False
        if self.until is not None and day > self.until:
            return False
        return all(word in row.haystack for word in self.text.casefold().split())


def _listed(wanted: str, values: tuple[str, ...]) -> bool:
    return not values if wanted == NONE else wanted in values


@dataclass(slots=True)
class _Cached:
    stamp: tuple[int, int]
    row: Row | None
    problem: Problem | None


@dataclass(frozen=True, slots=True)
class Scan:
    """One listing: the journals newest first, the files that are not, and how many files
    were left for the next listing (the time budget ran out)."""

    rows: list[Row]
    problems: list[Problem]
    pending: int = 0


@dataclass(slots=True)
class Catalog:
    """The journals under `root`, kept up to date as files appear, change and go. Used from
    the review page's worker threads, one at a time (a lock)."""

    root: Path
    max_bytes: int = 16 * 1024 * 1024
    _cache: dict[Path, _Cached] = field(default_factory=dict)
    _ids: dict[str, Path] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def scan(self, budget_s: float | None = None) -> Scan:
        """Every journal under the folder, newest first, and the files that are not. With a
        budget, files not read within it (at least one is read) are counted as pending."""
        with self._lock:
            return self._scan(None if budget_s is None else time.monotonic() + budget_s)

    def _scan(self, deadline: float | None) -> Scan:
        rows: list[Row] = []
        problems: list[Problem] = []
        seen: set[Path] = set()
        pending = 0
        read_one = False
        for path in sorted(self.root.rglob("*")):
            if path.suffix not in JOURNAL_SUFFIXES or not path.is_file():
                continue
            seen.add(path)
            if deadline is not None and read_one and time.monotonic() > deadline \
                    and not self._fresh(path):
                pending += 1
                continue
            entry, parsed = self._entry(path)
            read_one = read_one or parsed
            if entry.row is not None:
                rows.append(entry.row)
            elif entry.problem is not None:
                problems.append(entry.problem)
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        self._ids = {entry.row.id: path for path, entry in self._cache.items()
                     if entry.row is not None}
        return Scan(grouped(rows), problems, pending)

    def ids_named(self, names: list[str]) -> dict[str, str]:
        """The ids of listed journals with these names (a reply's other attempts)."""
        wanted = set(names)
        with self._lock:
            return {entry.row.name: entry.row.id for entry in self._cache.values()
                    if entry.row is not None and entry.row.name in wanted}

    def path_of(self, row_id: str) -> Path:
        """The file of a listed journal (scanning once more for one not seen yet); NotListed
        for an id the folder does not list, so no request can name a file outside it."""
        with self._lock:
            path = self._ids.get(row_id)
            if path is None:
                self._scan(None)
                path = self._ids.get(row_id)
        if path is None:
            raise NotListed(row_id)
        return path

    def load(self, row_id: str) -> Journal:
        """A listed journal, read again (its size within the budget)."""
        path = self.path_of(row_id)
        size = path.stat().st_size
        if size > self.max_bytes:
            raise TooLarge(_too_large(size, self.max_bytes))
        return load_journal(self._inside(path))

    def _inside(self, path: Path) -> Path:
        """The real file behind `path`, which must lie under the root (a link may point
        elsewhere in the folder, never out of it)."""
        real = path.resolve(strict=True)
        if not real.is_relative_to(self.root.resolve()):
            raise NotListed(path.relative_to(self.root).as_posix())
        return real

    def _fresh(self, path: Path) -> bool:
        cached = self._cache.get(path)
        if cached is None:
            return False
        try:
            stat = path.stat()
        except OSError:
            return False
        return cached.stamp == (stat.st_mtime_ns, stat.st_size)

    def _entry(self, path: Path) -> tuple[_Cached, bool]:
        """The file's entry, and whether it had to be parsed."""
        row_id = path.relative_to(self.root).as_posix()
        try:
            stat = path.stat()
        except OSError as exc:
            return _Cached((0, 0), None, Problem(row_id, _reason(exc))), False
        stamp = (stat.st_mtime_ns, stat.st_size)
        cached = self._cache.get(path)
        if cached is not None and cached.stamp == stamp:
            return cached, False
        recorded = datetime.fromtimestamp(stat.st_mtime, UTC)
        try:
            if stat.st_size > self.max_bytes:
                raise TooLarge(_too_large(stat.st_size, self.max_bytes))
            real = self._inside(path)
            entry = _Cached(stamp, row_of(load_journal(real), row_id, recorded), None)
        except NotListed:
            entry = _Cached(stamp, None, Problem(row_id, "a link to a file outside the folder; "
                                                         "not read"))
        except Exception as exc:  # one bad file is one problem, never a failed listing
            entry = _Cached(stamp, None, Problem(row_id, _reason(exc)))
        self._cache[path] = entry
        return entry, True


def grouped(rows: list[Row]) -> list[Row]:
    """Newest first, a reply's attempts together and in order under the newest of them."""
    newest: dict[str, float] = {}
    for row in rows:
        newest[row.group] = max(newest.get(row.group, 0.0), row.recorded.timestamp())

    def order(row: Row) -> tuple[float, str, int, str]:
        attempt = row.reply.get("attempt") if row.reply else None
        return (-newest[row.group], row.group, attempt if isinstance(attempt, int) else 0,
                row.id)

    return sorted(rows, key=order)


def _too_large(size: int, limit: int) -> str:
    return f"{size / 1e6:.1f} MB: larger than the {limit / 1e6:.1f} MB the review page reads"


def _reason(exc: BaseException) -> str:
    """One line saying why a file is not a journal."""
    if isinstance(exc, (ScenarioError, TooLarge, OSError)):
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return message[:300]
    return f"not readable as a journal ({type(exc).__name__})"


def facets(rows: list[Row]) -> dict[str, list[str]]:
    """The values each select of the page offers, from what the folder holds."""
    states = sorted({r.final_state if r.final_state in _TERMINAL_NAMES else RUNNING
                     for r in rows})
    return {
        "state": states,
        "status": sorted({r.status for r in rows}),
        "notice": [NONE, *sorted({n for r in rows for n in r.notices})],
        "tool": [NONE, *sorted({t for r in rows for t in r.tools})],
    }
