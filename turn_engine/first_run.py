"""What the main job tells someone who has just run it with nothing configured: the command
that replays what they saw, as it can be typed from where they are, and what to do next.

The command is the `turn-engine` installed beside the running Python (`.venv/bin/turn-engine`
from a checkout), so it works whatever `python` on the PATH is: the bare `python -m fsm` of
a system Python has none of the project's dependencies.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

NEXT_STEPS = """\
Next:
  Chat with a model in this terminal: name one in TURN_PROVIDER, e.g. a local llama.cpp or
  Ollama server (any OpenAI-compatible one):
    TURN_PROVIDER='{"kind": "openai", "base_url": "http://127.0.0.1:11434/v1", \
"model": "llama3.2"}' bash scripts/run.sh
  Hosted models and every other setting: docs/configuration.md (cp .env.example .env).
  Put it on Discord: docs/discord.md takes you from here to a bot answering in your server.
  Look through these turns in a browser: {command} review {journals}/
"""


def own_command() -> str:
    """How to type `turn-engine` from the working directory: by name when the PATH finds
    this one, else its path (relative when it is under the working directory)."""
    script = Path(sys.executable).parent / "turn-engine"
    if not script.exists():
        return f"{sys.executable} -m turn_engine.cli"
    if shutil.which("turn-engine") == str(script):
        return "turn-engine"
    if script.is_relative_to(Path.cwd()):
        return str(script.relative_to(Path.cwd()))
    return str(script)


def replay_command() -> str:
    return f"{own_command()} replay"


def next_steps(journal_dir: Path) -> str:
    return NEXT_STEPS.replace("{command}", own_command()).replace(
        "{journals}", str(journal_dir).rstrip("/"))
