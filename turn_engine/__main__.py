"""The main job: the Discord bot when a token and a provider are configured, a terminal chat
when only a provider is, otherwise the engine's built-in turns."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from .settings import ConfigurationError, load_settings


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("transitions").setLevel(logging.WARNING)
    try:
        settings = load_settings()
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if settings.discord_token is not None and settings.provider is not None:
        from .bot import run_bot

        return run_bot(settings)
    if settings.provider is not None:
        from .chat import chat

        return asyncio.run(chat(settings))
    from fsm.scenarios.demo import main as demo

    return demo(Path(settings.journal_dir))


if __name__ == "__main__":
    sys.exit(main())
