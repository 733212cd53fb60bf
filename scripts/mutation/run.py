"""The mutation tier's command (`bash scripts/mutation.sh [module ...]`, CONTRIBUTING.md):
for each module of targets.toml, the unmutated baseline run, then every mutant against the
module's selected tests, one at a time on one core; prints the score and each survivor, and
keeps the outcomes in .mutation/ so `--survivors` reruns only what lived last time."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from mutants import Mutant, mutants
from runner import ROOT, run_tests, warm

TARGETS = Path(__file__).with_name("targets.toml")
RESULTS = ROOT / ".mutation"
KILLED = ("killed", "timeout", "error")
"""`error`: the mutated module cannot even be imported (pytest's collection fails), which
every test that uses it notices."""


def _load_targets() -> dict[str, Any]:
    with TARGETS.open("rb") as file:
        return tomllib.load(file)["module"]  # type: ignore[no-any-return]


def _keys(found: list[Mutant]) -> dict[int, str]:
    """Each mutant's stable name, with `#2`, `#3` for repeats of the same swap in one scope."""
    seen: dict[str, int] = {}
    keys = {}
    for mutant in found:
        seen[mutant.key] = seen.get(mutant.key, 0) + 1
        keys[mutant.number] = mutant.key + (f" #{seen[mutant.key]}" if seen[mutant.key] > 1 else "")
    return keys


def run_module(module: str, target: dict[str, Any], only_survivors: bool,
               numbers: list[int] | None) -> dict[str, Any]:
    path = ROOT / module
    tests = target["tests"]
    found = mutants(path.read_text(encoding="utf-8"))
    keys = _keys(found)
    equivalent = {entry["mutant"]: entry["reason"] for entry in target.get("equivalent", [])}
    record = RESULTS / (module.replace("/", "__") + ".json")
    previous = json.loads(record.read_text()) if record.exists() else {}
    RESULTS.mkdir(exist_ok=True)
    log = str(RESULTS / "last-child.log")
    warm(tests)
    baseline = run_tests(path, None, tests, 900.0, log)
    if baseline.status != "survived":
        sys.exit(f"{module}: the selected tests fail without any mutant ({log})")
    budget = baseline.seconds * 2 + 5
    outcomes: dict[str, str] = dict(previous.get("outcomes", {}))
    chosen = [m for m in found if (numbers is None or m.number in numbers) and (
        not only_survivors or outcomes.get(keys[m.number], "survived") not in KILLED)]
    print(f"{module}: {len(found)} mutants, {len(chosen)} to run, tests {baseline.seconds:.1f} s"
          f" unmutated: {' '.join(tests)}", flush=True)
    started = time.monotonic()
    for mutant in chosen:
        outcome = run_tests(path, mutant.number, tests, budget, log)
        outcomes[keys[mutant.number]] = outcome.status
        if outcome.status == "survived":
            print(f"  {outcome.status} #{mutant.number} line {mutant.line}: {keys[mutant.number]}"
                  f"{'  [equivalent]' if keys[mutant.number] in equivalent else ''}", flush=True)
    outcomes = {keys[m.number]: outcomes.get(keys[m.number], "survived") for m in found}
    summary = _score(module, outcomes, equivalent)
    full_run = len(chosen) == len(found)
    summary["seconds"] = (round(time.monotonic() - started, 1) if full_run
                          else previous.get("seconds", 0.0))  # the table gives a full run's
    record.write_text(json.dumps({**summary, "outcomes": outcomes}, indent=1))
    unused = sorted(set(equivalent) - set(outcomes))
    for key in unused:
        print(f"  stale equivalent entry (no such mutant now): {key}")
    print(f"{module}: killed {summary['killed']}/{summary['total']}, equivalent "
          f"{summary['equivalent']}, survived {summary['survived']}, raw "
          f"{summary['raw']} %, adjusted {summary['adjusted']} % in "
          f"{time.monotonic() - started:.1f} s",
          flush=True)
    return summary


def _score(module: str, outcomes: dict[str, str], equivalent: dict[str, str]) -> dict[str, Any]:
    total = len(outcomes)
    killed = sum(status in KILLED for status in outcomes.values())
    equal = sum(key in equivalent and status not in KILLED for key, status in outcomes.items())
    live = total - killed - equal
    return {"module": module, "total": total, "killed": killed, "equivalent": equal,
            "survived": live, "raw": round(100 * killed / total, 1) if total else 100.0,
            "adjusted": round(100 * killed / (total - equal), 1) if total - equal else 100.0}


def _print_table(modules: list[str]) -> None:
    print("| module | mutants | killed | equivalent | survived | adjusted score | run time |")
    print("|---|---|---|---|---|---|---|")
    for module in modules:
        record = RESULTS / (module.replace("/", "__") + ".json")
        if not record.exists():
            print(f"| `{module}` | not measured | | | | | |")
            continue
        s = json.loads(record.read_text())
        print(f"| `{module}` | {s['total']} | {s['killed']} | {s['equivalent']} | "
              f"{s['survived']} | {s['adjusted']} % | {s['seconds']} s |")


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("modules", nargs="*", help="paths as in targets.toml (default: all)")
    parser.add_argument("--survivors", action="store_true",
                        help="rerun only the mutants that survived the last run")
    parser.add_argument("--mutant", type=int, action="append", help="only this number")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument("--table", action="store_true",
                        help="print the last recorded scores as a Markdown table")
    args = parser.parse_args()
    targets = _load_targets()
    if args.table:
        _print_table(args.modules or list(targets))
        return
    for module in args.modules or list(targets):
        if module not in targets:
            sys.exit(f"{module}: not in {TARGETS.name} (it says which tests to run)")
        if args.list:
            found = mutants((ROOT / module).read_text(encoding="utf-8"))
            for mutant in found:
                print(f"#{mutant.number} line {mutant.line}: {_keys(found)[mutant.number]}")
            continue
        run_module(module, targets[module], args.survivors, args.mutant)


if __name__ == "__main__":
    main()
