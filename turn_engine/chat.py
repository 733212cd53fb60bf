"""Terminal chat: talk to a real model through the real engine, seeing its transitions.

Each line typed is one generation turn (primary model, then fallbacks). The reply streams
to stdout; the machine's transitions go to stderr. Ctrl-C during a reply is `/kill`;
Ctrl-D or `/quit` at the prompt leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from typing import Any, TextIO

import aiohttp

from fsm.engine.channel import Notice
from fsm.engine.generation import Attempt, run_generation_turn
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.turn import Turn
from providers import build_provider

from .settings import AppSettings

CHANNEL = "terminal"


class TerminalChannel:
    """Delivers streamed text straight to the terminal."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    async def deliver(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    async def finish_pass(self) -> None:
        self.out.write("\n")
        self.out.flush()

    def discard_unsent(self) -> None:
        """Nothing to drop: text is written as it comes."""

    async def post_notice(self, notice: Notice) -> None:
        self.out.write(f"\n[{notice.title}] {notice.description}\n")
        self.out.flush()

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        return []


class StderrTransitions:
    def __init__(self, err: TextIO) -> None:
        self.err = err

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        self.err.write(f"  · {t:7.2f}s {source} ─{event}─▶ {dest}\n")
        self.err.flush()


async def _read_line(prompt: str) -> str | None:
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(None, input, prompt)
    except EOFError:
        return None


async def chat(settings: AppSettings, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    locks = ChannelLockRegistry(stale_age_s=settings.engine.stale_lock_age_s)
    history: list[dict[str, Any]] = []
    channel = TerminalChannel(out)
    observer = StderrTransitions(err)
    loop = asyncio.get_running_loop()
    models = ", ".join(f"{c.kind}:{c.model}" for c in settings.attempts())
    err.write(f"Chatting with {models}. Ctrl-C stops a reply, Ctrl-D or /quit leaves.\n")
    async with aiohttp.ClientSession() as session:
        attempts = [Attempt(build_provider(config, session), f"{config.kind}:{config.model}")
                    for config in settings.attempts()]
        number = 0
        while True:
            line = await _read_line("you> ")
            if line is None or line.strip() == "/quit":
                return 0
            if not line.strip():
                continue
            number += 1
            history.append({"type": "dialogue", "role": "user", "author": "you",
                            "message_id": f"t{number}", "content": line})
            lock = locks.try_acquire(CHANNEL, owner=f"terminal-{number}")
            assert lock is not None
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGINT, locks.request_stop, CHANNEL)
            try:
                out.write("bot> ")
                result = await run_generation_turn(
                    attempts, channel=channel, locks=locks, lock=lock,
                    request=TurnRequest(context_items=list(history),
                                        system_prompt=settings.system_prompt),
                    config=settings.engine, observer=observer)
            finally:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signal.SIGINT)
                locks.release(lock)
            err.write(f"  = {result.status}\n")
            if result.delivered_text:
                history.append({"type": "dialogue", "role": "assistant",
                                "content": result.delivered_text})
