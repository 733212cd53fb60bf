"""Instructions per chunk and per turn, counted by valgrind's callgrind: the same figure on a
busy machine as on a quiet one, so two checkouts of the engine compare exactly, side by side.

    python -m bench.instructions [--chunks N] [CHECKOUT ...]

Each checkout (a directory holding the project, e.g. a `git worktree` of an older commit;
default: this one) runs the same workload under callgrind twice — one pass of N chunks and
one of 2N, journal on, in-memory channel, zero-latency source — and the difference divided by
N is the engine's cost of one chunk; a second pair (1 and 2 typical turns) gives a turn.
Seconds are not measured here; `python -m bench` measures them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

WORKLOAD = """
import asyncio, sys
sys.path.insert(0, {root!r})
from bench.workload import Engine, PlanProvider, TextProvider, chunk_texts, typical_plan

async def chunks(n):
    engine = Engine(journal=True)
    turn, lock, _ = engine.turn("bench", TextProvider(chunk_texts(n), False))
    result = await turn.run()
    engine.locks.release(lock)
    assert result.status == "completed", result.status

async def turns(n):
    engine = Engine(journal=True)
    for i in range(n):
        turn, lock, _ = engine.turn(f"c{{i}}", PlanProvider(typical_plan()))
        await turn.run()
        engine.locks.release(lock)

kind, n = sys.argv[1], int(sys.argv[2])
asyncio.run(chunks(n) if kind == "chunks" else turns(n))
"""


def instructions(root: Path, kind: str, n: int) -> int:
    """Total instructions (Ir) of one run of the workload under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        script = Path(tmp) / "workload.py"
        script.write_text(WORKLOAD.format(root=str(root)), encoding="utf-8")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, str(script), kind, str(n)],
            check=True, capture_output=True, cwd=root,
        )
        for line in out.read_text(encoding="utf-8").splitlines():
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no summary")


def marginal(root: Path, kind: str, n: int) -> float:
    return (instructions(root, kind, 2 * n) - instructions(root, kind, n)) / n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("checkouts", nargs="*", type=Path)
    args = parser.parse_args(argv)
    roots = [p.resolve() for p in args.checkouts] or [HERE]
    rows = [(root, marginal(root, "chunks", args.chunks), marginal(root, "turns", args.turns))
            for root in roots]
    base_chunk, base_turn = rows[0][1], rows[0][2]
    print("| checkout | instructions per chunk | ratio | instructions per typical turn | ratio |")
    print("|---|---:|---:|---:|---:|")
    for root, chunk, turn in rows:
        print(f"| {root.name} | {chunk:,.0f} | {chunk / base_chunk:.3f} | {turn:,.0f} "
              f"| {turn / base_turn:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
