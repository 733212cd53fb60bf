"""`python -m providers stream-file --format F [--idle-timeout S] FILE`.

Prints one JSON object (the normalized result) on stdout. Bad arguments, a missing file or
a bad replay directive exit with status 2 and a one-line message on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import NoReturn, get_args

from .config import ProviderKind
from .replay_server import parse_script
from .stream_file import DEFAULT_IDLE_TIMEOUT_S, stream_file


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage dump): scripts grep for them."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _parser() -> _OneLineParser:
    parser = _OneLineParser(prog="python -m providers", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    replay = commands.add_parser(
        "stream-file", help="replay a recorded SSE file through the real client"
    )
    replay.add_argument("--format", required=True, choices=get_args(ProviderKind))
    replay.add_argument(
        "--idle-timeout",
        type=_positive_seconds,
        default=DEFAULT_IDLE_TIMEOUT_S,
        metavar="S",
        help="abort when no bytes arrive for S seconds (default %(default)s)",
    )
    replay.add_argument("file", type=Path)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    path: Path = args.file
    try:
        steps = parse_script(path.read_bytes())
    except FileNotFoundError:
        parser.error(f"no such file: {path}")
    except OSError as exc:
        parser.error(f"cannot read {path}: {exc.strerror}")
    except ValueError as exc:
        parser.error(f"{path}: {exc}")
    result = asyncio.run(stream_file(args.format, steps, idle_timeout_s=args.idle_timeout))
    print(json.dumps(result, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
