"""Terminal chat: talk to a real model through the real engine, seeing its transitions.

Each line typed is one generation turn (primary model, then fallbacks), journaled like a bot
turn. The reply streams to stdout after `bot> `, whole across its passes and attempts; the
machine's transitions go to stderr, each on a line of its own, as they happen until the reply
begins and after it from then on. Ctrl-C during a reply is `/kill`; Ctrl-C, Ctrl-D or `/quit`
at the prompt leaves, with status 0.

Lines are read from the raw stdin descriptor on a daemon thread: `input()` in an executor
cannot be abandoned (Ctrl-C at the prompt would hang until Enter), and a daemon thread
inside Python's buffered stdin would hold its lock at interpreter exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TextIO

import aiohttp

from discord_io.media_fetch import MediaFetcher
from fsm import (
    Attempt,
    ChannelLockRegistry,
    GenerationResult,
    Notice,
    Turn,
    TurnRequest,
    run_generation_turn,
)
from providers import build_provider

from .chat_tools import TOOL_CALL_AS_TEXT, ToolCallText, chat_catalog
from .journals import JournalStore, ReplyJournals, scenario_history
from .persona import Persona
from .settings import AppSettings
from .telemetry import build_telemetry, running_telemetry, with_telemetry
from .tool_catalog import ToolCatalog

CHANNEL = "terminal"
PROMPT = "you> "
REPLY = "bot> "


class Screen:
    """Stdout and stderr as one screen, keeping a reply whole: from its first text until the
    turn ends, the machine's transition lines wait and are written after the reply (a reply
    cut by `· … first_token …` lines is hard to read), and no line of the machine's ever
    follows reply text on the same line."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out = out
        self.err = err
        self.at_line_start = True
        self.replying = False
        self.resume = False
        """The reply's line was closed early (a notice, a log line): the next text starts a
        new `bot> ` line."""
        self.held: list[str] = []

    def reply(self, text: str) -> None:
        if not text:
            return
        if not self.replying or self.resume:
            if not self.at_line_start:
                self.out.write("\n")
            self.out.write(REPLY)
        self.out.write(text)
        self.out.flush()
        self.at_line_start = text.endswith("\n")
        self.replying, self.resume = True, False

    def end_line(self) -> None:
        if not self.at_line_start:
            self.out.write("\n")
            self.out.flush()
            self.at_line_start = True
        self.resume = self.replying

    def transition(self, line: str) -> None:
        """A transition line: now, or after the reply when one is being written."""
        if self.replying:
            self.held.append(line)
        else:
            self.status(line)

    def end_reply(self) -> None:
        """The turn is over: close the reply's line, then write the transitions it held."""
        self.end_line()
        self.replying = self.resume = False
        held, self.held = self.held, []
        for line in held:
            self.err.write(line + "\n")
        self.err.flush()

    def status(self, line: str) -> None:
        """A line of the machine's (results, errors) on stderr, after the reply."""
        self.end_reply()
        self.err.write(line + "\n")
        self.err.flush()


class AfterTheReply(logging.Filter):
    """Log lines are the machine's too: one that comes while a reply is being written waits
    with the transitions and is written after the reply; otherwise it goes out at once, on a
    line of its own."""

    def __init__(self, screen: Screen, handler: logging.Handler) -> None:
        super().__init__()
        self.screen = screen
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        if self.screen.replying:
            self.screen.held.append(self.handler.format(record))
            return False
        self.screen.end_line()
        return True


@contextlib.contextmanager
def log_lines_apart(screen: Screen) -> Iterator[None]:
    """Every log handler's lines kept out of the reply (`AfterTheReply`), added last so the
    handler's own filters (secret redaction) have run on what is held."""
    added = [(handler, AfterTheReply(screen, handler))
             for handler in logging.getLogger().handlers]
    for handler, after in added:
        handler.addFilter(after)
    try:
        yield
    finally:
        for handler, after in added:
            handler.removeFilter(after)


class TerminalChannel:
    """Delivers streamed text straight to the terminal, never a tool call written as text."""

    def __init__(self, screen: Screen) -> None:
        self.screen = screen
        self.tool_call_text = ToolCallText()

    async def deliver(self, text: str) -> None:
        self.screen.reply(self.tool_call_text.feed(text))

    async def finish_pass(self) -> None:
        """What a tool call written as text held back is given back (the reply goes on on the
        same line in the next pass); a block that was taken out is said after the reply."""
        self.screen.reply(self.tool_call_text.flush())
        if self.tool_call_text.take_seen():
            self.screen.transition(TOOL_CALL_AS_TEXT)

    def discard_unsent(self) -> None:
        """Nothing to drop: text is written as it comes."""

    async def post_notice(self, notice: Notice) -> None:
        self.screen.end_line()
        self.screen.out.write(f"[{notice.title}] {notice.description}\n")
        self.screen.out.flush()

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        return []


class StderrTransitions:
    def __init__(self, screen: Screen) -> None:
        self.screen = screen

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        self.screen.transition(f"  · {t:7.2f}s {source} ─{event}─▶ {dest}")


class LineReader:
    """Lines typed on `fd`, read by a daemon thread, handed to the loop."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._thread: threading.Thread | None = None

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        pending = b""
        while True:
            try:
                block = os.read(self.fd, 4096)
            except OSError:
                block = b""
            if not block:
                if pending:
                    loop.call_soon_threadsafe(self._lines.put_nowait, pending.decode(
                        "utf-8", errors="replace"))
                loop.call_soon_threadsafe(self._lines.put_nowait, None)
                return
            pending += block
            *lines, pending = pending.split(b"\n")
            for line in lines:
                loop.call_soon_threadsafe(self._lines.put_nowait,
                                          line.decode("utf-8", errors="replace"))

    async def read(self) -> str | None:
        """The next line, or None at end of input."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(asyncio.get_running_loop(),),
                                            name="terminal-input", daemon=True)
            self._thread.start()
        return await self._lines.get()


