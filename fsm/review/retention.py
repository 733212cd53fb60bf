"""Where a running bot's journals go, and how long they stay: a folder with a retention
policy (count, age, bytes), or nowhere at all.

A bot writes a journal per turn for weeks; without pruning the folder only grows. The API
for the application (the Discord bot, the terminal chat):

    store = JournalStore(Path("journals"), RetentionPolicy(max_files=5000, max_age_days=14))
    store = JournalStore(None)                     # journals off: nothing recorded or kept
    if store.enabled:
        turn.recorder = JournalRecorder(...)       # record only when something is kept
    ...
    await store.save(f"{channel_id}-{message_id}-{turn.turn_id}", document)

`save` serializes and writes in a worker thread (never on the event loop), names the file
safely (no path separators from model names or ids), writes it whole or not at all (a
hidden `.partial` file renamed into place), and prunes the folder on the first save and then
every `prune_every` saves; `prune()` runs it on demand, `prune(directory, policy)` is the
same as a plain function. `RetentionPolicy` is a frozen pydantic model, so it nests in an
operator's settings. Pruning touches only journal files (`*.json`, `*.jsonl`) directly in
the folder, oldest first, and never a write in progress.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .journal import write_journal

log = logging.getLogger(__name__)

JOURNAL_SUFFIXES = (".json", ".jsonl")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class RetentionPolicy(BaseModel):
    """How many journals to keep: each limit left as None does not apply. A journal is
    removed when it is older than `max_age_days`, or when keeping it would exceed
    `max_files` or `max_bytes` counted from the newest."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_files: int | None = Field(10_000, ge=1)
    max_age_days: float | None = Field(30.0, gt=0)
    max_bytes: int | None = Field(512 * 1024 * 1024, ge=1)


@dataclass(frozen=True, slots=True)
class PruneReport:
    removed: int
    kept: int
    bytes_kept: int


def prune(directory: Path, policy: RetentionPolicy, now: float | None = None) -> PruneReport:
    """Remove the journals in `directory` that `policy` does not keep (blocking)."""
    now = time.time() if now is None else now
    entries: list[tuple[float, int, Path]] = []
    try:
        candidates = list(directory.iterdir())
    except FileNotFoundError:
        return PruneReport(removed=0, kept=0, bytes_kept=0)
    for path in candidates:
        if path.name.startswith(".") or path.suffix not in JOURNAL_SUFFIXES:
            continue
        try:
            stat = path.stat()
        except OSError:
            continue
        if path.is_file():
            entries.append((stat.st_mtime, stat.st_size, path))
    entries.sort(key=lambda entry: (entry[0], entry[2].name), reverse=True)
    oldest = now - policy.max_age_days * 86_400 if policy.max_age_days is not None else None
    kept = removed = total = 0
    for mtime, size, path in entries:
        keep = (
            (oldest is None or mtime >= oldest)
            and (policy.max_files is None or kept < policy.max_files)
            and (policy.max_bytes is None or total + size <= policy.max_bytes)
        )
        if keep:
            kept += 1
            total += size
            continue
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("journal %s not pruned: %s", path.name, exc.strerror)
            kept += 1
            total += size
    return PruneReport(removed=removed, kept=kept, bytes_kept=total)


def safe_filename(name: str) -> str:
    """`name` as one file name: anything but letters, digits, `.`, `_`, `-` becomes `_`."""
    cleaned = _UNSAFE.sub("_", name).strip("._") or "journal"
    return cleaned[:200]


class JournalStore:
    """Saves journals into a folder under a retention policy; with no folder, saves nothing."""

    def __init__(self, directory: Path | None, retention: RetentionPolicy | None = None,
                 prune_every: int = 100) -> None:
        if prune_every < 1:
            raise ValueError("prune_every must be at least 1")
        self.directory = directory
        self.retention = retention if retention is not None else RetentionPolicy()
        self.prune_every = prune_every
        self._saves = 0

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def path_for(self, name: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / (safe_filename(name) + ".json")

    async def save(self, name: str, document: dict[str, Any]) -> Path | None:
        """Write the journal `name` (off the event loop); None when journals are off or the
        write failed (logged: a full disk must not fail the turn)."""
        path = self.path_for(name)
        if path is None:
            return None
        self._saves += 1
        should_prune = self._saves % self.prune_every == 1 or self.prune_every == 1
        try:
            await asyncio.to_thread(self._write, path, document, should_prune)
        except OSError as exc:
            log.warning("journal %s not written: %s", path.name, exc.strerror or exc)
            return None
        return path

    def _write(self, path: Path, document: dict[str, Any], should_prune: bool) -> None:
        write_journal(path, document)
        if should_prune:
            self._prune_now()

    def _prune_now(self) -> PruneReport:
        assert self.directory is not None
        report = prune(self.directory, self.retention)
        if report.removed:
            log.info("journals: pruned %d, kept %d (%d bytes)", report.removed, report.kept,
                     report.bytes_kept)
        return report

    async def prune(self) -> PruneReport:
        """Apply the retention policy now (in a worker thread)."""
        if self.directory is None:
            return PruneReport(removed=0, kept=0, bytes_kept=0)
        return await asyncio.to_thread(self._prune_now)
