"""The bot's journal store at scale (O9): retention kept by an in-memory index, so a write
neither lists nor stats the folder; files removed by hand are dropped, not fatal; journals
written as one line of compact JSON that every reader still reads."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fsm.cli import main as fsm_main
from fsm.journal import read_journal
from fsm.review.inspect import load_journal
from fsm.review.web.catalog import Catalog
from fsm.scenarios.demo import main as demo_main
from turn_engine.journals import JournalStore, encode_journal
from turn_engine.settings import JournalSettings


def _names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.json"))


def _counting(monkeypatch: pytest.MonkeyPatch, calls: dict[str, int], name: str) -> None:
    real: Callable[..., Any] = getattr(os, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(os, name, counted)


def test_a_write_neither_lists_nor_stats_the_folder(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # covers O9: retention by count at a constant cost per write (no folder scan per write)
    folder = tmp_path / "journals"
    folder.mkdir()
    for n in range(500):  # a bot restarted with a full folder
        old = folder / f"old{n:04d}.json"
        old.write_text(json.dumps({"n": n}) + "\n")
        os.utime(old, (1_000_000.0 + n, 1_000_000.0 + n))
    store = JournalStore(JournalSettings(dir=str(folder), max_files=500))
    assert store.write("new0000", {"n": 0}) is not None  # the one reading of the folder
    assert _names(folder)[0] == "new0000" and "old0000" not in _names(folder)

    calls = {"scandir": 0, "listdir": 0, "stat": 0}
    for name in calls:
        _counting(monkeypatch, calls, name)
    for n in range(1, 301):
        assert store.write(f"new{n:04d}", {"n": n}) is not None
    monkeypatch.undo()

    assert calls["scandir"] == 0 and calls["listdir"] == 0
    assert calls["stat"] == 300  # one per write: the journal just written, never the others
    kept = _names(folder)
    assert len(kept) == 500
    assert kept[:301] == [f"new{n:04d}" for n in range(301)]  # the oldest went, in order
    assert kept[301:] == [f"old{n:04d}" for n in range(301, 500)]


def test_files_removed_by_hand_do_not_break_pruning(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    # covers O9: a journal removed by hand is dropped from the index; the limit still holds
    folder = tmp_path / "journals"
    store = JournalStore(JournalSettings(dir=str(folder), max_files=3))
    for n in range(5):
        store.write(f"j{n}", {"n": n})
    assert _names(folder) == ["j2", "j3", "j4"]

    caplog.set_level(logging.WARNING, logger="turn_engine.journals")
    (folder / "j2.json").unlink()  # the oldest, by hand
    store.write("j5", {"n": 5})
    assert _names(folder) == ["j3", "j4", "j5"]

    (folder / "j4.json").unlink()  # one in the middle
    for n in range(6, 9):
        store.write(f"j{n}", {"n": n})
    assert _names(folder) == ["j6", "j7", "j8"]

    shutil.rmtree(folder)  # the whole folder
    store.write("j9", {"n": 9})
    assert _names(folder) == ["j9"]
    assert store.prune() == 0 and _names(folder) == ["j9"]
    assert caplog.records == []


def test_explicit_prune_reads_journals_added_by_hand(tmp_path: Path) -> None:
    # covers O9: `prune()` applies the retention to the folder as it is now
    folder = tmp_path / "journals"
    store = JournalStore(JournalSettings(dir=str(folder), max_files=2))
    store.write("b", {"n": 1})
    (folder / "a.json").write_text("{}\n")
    os.utime(folder / "a.json", (1_000_000.0, 1_000_000.0))
    (folder / "notes.txt").write_text("not a journal")
    store.write("c", {"n": 2})
    assert store.prune() == 1
    assert _names(folder) == ["b", "c"] and (folder / "notes.txt").exists()


def test_journals_are_compact_json_that_every_reader_reads(tmp_path: Path) -> None:
    # covers O9: the store's journals (one line, C encoder) read back by replay, inspect,
    # diagram and the review page as the indented ones did
    demo_dir, store_dir = tmp_path / "demo", tmp_path / "store"
    assert demo_main(demo_dir) == 0  # the demo's journals: indented, a human-facing command
    store = JournalStore(JournalSettings(dir=str(store_dir), max_files=None))
    written: list[str] = []
    for indented in sorted(demo_dir.glob("*.json")):
        document = json.loads(indented.read_text(encoding="utf-8"))
        path = store.write(indented.stem, document)
        assert path is not None
        text = path.read_text(encoding="utf-8")
        assert text.count("\n") == 1 and text.endswith("}\n") and '": ' not in text
        assert read_journal(path) == document
        compact, spaced = load_journal(path), load_journal(indented)
        assert (compact.transitions, compact.result, compact.scenario) == \
            (spaced.transitions, spaced.result, spaced.scenario)
        written.append(str(path))
    for journal in written:
        assert fsm_main(["replay", journal]) == 0
    assert fsm_main(["inspect", *written]) == 0
    assert fsm_main(["diagram", "--journal", written[0], "--out", str(tmp_path / "d"),
                     "--markdown", str(tmp_path / "d.md")]) == 0  # graphviz: scripts/setup.sh
    scan = Catalog(store_dir).scan()
    assert scan.problems == [] and len(scan.rows) == len(written)


def test_compact_encoding_keeps_bytes_objects_and_lone_surrogates() -> None:
    # covers O9: what the indented writer neutralized, the compact one does the same way
    document = {"raw": b"\x00\x01", "big": b"x" * 100, "cut": "half \ud83d",
                "other": {1, 2} - {1}, "n": (1, 2)}
    decoded = json.loads(encode_journal(document))
    assert decoded["raw"] == {"$bytes": "AAE="}
    assert decoded["big"]["length"] == 100 and "$bytes_sha256" in decoded["big"]
    assert decoded["cut"] == "half \ud83d" and decoded["other"] == "{2}"
    assert decoded["n"] == [1, 2]
    assert encode_journal({"é": "ü"}) == '{"é":"ü"}\n'.encode()


@pytest.mark.asyncio
async def test_turn_journals_are_encoded_and_written_off_the_event_loop(tmp_path: Path) -> None:
    # covers O9 with issue 12 item 3: serializing and writing a journal never holds the loop
    import threading

    from fsm.journal import JournalRecorder
    from fsm.scenarios.format import parse_scenario
    from fsm.scenarios.runner import play

    store = JournalStore(JournalSettings(dir=str(tmp_path), max_files=10))
    writers: list[int] = []
    real_write = store.write

    def write(name: str, document: dict[str, Any]) -> Path | None:
        writers.append(threading.get_ident())
        return real_write(name, document)

    store.write = write  # type: ignore[method-assign]
    played = await play(parse_scenario({"passes": [[{"at": 0.0, "text": "hi"},
                                                    {"at": 0.1, "end": "completed"}]]}))
    recorder = JournalRecorder(played.turn.turn_id, played.turn.config, played.turn.tools,
                               request=played.turn.request)
    await store.save_turns([("one", played.turn, recorder)])
    assert writers and threading.get_ident() not in writers
    assert read_journal(tmp_path / "one.json")["result"]["status"] == "completed"