class CtrlC:
    """One SIGINT handler for the whole chat, doing what Ctrl-C means at the moment: leave
    at the prompt, stop the reply during a turn, nothing in between. (Swapping handlers
    would leave moments where Ctrl-C is Python's KeyboardInterrupt.)"""

    def __init__(self) -> None:
        self.action: Callable[[], object] = lambda: None

    def fire(self) -> None:
        self.action()

    @contextlib.contextmanager
    def installed(self) -> Iterator[CtrlC]:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, self.fire)
        except (NotImplementedError, RuntimeError):
            yield self
            return
        try:
            yield self
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    @contextlib.contextmanager
    def meaning(self, action: Callable[[], object]) -> Iterator[None]:
        self.action = action
        try:
            yield
        finally:
            self.action = lambda: None


async def _prompt(reader: LineReader, screen: Screen, ctrl_c: CtrlC) -> str | None:
    """The next line; None on Ctrl-D or Ctrl-C."""
    line = asyncio.ensure_future(reader.read())
    with ctrl_c.meaning(line.cancel):
        screen.end_line()
        screen.out.write(PROMPT)
        screen.out.flush()
        try:
            return await line
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            screen.out.write("\n")
            return None


@contextlib.asynccontextmanager
async def _tools_running(catalog: ToolCatalog, fetcher: MediaFetcher,
                         screen: Screen) -> AsyncIterator[None]:
    """The MCP servers run for as long as the chat; the tools offered are said once."""
    try:
        await catalog.start()
        names = catalog.registry().names()
        screen.status(f"Tools: {', '.join(names)}." if names else "No tools.")
        yield
    finally:
        await catalog.aclose()
        await fetcher.aclose()


def failure_line(result: GenerationResult, attempts: Sequence[Attempt]) -> str | None:
    """One line saying why a failed turn failed; for an HTTP 404 it names the URL tried
    (almost always a `base_url` without, or with the wrong, API version)."""
    for attempt, label, outcome in zip(attempts, result.labels, result.attempts, strict=False):
        errors = [p.error for p in outcome.passes if p.error]
        if not errors:
            continue
        error = errors[-1]
        endpoint = getattr(attempt.provider, "endpoint", None)
        url = endpoint() if callable(endpoint) else None
        if error.get("status") == 404 and url:
            return (f"error: {label}: {url} answered 404 Not Found; check base_url (it "
                    "should end with the API version, e.g. http://127.0.0.1:11434/v1)")
        where = f" at {url}" if url else ""
        status = f"HTTP {error['status']} " if error.get("status") else ""
        return f"error: {label}{where}: {status}{error.get('message', '')}".rstrip()
    return None


async def chat(settings: AppSettings, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
               input_fd: int | None = None) -> int:
    screen = Screen(out, err)
    with log_lines_apart(screen), CtrlC().installed() as ctrl_c:
        return await _chat(settings, screen, input_fd, ctrl_c)


async def _chat(settings: AppSettings, screen: Screen, input_fd: int | None,
                ctrl_c: CtrlC) -> int:
    locks = ChannelLockRegistry(stale_age_s=settings.engine.stale_lock_age_s)
    history: list[dict[str, Any]] = []
    channel = TerminalChannel(screen)
    telemetry = build_telemetry(settings.telemetry)
    observer = with_telemetry(StderrTransitions(screen), telemetry)
    journals = JournalStore(settings.journals)
    persona = Persona(settings.system_prompt, settings.system_prompt_file)
    reader = LineReader(input_fd if input_fd is not None else sys.stdin.fileno())
    fetcher = MediaFetcher()
    catalog = chat_catalog(settings, fetcher)
    models = ", ".join(f"{c.kind}:{c.model}" for c in settings.attempts())
    screen.status(f"Chatting with {models}. Ctrl-C stops a reply; Ctrl-C, Ctrl-D or /quit "
                  "leaves.")
    async with aiohttp.ClientSession() as session, running_telemetry(telemetry), \
            _tools_running(catalog, fetcher, screen):
        attempts = [Attempt(build_provider(config, session), f"{config.kind}:{config.model}")
                    for config in settings.attempts()]
        number = 0
        while True:
            line = await _prompt(reader, screen, ctrl_c)
            if line is None or line.strip() == "/quit":
                return 0
            if not line.strip():
                continue
            number += 1
            history.append({"type": "dialogue", "role": "user", "author": "you",
                            "message_id": f"t{number}", "content": line})
            items = list(history)
            tools = catalog.registry()
            reply = ReplyJournals(journals, "chat", [a.label for a in attempts], tools,
                                  history=scenario_history(items))
            lock = locks.try_acquire(CHANNEL, owner=f"terminal-{number}")
            assert lock is not None
            finished: GenerationResult | None = None
            try:
                with ctrl_c.meaning(lambda: locks.request_stop(CHANNEL)):
                    result = finished = await run_generation_turn(
                        attempts, channel=channel, locks=locks, lock=lock,
                        request=TurnRequest(context_items=items,
                                            system_prompt=persona.system_prompt()),
                        config=settings.engine, tools=tools, observer=observer,
                        on_attempt=reply.on_attempt)
            finally:
                locks.release(lock)
                await reply.save(finished)
            screen.status(f"  = {result.status}")
            failure = failure_line(result, attempts) if not result.delivered_text else None
            if failure is not None:
                screen.status(failure)
            if result.delivered_text:
                history.append({"type": "dialogue", "role": "assistant", "author": "bot",
                                "message_id": f"b{number}", "content": result.delivered_text})
