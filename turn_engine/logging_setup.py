"""The process's log lines: timestamped, at the operator's level, never carrying a secret.

One handler on the root logger writes `2026-12-01T15:46:19Z INFO name: message`; a filter
replaces every configured secret (the Discord token, provider keys) wherever it would appear,
arguments and tracebacks included, so a library that logs a URL or a header cannot leak one.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable
from typing import TextIO

REDACTED = "[redacted]"
LIBRARIES = ("discord", "aiohttp", "transitions", "asyncio")


class UtcFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))


class RedactSecrets(logging.Filter):
    """Rewrites a record whose text holds a secret; the record is always let through."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def _scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = self._scrub(message), None
        if record.exc_text:
            record.exc_text = self._scrub(record.exc_text)
        record.exc_info = None if record.exc_text else record.exc_info
        return True


class OneLineReconnects(logging.Filter):
    """discord.py logs every reconnect attempt with a full traceback (a gateway that is down
    for a minute is pages of them); an operator needs one line: what failed and when it
    tries again. The record keeps its level and logger; only the traceback becomes text."""

    PREFIXES = ("Attempting a reconnect", "Failed to connect for shard_id")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.name.startswith("discord.") and \
                str(record.msg).startswith(self.PREFIXES):
            error = record.exc_info[1]
            reason = " ".join(str(error).split()) if error is not None else ""
            kind = type(error).__name__ if error is not None else "error"
            record.msg = f"{record.getMessage()}: {kind}" + (f": {reason}" if reason else "")
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


class NoVoiceWarnings(logging.Filter):
    """discord.py warns at every start that PyNaCl and davey are missing, so "voice will NOT
    be supported": the bot never joins a voice channel, and two warnings on a good start
    teach an operator to ignore warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "discord.client"
                    and str(record.msg).endswith("voice will NOT be supported"))


def setup_logging(level: str = "INFO", library_level: str = "WARNING",
                  secrets: Iterable[str] = (), stream: TextIO | None = None) -> logging.Handler:
    """Install the handler (replacing an earlier one from here) and return it."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "turn_engine", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(UtcFormatter())
    handler.addFilter(NoVoiceWarnings())
    handler.addFilter(OneLineReconnects())
    handler.addFilter(RedactSecrets(secrets))
    handler.turn_engine = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(library_level)
    return handler
