"""Item 8: the reply splitter on big deltas (issue 12 item 2), before and after, side by side.

Three texts (short lines, code in one fenced block, words), fed as one delta:

- *cost*: wall time of `StreamSplitter.feed(text) + flush()` at growing sizes, for the
  splitter before the fix (it rescanned its whole buffer for every message it cut:
  quadratic) and after (each cut looks at one message's worth: linear). The before column
  stops at sizes it can finish in seconds; the after column goes on to 4 MB. The cost per
  character staying flat from 1 MB to 4 MB (both past the CPU caches, where the messages
  already cut pile up) is what "linear" means here; before, it grows with the size.
- *longest loop stall*: the longest single call while 1 MB is delivered. Before, delivery
  fed the whole delta in one call; after, `DiscordChannel.deliver` feeds `FEED_SLICE`
  characters per call and yields to the loop between them, so the stall is the slowest
  slice.

The splitter before the fix is read from git (`BEFORE_COMMIT`); without git history (a
source tarball) the before column is left out and says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from discord_io.delivery import FEED_SLICE
from discord_io.splitting import Chunk, StreamSplitter

from .common import Section, module_at_commit

BEFORE_COMMIT = "9411e58"
MEGABYTE = 1 << 20
KB = 1024


class Splitter(Protocol):
    def feed(self, text: str) -> list[Chunk]: ...

    def flush(self) -> list[Chunk]: ...


def texts(size: int) -> dict[str, str]:
    """The three shapes, each `size` characters long."""
    shapes = {
        "short lines": "ok\n",
        "code": "value = compute(1)  # step\n",
        "words": "lorem ",
    }
    out = {}
    for name, unit in shapes.items():
        body = (unit * (size // len(unit) + 1))[:size]
        out[name] = "```python\n" + body[10:] if name == "code" else body
    return out


def splitter_before() -> type[Any] | None:
    """`StreamSplitter` as it was before the fix, or None without git history."""
    module = module_at_commit(BEFORE_COMMIT, "discord_io/splitting.py", "bench_splitting_before")
    return None if module is None else module.StreamSplitter


def whole(make: Callable[[], Splitter], text: str, repeats: int) -> tuple[float, int]:
    """Seconds to split `text` fed as one delta (the fastest of `repeats`: the cost without
    the noise of a shared machine), and the messages it became."""
    best = float("inf")
    messages = 0
    for _ in range(repeats):
        splitter = make()
        started = time.perf_counter()
        chunks = splitter.feed(text) + splitter.flush()
        best = min(best, time.perf_counter() - started)
        assert "".join(chunk.source for chunk in chunks).strip() == text.strip()
        messages = len(chunks)
    return best, messages


def longest_call(make: Callable[[], Splitter], text: str, piece: int, repeats: int) -> float:
    """The slowest single `feed` of `text` in pieces of `piece` characters (the loop is
    free between calls, as in `DiscordChannel.deliver`); the best of `repeats` runs."""
    runs = []
    for _ in range(repeats):
        splitter = make()
        worst = 0.0
        for start in range(0, len(text), piece):
            began = time.perf_counter()
            splitter.feed(text[start : start + piece])
            worst = max(worst, time.perf_counter() - began)
        began = time.perf_counter()
        splitter.flush()
        runs.append(max(worst, time.perf_counter() - began))
    return min(runs)


def measure(before_sizes: tuple[int, ...] = (16 * KB, 32 * KB, 64 * KB),
            after_sizes: tuple[int, ...] = (16 * KB, 64 * KB, 256 * KB, MEGABYTE,
                                            4 * MEGABYTE),
            stall_size: int = MEGABYTE, before_stall_size: int = 64 * KB,
            repeats: int = 3) -> Section:
    section = Section("splitter", "8. The reply splitter on big deltas (issue 12 item 2)")
    before = splitter_before()
    rows: list[dict[str, Any]] = []
    for size in sorted(set(before_sizes) | set(after_sizes)):
        for name, text in texts(size).items():
            row: dict[str, Any] = {"shape": name, "size": size}
            if size in after_sizes:
                row["after_s"], row["messages"] = whole(StreamSplitter, text, repeats)
            if before is not None and size in before_sizes:
                row["before_s"], _ = whole(before, text, 1 if size > 16 * KB else repeats)
            rows.append(row)
    section.details["cost"] = rows
    for name, text in texts(stall_size).items():
        after = longest_call(StreamSplitter, text, FEED_SLICE, repeats)
        section.add(f"longest loop stall, 1 MB of {name} (after, {FEED_SLICE:,}-char slices)",
                    after * 1000, "ms")
        if before is not None:
            small = texts(before_stall_size)[name]
            stall = longest_call(before, small, len(small), 1)
            section.add(f"longest loop stall, {before_stall_size // KB} KB of {name} (before, "
                        "one call)", stall * 1000, "ms")
    for name in texts(1):
        after_rows = [r for r in rows if r["shape"] == name and "after_s" in r]
        small, big = after_rows[-2], after_rows[-1]  # the largest two: both past the caches
        growth = _growth(small["size"], small["after_s"], big["size"], big["after_s"])
        section.add(f"after: cost per character, {_size(big['size'])} over "
                    f"{_size(small['size'])} ({name})", growth, "x",
                    goal="≤ 2 (linear)", met=growth <= 2.0)
        before_rows = [r for r in rows if r["shape"] == name and "before_s" in r]
        if len(before_rows) >= 2:
            first, last = before_rows[0], before_rows[-1]
            section.add(f"before: cost per character, {last['size'] // KB} KB over "
                        f"{first['size'] // KB} KB ({name})",
                        _growth(first["size"], first["before_s"], last["size"],
                                last["before_s"]), "x",
                        note="quadratic: grows with the size ratio")
        both = [r for r in rows if r["shape"] == name and "after_s" in r and "before_s" in r]
        if both:
            last = both[-1]
            section.add(f"before / after at {last['size'] // KB} KB ({name})",
                        last["before_s"] / last["after_s"], "x")
    if before is None:
        section.details["note"] = "no git history: the splitter before the fix was not run"
    return section


def _size(size: int) -> str:
    return f"{size // MEGABYTE} MB" if size >= MEGABYTE else f"{size // KB} KB"


def _growth(small_size: int, small_s: float, big_size: int, big_s: float) -> float:
    """How much dearer a character is in the big text than in the small one (1 = linear)."""
    return (big_s / big_size) / max(small_s / small_size, 1e-12)


def table(section: Section) -> list[str]:
    lines = ["| shape | size | before (s) | after (s) | after µs/KB | before / after | messages |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in section.details.get("cost", []):
        before = row.get("before_s")
        after = row.get("after_s")
        per_kb = f"{after / (row['size'] / KB) * 1e6:,.0f}" if after else ""
        ratio = f"{before / after:,.1f}" if before and after else ""
        lines.append(
            f"| {row['shape']} | {_size(row['size'])} | "
            f"{'' if before is None else f'{before:.3f}'} | "
            f"{'' if after is None else f'{after:.3f}'} | {per_kb} | {ratio} | "
            f"{row.get('messages', '')} |")
    if "note" in section.details:
        lines += ["", section.details["note"]]
    return lines
