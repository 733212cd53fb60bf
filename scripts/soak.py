"""Soak the turn engine: many concurrent turns with random faults on one virtual-time loop.

    .venv/bin/python scripts/soak.py --turns 1000 --seed 1

Plays a warm-up round, then two rounds of `--turns` generated scenarios each (stalls, kills,
follow-ups, raising providers, hanging and failing tools, stash misses, at random virtual
times; the turns of a round run concurrently), checks every turn with the reliability
oracle, and prints the figures: outcomes, peak concurrency, virtual and wall time, tasks,
machine entries (models, task records) and turn objects before and after, traced memory
after each round, RSS.
Exit 0 when everything returned to its baseline, 1 otherwise (the problems are printed).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fsm.scenarios.runner import run_virtual  # noqa: E402

from reliability_support import soak  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000, help="turns per round (default 1000)")
    parser.add_argument("--seed", type=int, default=1, help="scenario seed (default 1)")
    parser.add_argument("--spread", type=float, default=1.0,
                        help="a round's turns start within this many virtual seconds")
    parser.add_argument("--log", action="store_true",
                        help="show the engine's warnings (a faulty turn logs several)")
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    logging.basicConfig(level=logging.WARNING if args.log else logging.CRITICAL)
    report = run_virtual(lambda: soak(args.turns, args.seed, spread_s=args.spread))
    for line in report.lines():
        print(line)
    problems = report.problems
    for problem in problems[:20]:
        print(f"PROBLEM {problem}")
    print("soak ok" if not problems else f"soak FAILED: {len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
