"""Journals are pruned and written off the event loop (issue 12): a retention policy by
count, age and bytes; journals off; safe file names; serialization in a worker thread."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from fsm.review import journal as journal_module
from fsm.review.retention import JournalStore, RetentionPolicy, prune, safe_filename

NOW = 1_800_000_000.0


def _journal(folder: Path, name: str, age_days: float, size: int = 100) -> Path:
    path = folder / name
    path.write_text("x" * size)
    mtime = NOW - age_days * 86_400
    os.utime(path, (mtime, mtime))
    return path


def _names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_prune_keeps_the_newest_within_count(tmp_path: Path) -> None:
    # covers the journal retention rule: at most max_files, oldest removed first
    for day in range(5):
        _journal(tmp_path, f"j{day}.json", age_days=day)
    report = prune(tmp_path, RetentionPolicy(max_files=2, max_age_days=None, max_bytes=None),
                   now=NOW)
    assert _names(tmp_path) == {"j0.json", "j1.json"}
    assert (report.removed, report.kept, report.bytes_kept) == (3, 2, 200)


def test_prune_removes_what_is_older_than_the_age(tmp_path: Path) -> None:
    # covers the journal retention rule: nothing older than max_age_days
    for day in (0, 3, 10, 40):
        _journal(tmp_path, f"d{day}.json", age_days=day)
    prune(tmp_path, RetentionPolicy(max_files=None, max_age_days=7, max_bytes=None), now=NOW)
    assert _names(tmp_path) == {"d0.json", "d3.json"}


def test_prune_keeps_within_the_byte_budget(tmp_path: Path) -> None:
    # covers the journal retention rule: the newest journals that fit in max_bytes
    _journal(tmp_path, "new.json", 0, size=400)
    _journal(tmp_path, "mid.json", 1, size=400)
    _journal(tmp_path, "old.json", 2, size=400)
    prune(tmp_path, RetentionPolicy(max_files=None, max_age_days=None, max_bytes=1000),
          now=NOW)
    assert _names(tmp_path) == {"new.json", "mid.json"}


def test_prune_touches_only_journal_files(tmp_path: Path) -> None:
    # covers the journal retention rule: other files and writes in progress are never removed
    _journal(tmp_path, "old.json", 90)
    _journal(tmp_path, "notes.txt", 90)
    _journal(tmp_path, ".new.json.partial", 90)
    (tmp_path / "sub.json").mkdir()
    prune(tmp_path, RetentionPolicy(max_files=1, max_age_days=1, max_bytes=None), now=NOW)
    assert _names(tmp_path) == {"notes.txt", ".new.json.partial", "sub.json"}


def test_policy_refuses_nonsense() -> None:
    # covers the bad-input rule for the operator's settings
    with pytest.raises(ValidationError):
        RetentionPolicy(max_files=0)
    with pytest.raises(ValidationError):
        RetentionPolicy(max_age_days=float("inf"))
    with pytest.raises(ValidationError):
        RetentionPolicy.model_validate({"max_file": 3})


def test_safe_filename_keeps_a_journal_in_its_folder() -> None:
    # covers the journal store: model names and ids cannot climb out of the folder
    assert safe_filename("1-2-owner-openai:meta-llama/Llama-3") == \
        "1-2-owner-openai_meta-llama_Llama-3"
    assert safe_filename("../../etc/passwd") == "etc_passwd"
    assert safe_filename("...") == "journal"


def test_store_writes_off_the_event_loop_and_prunes(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # covers the journal store: serialization happens in a worker thread, never on the
    # loop's thread; the folder is pruned on the first save
    threads: list[str] = []
    original = journal_module.serialize_journal

    def spying(document: dict[str, Any]) -> bytes:
        threads.append(threading.current_thread().name)
        return original(document)

    monkeypatch.setattr(journal_module, "serialize_journal", spying)
    old = _journal(tmp_path, "old.json", age_days=400)
    os.utime(old, (time.time() - 400 * 86_400,) * 2)
    store = JournalStore(tmp_path, RetentionPolicy(max_age_days=30))

    async def save() -> tuple[Path | None, str]:
        path = await store.save("chan-1/msg 2", {"name": "t", "text": "cut \ud83d"})
        return path, threading.current_thread().name

    path, loop_thread = asyncio.run(save())
    assert path == tmp_path / "chan-1_msg_2.json"
    assert threads and threads[0] != loop_thread
    assert json.loads(path.read_text(encoding="utf-8"))["text"] == "cut \ud83d"
    assert not old.exists()


def test_journals_off_write_nothing(tmp_path: Path) -> None:
    # covers journals-off: no folder, no file, nothing recorded for the caller to keep
    store = JournalStore(None)
    assert not store.enabled
    assert asyncio.run(store.save("x", {"name": "x"})) is None
    report = asyncio.run(store.prune())
    assert report.removed == 0 and not any(tmp_path.iterdir())


def test_a_failed_write_is_logged_not_raised(tmp_path: Path) -> None:
    # covers "nothing is lost" for the turn: a full or read-only disk never fails the turn
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = JournalStore(blocker / "journals")
    assert asyncio.run(store.save("x", {"name": "x"})) is None
