"""The main job: the Discord bot when a token and a provider are configured, a terminal chat
when only a provider is, otherwise the engine's built-in turns.

Every way it can refuse to start ends in one line per problem on stderr (`error: ...`) and
exit status 2 for the configuration, 1 for Discord; never a traceback.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from .logging_setup import setup_logging
from .settings import ConfigurationError, load_settings
from .startup import StartupError


def main(mode: str = "auto") -> int:
    """Run the main job; `mode` is "auto" (chosen by what is configured), "bot", "chat" or
    "demo" (the `turn-engine` subcommands). Ctrl-C before the job has installed its own
    handling (while settings load, Discord logs in, the chat starts) stops it quietly too."""
    try:
        return _run(mode)
    except KeyboardInterrupt:
        print("stopped (Ctrl-C)", file=sys.stderr)
        return 0


def _run(mode: str) -> int:
    setup_logging()
    try:
        settings = load_settings()
    except ConfigurationError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    setup_logging(settings.log.level, settings.log.library_level, secrets=settings.secrets())
    if mode == "bot" and settings.discord_token is None:
        print("error: turn-engine bot needs TURN_DISCORD_TOKEN (see docs/discord.md)",
              file=sys.stderr)
        return 2
    if mode == "chat" and settings.provider is None:
        print("error: turn-engine chat needs TURN_PROVIDER (see .env.example)", file=sys.stderr)
        return 2
    try:
        if mode in ("auto", "bot") and settings.discord_token is not None:
            from .bot import run_bot

            return run_bot(settings)
        if mode in ("auto", "chat") and settings.provider is not None:
            from .chat import chat

            return asyncio.run(chat(settings))
    except ConfigurationError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    from fsm.scenarios.demo import main as demo

    from .first_run import next_steps, replay_command

    journals = Path(settings.journals.dir)
    code = demo(journals, replay=replay_command())
    print(next_steps(journals), end="")
    return code


if __name__ == "__main__":
    sys.exit(main())
