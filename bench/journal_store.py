"""Item 7a: the bot's journal store, writing and pruning, before and after (issue 17 item 3).

The bot writes one journal per turn into a folder kept at `max_files` journals. Three
stores, each writing the same `journals` turn journals into an empty folder with
`max_files=keep`, measured in CPU time (`time.process_time`: the machine is shared, and
waiting for a core is not the store's cost), the fastest of `repeats` runs:

- *before*: `turn_engine/journals.py` as it was at `BEFORE_COMMIT` (read from git): every
  write lists and stats the whole folder, and the journal is indented JSON, which the
  standard library encodes in pure Python;
- *index only*: today's store (an in-memory index of the folder, read once) writing the
  indented JSON of before: what the index alone saves;
- *after*: today's store as it is, one line of compact JSON by the C encoder.

The journal is shaped like the full-bot benchmark's turns (item 7): one pass of 42 chunks
of 300 characters, the reply in the result. Without git history the before column is left
out and says so.
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import turn_engine.journals as journals
from fsm.journal import serialize_journal
from fsm.scenarios.demo import main as demo_main
from turn_engine.settings import JournalSettings

from .common import Section, module_at_commit

BEFORE_COMMIT = "64d68cf"
CHUNKS, CHUNK_CHARS = 42, 300


def bot_journal() -> dict[str, Any]:
    """A journal of the demo's plain reply, grown to the full-bot workload's reply."""
    with tempfile.TemporaryDirectory() as folder:
        demo_main(Path(folder), out=io.StringIO())
        document: dict[str, Any] = json.loads(
            (Path(folder) / "01_plain_reply.json").read_text(encoding="utf-8"))
    chunk = ("lorem ipsum dolor sit amet, " * 11)[:CHUNK_CHARS - 1] + " "
    steps: list[dict[str, Any]] = [{"at": round(0.6 + 0.05 * n, 6), "text": chunk}
                                   for n in range(CHUNKS)]
    end = round(0.6 + 0.05 * CHUNKS, 6)
    document["passes"] = [[*steps, {"at": end, "finish": "stop"},
                           {"at": end, "end": "completed"}]]
    reply = chunk * CHUNKS
    document["result"].update(text=reply, delivered_text=reply)
    document["result"]["pass_results"][0]["text"] = reply
    return document


def store_before() -> type[Any] | None:
    """`JournalStore` as it was before the index, or None without git history."""
    module = module_at_commit(BEFORE_COMMIT, "turn_engine/journals.py",
                              "turn_engine.bench_journals_before", package="turn_engine")
    return None if module is None else module.JournalStore


@contextmanager
def indented_journals() -> Iterator[None]:
    """Today's store writing the indented JSON of before."""
    compact = journals.encode_journal
    journals.encode_journal = serialize_journal
    try:
        yield
    finally:
        journals.encode_journal = compact


def run(make_store: Callable[[JournalSettings], Any], document: dict[str, Any],
        count: int, keep: int) -> tuple[float, int, int]:
    """CPU seconds to write `count` journals into an empty folder kept at `keep`; the
    journals left and their total bytes (checked against the limit)."""
    with tempfile.TemporaryDirectory() as folder:
        store = make_store(JournalSettings(dir=folder, max_files=keep))
        started = time.process_time()
        for n in range(count):
            store.write(f"{n:06d}", document)
        spent = time.process_time() - started
        left = list(Path(folder).glob("*.json"))
        assert len(left) == min(count, keep), len(left)
        return spent, len(left), sum(p.stat().st_size for p in left)


def measure(journals_written: int = 2000, keep: int = 500, repeats: int = 3) -> Section:
    section = Section("journal_store", f"7a. Journal store: {journals_written:,} journals "
                                       f"written, {keep} kept")
    document = bot_journal()
    before = store_before()
    variants: dict[str, Callable[[], tuple[float, int, int]]] = {
        "index only": lambda: _indented(document, journals_written, keep),
        "after": lambda: run(journals.JournalStore, document, journals_written, keep),
    }
    if before is not None:
        variants = {"before": lambda: run(before, document, journals_written, keep),
                    **variants}
    best = {name: float("inf") for name in variants}
    sizes: dict[str, int] = {}
    for _ in range(repeats):  # interleaved, so a busy moment of the machine hits all three
        for name, go in variants.items():
            spent, left, total = go()
            best[name] = min(best[name], spent)
            sizes[name] = total // left
    for name, seconds in best.items():
        section.add(f"{name}: CPU per journal written and pruned",
                    seconds / journals_written * 1e6, "µs",
                    note=f"{seconds:.2f} s for all; {sizes[name]:,} bytes a journal")
    if before is not None:
        section.add("before / after", best["before"] / best["after"], "×")
        section.add("before / index only (the index alone)",
                    best["before"] / best["index only"], "×")
    else:
        section.add("before", float("nan"), "µs", note=f"no git history ({BEFORE_COMMIT})")
    section.details.update(cpu_s=best, bytes_per_journal=sizes, repeats=repeats)
    return section


def _indented(document: dict[str, Any], count: int, keep: int) -> tuple[float, int, int]:
    with indented_journals():
        return run(journals.JournalStore, document, count, keep)
