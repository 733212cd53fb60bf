"""The review page's index of a folder of journals: one row per turn, filters and text search.

A production bot leaves thousands of journals in a folder, and a reviewer looks for a few:
the turns that timed out yesterday, the ones that called a tool, the one that said "cat". The
folder is rescanned on every listing (a stat per file), and a file is parsed again only when
its size or modification time changed, so journals written while the page is open show up.
A file that is not a readable journal is listed as a problem with a one-line reason, never
dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from ...engine.table import TERMINAL
from ...scenarios.format import ScenarioError
from ..inspect import Journal, load_journal

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

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "final_state": self.final_state,
            "terminal": self.final_state in _TERMINAL_NAMES, "status": self.status,
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


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


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
    for info in result.get("pass_results") or []:
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
    delivered = result.get("delivered_text") or result.get("text") or ""
    passes = result.get("passes")
    tools = tools_of(journal)
    request = journal.scenario.get("request")
    searched = [journal.name, str(delivered), str(result.get("error") or ""), *tools, *notices,
                *_texts(result.get("pass_results")), *_texts(journal.scenario.get("history")),
                *(_texts(request.get("prefill")) if isinstance(request, dict) else [])]
    return Row(
        id=row_id, name=journal.name, final_state=journal.final_state,
        status=str(result.get("status") or "?"), notices=tuple(notices), tools=tuple(tools),
        duration=journal.duration,
        passes=passes if isinstance(passes, int) else sum(
            1 for tr in journal.transitions if tr.event == "begin"),
        restarts=sum(1 for tr in journal.transitions if tr.event == "restart"),
        recorded=recorded, error=str(result.get("error") or ""), text=str(delivered),
        haystack="\n".join(searched).casefold(),
    )


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


@dataclass(slots=True)
class Catalog:
    """The journals under `root`, kept up to date as files appear, change and go."""

    root: Path
    _cache: dict[Path, _Cached] = field(default_factory=dict)

    def scan(self) -> tuple[list[Row], list[Problem]]:
        """Every journal under the folder, newest first, and the files that are not."""
        rows: list[Row] = []
        problems: list[Problem] = []
        seen: set[Path] = set()
        for path in sorted(self.root.rglob("*")):
            if path.suffix not in JOURNAL_SUFFIXES or not path.is_file():
                continue
            seen.add(path)
            entry = self._entry(path)
            if entry.row is not None:
                rows.append(entry.row)
            elif entry.problem is not None:
                problems.append(entry.problem)
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        rows.sort(key=lambda r: (-r.recorded.timestamp(), r.id))
        return rows, problems

    def path_of(self, row_id: str) -> Path | None:
        """The file of a listed journal; None for an id the folder does not list (so no
        request can name a file outside it)."""
        for path, entry in self._cache.items():
            if entry.row is not None and entry.row.id == row_id:
                return path
        self.scan()
        for path, entry in self._cache.items():
            if entry.row is not None and entry.row.id == row_id:
                return path
        return None

    def _entry(self, path: Path) -> _Cached:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        cached = self._cache.get(path)
        if cached is not None and cached.stamp == stamp:
            return cached
        row_id = path.relative_to(self.root).as_posix()
        recorded = datetime.fromtimestamp(stat.st_mtime, UTC)
        try:
            journal = load_journal(path)
            entry = _Cached(stamp, row_of(journal, row_id, recorded), None)
        except (ScenarioError, ValueError, RecursionError, OSError) as exc:
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            entry = _Cached(stamp, None, Problem(row_id, message))
        self._cache[path] = entry
        return entry


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
