"""`python -m fsm review DIR`: the command line of the review page (the server is imported only
when the command runs, so the rest of the CLI starts without aiohttp)."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8018


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def cmd_review(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not root.is_dir():
        print(f"error: {root}: not a folder of journals", file=sys.stderr)
        return 2
    loopback = _loopback(args.host)
    if not loopback:
        print(f"warning: serving {root}'s journals (what users wrote) to the network on "
              f"{args.host}", file=sys.stderr)
    from aiohttp import web

    from .server import create_app

    app = create_app(root, loopback_only=loopback)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    web.run_app(app, host=args.host, port=args.port,
                print=lambda _: print(f"review page for {root}: http://{shown}:{args.port}/ "
                                      "(Ctrl-C stops it)", flush=True))
    return 0


def add_review_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `review` to the `python -m fsm` subcommands."""
    p = sub.add_parser("review", help="serve a local web page to browse, filter and step "
                                      "through the journals in a folder")
    p.add_argument("dir", help="the folder of journals (searched recursively)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"address to listen on (default {DEFAULT_HOST}: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to listen on (default {DEFAULT_PORT})")
    p.set_defaults(func=cmd_review)
