"""Checks for the settings that are URLs, so a typo stops start-up with one line instead of
a traceback at the first connection (or, for Redis, two chained ones).

Each check says which part of the URL is wrong and what the right shape is, and never repeats
any part of the value: a URL may carry a password, and a malformed one puts pieces of it where
the port or host should be (`redis://:p/ss@host` parses with `p` as its port).
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

HTTP_SHAPE = "http://host[:port]/path or https://…"
REDIS_SHAPE = "redis://[:password@]host[:port][/db], rediss://… or unix:///path/to/socket"
_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f]")


def http_url_problem(value: str) -> str | None:
    """Why `value` is not an http(s) URL a client can connect to, or None."""
    split, problem = _split(value, ("http", "https"))
    if problem is None and split is not None:
        problem = _host_and_port(split)
    if problem is None:
        problem = _yarl_problem(value)
    return None if problem is None else f"not a usable URL: {problem} (expected {HTTP_SHAPE})"


def redis_url_problem(value: str) -> str | None:
    """Why `value` is not a URL redis-py can connect to, or None."""
    split, problem = _split(value, ("redis", "rediss", "unix"))
    if problem is None and split is not None:
        if split.scheme == "unix":
            problem = None if split.path.strip("/") else "it names no socket path"
        else:
            problem = _host_and_port(split) or _database(split.path)
    if problem is None:
        problem = _redis_py_problem(value)
    if problem is None:
        return None
    return f"not a usable Redis URL: {problem} (expected {REDIS_SHAPE})"


def _split(value: str, schemes: tuple[str, ...]) -> tuple[SplitResult | None, str | None]:
    if _UNSAFE.search(value):
        return None, "it contains a space or a control character"
    try:
        split = urlsplit(value)
    except ValueError:
        return None, "its host has an unclosed [ ] (an IPv6 address is written [::1])"
    if split.scheme.lower() not in schemes:
        named = ", ".join(f"{s}://" for s in schemes[:-1]) + f" or {schemes[-1]}://"
        return None, f"it does not start with {named}"
    return split, None


def _host_and_port(split: SplitResult) -> str | None:
    try:
        port = split.port
    except ValueError:
        return "its port is not a number from 1 to 65535"
    if port == 0:
        return "its port is not a number from 1 to 65535"
    if not split.hostname:
        return "it names no host"
    return None


def _database(path: str) -> str | None:
    number = path.strip("/")
    if number and not number.isdigit():
        return "the database after the host is not a whole number (e.g. /0)"
    return None


def _yarl_problem(value: str) -> str | None:
    """aiohttp parses URLs with yarl; whatever yarl refuses, the client would too."""
    from yarl import URL

    try:
        URL(value)
    except ValueError:
        return "aiohttp cannot parse it"
    return None


def _redis_py_problem(value: str) -> str | None:
    """redis-py's own parser (its query options, e.g. `?socket_timeout=`), when installed."""
    try:
        from redis.connection import parse_url
    except ImportError:
        return None
    try:
        parse_url(value)  # type: ignore[no-untyped-call]
    except ValueError:
        return "redis-py refuses one of its options (the part after ?)"
    return None
