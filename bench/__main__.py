"""`python -m bench`: every benchmark of BENCHMARKS.md in one run, figures printed as
Markdown (and optionally saved as JSON). `--quick` runs them all with small sizes (a minute)
to check the harness; its figures are not the ones to report.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import (
    concurrency,
    full_bot,
    growth,
    journal_store,
    over_http,
    peers,
    per_chunk,
    per_turn,
    redis_scale,
    splitter,
    telemetry_cost,
)
from .common import Section, machine_info
from .report import render

FULL: dict[str, dict[str, Any]] = {
    "per_chunk": {"chunks": 100_000, "repeats": 5},
    "per_turn": {"turns": 1000, "repeats": 5, "profile_turns": 500},
    "peers": {"turns": 200, "repeats": 5},
    "concurrency": {"turns": 10_000, "sample": 1_000, "repeats": 3},
    "over_http": {"chunks": 20_000, "repeats": 5},
    "growth": {"sizes": growth.SIZES, "repeats": 3, "min_turns": 2000, "repeats_large": 1},
    "full_bot": {"sizes": full_bot.SIZES, "profile_largest": True},
    "redis_scale": {"kill_rounds": 300, "leases": 1000, "renewals": 50, "turns": 1000,
                    "channels": 100, "repeats": 3},
    "splitter": {},
    "journal_store": {"journals_written": 2000, "keep": 500, "repeats": 3},
    "telemetry_cost": {"turns": 300, "repeats": 5},
}
QUICK: dict[str, dict[str, Any]] = {
    "per_chunk": {"chunks": 5_000, "repeats": 2},
    "per_turn": {"turns": 100, "repeats": 2, "profile_turns": 50},
    "peers": {"turns": 10, "repeats": 2},
    "concurrency": {"turns": 500, "sample": 50, "repeats": 1},
    "over_http": {"chunks": 2_000, "repeats": 2, "min_sample_s": 0.0},
    "growth": {"sizes": (1, 10, 100), "repeats": 1, "min_turns": 100},
    "full_bot": {"sizes": full_bot.QUICK_SIZES, "profile_largest": False},
    "redis_scale": {"kill_rounds": 20, "leases": 100, "renewals": 5, "turns": 100,
                    "channels": 10, "repeats": 1},
    "splitter": {"before_sizes": (4096, 8192), "after_sizes": (4096, 16384),
                 "stall_size": 65536, "before_stall_size": 8192, "repeats": 1},
    "journal_store": {"journals_written": 200, "keep": 50, "repeats": 1},
    "telemetry_cost": {"turns": 20, "repeats": 1},
}
RUNNERS: dict[str, Callable[..., Section]] = {
    "per_chunk": per_chunk.measure,
    "per_turn": per_turn.measure,
    "peers": peers.measure,
    "concurrency": concurrency.measure,
    "over_http": over_http.measure,
    "growth": growth.measure,
    "full_bot": full_bot.measure,
    "redis_scale": redis_scale.measure,
    "splitter": splitter.measure,
    "journal_store": journal_store.measure,
    "telemetry_cost": telemetry_cost.measure,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes: checks the harness")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {list(RUNNERS)}")
    parser.add_argument("--json", type=Path, help="also write every figure and detail here")
    parser.add_argument("--markdown", type=Path, help="also write the Markdown report here")
    parser.add_argument("--full-bot-sizes", default="",
                        help="comma-separated channel counts for full_bot (default "
                             f"{','.join(map(str, full_bot.SIZES))})")
    parser.add_argument("--full-bot-compare-sweep", action="store_true",
                        help="full_bot: run the largest N again with discord.py's own "
                             "rate-limit bucket sweep, side by side")
    parser.add_argument("--full-bot-compare-requests", action="store_true",
                        help="full_bot: run every N again with the requests per reply "
                             "of before D50-D52, side by side")
    parser.add_argument("--full-bot-no-raw-loop", action="store_true",
                        help="full_bot: leave out the raw loop's runs (7e)")
    parser.add_argument("--full-bot-compare-speedups", action="store_true",
                        help="full_bot: run the largest N with uvloop and orjson on and off, "
                             "side by side")
    parser.add_argument("--full-bot-compare-floor", action="store_true",
                        help="full_bot: the largest N by the bot and by the raw loop with the "
                             "global limit lifted, so both deliver every reply, side by side")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    keys = [k.strip() for k in args.only.split(",") if k.strip()] or list(RUNNERS)
    unknown = [k for k in keys if k not in RUNNERS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    command = "python -m bench" + (" " + " ".join(sys.argv[1:]) if argv is None and
                                   len(sys.argv) > 1 else "")
    info = machine_info()
    started = time.perf_counter()
    sections: list[Section] = []
    known: dict[int, dict[str, Any]] = {}
    for key in keys:
        t0 = time.perf_counter()
        kwargs = dict(sizes[key])
        if key == "full_bot" and args.full_bot_sizes:
            kwargs["sizes"] = tuple(int(n) for n in args.full_bot_sizes.split(","))
        if key == "full_bot" and args.full_bot_compare_sweep:
            kwargs["compare_sweep"] = True
        if key == "full_bot" and args.full_bot_compare_requests:
            kwargs["compare_requests"] = True
        if key == "full_bot" and args.full_bot_no_raw_loop:
            kwargs["raw_loop"] = False
        if key == "full_bot" and args.full_bot_compare_speedups:
            kwargs["compare_speedups"] = True
        if key == "full_bot" and args.full_bot_compare_floor:
            kwargs["compare_floor"] = True
        if key == "growth" and known:
            kwargs["known"] = known
        print(f"[bench] {key} …", file=sys.stderr, flush=True)
        section = RUNNERS[key](**kwargs)
        section.details["elapsed_s"] = time.perf_counter() - t0
        print(f"[bench] {key} done in {section.details['elapsed_s']:.0f} s", file=sys.stderr,
              flush=True)
        if key == "concurrency":
            known[sizes[key]["turns"]] = {"plain": section.details["median_run"],
                                          "traced": section.details["traced"]}
        sections.append(section)
    elapsed = time.perf_counter() - started
    report = render(sections, info, command, elapsed)
    sys.stdout.write(report)
    if args.markdown:
        args.markdown.write_text(report, encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "command": command,
                                         "elapsed_s": elapsed,
                                         "sections": [s.as_dict() for s in sections]},
                                        indent=1, default=float), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
