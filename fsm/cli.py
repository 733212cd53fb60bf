"""`python -m fsm …`: run a scenario, replay a journal, play the built-in turns."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .journal import ScenarioError, jsonable, read_journal, write_journal
from .review.diagram import add_diagram_commands
from .review.replay import replay_difference
from .review.web.command import add_review_command
from .scenarios.format import load_scenario
from .scenarios.runner import play_virtual


def cmd_run_scenario(args: argparse.Namespace) -> int:
    path = Path(args.file)
    scenario = load_scenario(path)
    try:
        played = play_virtual(scenario)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    out = sys.stdout
    for line in played.transitions:
        out.write(json.dumps(line, ensure_ascii=False) + "\n")
    out.write(json.dumps({"result": jsonable(played.result.as_dict())}, ensure_ascii=False)
              + "\n")
    if args.journal:
        raw = json.loads(path.read_text(encoding="utf-8"))
        write_journal(Path(args.journal), played.journal(raw))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    path = Path(args.file)
    diff = replay_difference(read_journal(path), str(path))
    if diff is None:
        print(f"{path}: replay matches")
        return 0
    print(f"{path}: replay differs: {diff}")
    return 1


def cmd_demo(args: argparse.Namespace) -> int:
    from .scenarios.demo import main as demo_main

    return demo_main(Path(args.journals))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fsm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run-scenario", help="run a scenario; print its journal as JSON Lines")
    p.add_argument("file")
    p.add_argument("--journal", help="also write the full journal (scenario + transitions + "
                                     "result) to this file, replayable with `replay`")
    p.set_defaults(func=cmd_run_scenario)
    p = sub.add_parser("replay", help="re-run a recorded journal and compare")
    p.add_argument("file")
    p.set_defaults(func=cmd_replay)
    p = sub.add_parser("demo", help="play the built-in turns (the main job's embedded default)")
    p.add_argument("--journals", default="journals", help="where journals are written")
    p.set_defaults(func=cmd_demo)
    add_diagram_commands(sub)
    add_review_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    _escape_unencodable_output()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


def _escape_unencodable_output() -> None:
    """A journal may hold text the terminal cannot encode (a lone surrogate from a cut
    emoji): print it escaped rather than fail with a traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")

