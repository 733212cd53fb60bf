"""`python -m fsm review DIR`: the command line of the review page (the server is imported only
when the command runs, so the rest of the CLI starts without aiohttp)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from ...local_http import is_loopback_address

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8018


def cmd_review(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        print(f"error: {root}: not a folder of journals", file=sys.stderr)
        return 2
    loopback = is_loopback_address(args.host)
    if not loopback:
        print(f"warning: serving {root}'s journals (what users wrote) to the network on "
              f"{args.host}", file=sys.stderr)
    try:
        asyncio.run(_serve(root, args.host, args.port, loopback))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    return 0


async def _serve(root: Path, host: str, port: int, loopback: bool) -> None:
    """Serve until cancelled, naming the address really bound (`--port 0` picks a free one)."""
    from aiohttp import web

    from .server import create_app

    runner = web.AppRunner(create_app(root, loopback_only=loopback))
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        print(f"review page for {root}: http://{shown}:{bound}/ (Ctrl-C stops it)", flush=True)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def add_review_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `review` to the `python -m fsm` subcommands."""
    p = sub.add_parser("review", help="serve a local web page to browse, filter and step "
                                      "through the journals in a folder")
    p.add_argument("dir", help="the folder of journals (searched recursively)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one)")
    p.set_defaults(func=cmd_review)
