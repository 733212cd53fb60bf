"""One provider pass's worker: consumes the adapter's stream, delivers text, and posts only
the events the driver must act on (first token, end, crash, settle). Chunks after the first
never go through the machine: they update a deadline float and the lock's touch time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .events import FirstToken, StreamCrashed, StreamEnded, StreamSettled
from .provider import (
    AbortSignal,
    Finish,
    KeepAlive,
    PassRequest,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    Usage,
)
from .result import PassResult, TurnStatus

if TYPE_CHECKING:
    from .turn import Turn

log = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class PassRun:
    """The live state of one pass (the seed's streaming context)."""

    no: int
    request: PassRequest
    abort: AbortSignal
    started_at: float
    deadline: float | None
    on_progress: Callable[[float], None] | None = None
    kill_handle: Callable[[str], None] | None = None
    parts: list[str] = field(default_factory=list)
    landed: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    usage: Usage | None = None
    finish: str | None = None
    error: ProviderError | None = None
    got_token: bool = False
    closed: bool = False
    aborted_at: float | None = None
    worker: asyncio.Task[None] | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def result(self, status: TurnStatus, include_landed: bool) -> PassResult:
        text = self.text + ("".join(self.landed) if include_landed else "")
        return PassResult(
            index=self.no,
            status=status,
            text=text,
            reasoning="".join(self.reasoning),
            tool_calls=[call.name for call in self.tool_calls],
            usage=self.usage.as_dict() if self.usage is not None else None,
            finish_reason=self.finish,
            error=self.error.as_dict() if self.error is not None else None,
        )


def _outcome(run: PassRun) -> str:
    if run.error is not None:
        return "provider_error"
    if run.tool_calls:
        return "tool_call"
    if not run.parts:
        return "empty"
    return "completed"


async def stream_worker(turn: Turn, run: PassRun) -> None:
    """Drive the adapter's stream for `run`, posting events to `turn`'s mailbox."""
    loop = asyncio.get_running_loop()
    post = turn.mailbox.post
    channel = turn.channel
    recorder = turn.recorder
    abort = run.abort
    stream: AsyncIterator[ProviderEvent] | None = None
    try:
        with turn.locks.watchdog(turn.lock):
            stream = turn.provider.stream(run.request, abort)
            async for event in stream:
                if isinstance(event, TextDelta):
                    text = event.text
                    if not text:
                        continue
                    if type(text) is not str:
                        raise TypeError(f"the provider sent {type(text).__name__} as text")
                    now = loop.time()
                    landed = abort.fired
                    if not landed:
                        progress = run.on_progress
                        if progress is not None:
                            progress(now)
                        if not run.got_token:
                            run.got_token = True
                            post(FirstToken(run.no))
                    if recorder is not None:
                        recorder.on_text(run.no, now - run.started_at, text, landed)
                    await channel.deliver(text)
                    (run.landed if landed else run.parts).append(text)
                elif isinstance(event, KeepAlive):
                    if recorder is not None:
                        recorder.on_keepalive(run.no, loop.time() - run.started_at)
                elif isinstance(event, ReasoningDelta):
                    run.reasoning.append(event.text)
                elif isinstance(event, ToolCallRequest):
                    run.tool_calls.append(event)
                elif isinstance(event, Usage):
                    run.usage = event
                elif isinstance(event, Finish):
                    run.finish = event.reason
                elif isinstance(event, ProviderError):
                    run.error = event
                    break
            if not abort.fired:
                await channel.finish_pass()
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the engine cancelled this worker
        _crashed(turn, run, exc, loop.time())  # the adapter raised it: a failure, not a stop
        return
    except Exception as exc:
        _crashed(turn, run, exc, loop.time())
        return
    finally:
        if stream is not None:
            await _close(stream)
    if abort.fired:
        _settled(turn, run, loop.time())
        return
    outcome = _outcome(run)
    if recorder is not None:
        recorder.on_end(run.no, loop.time() - run.started_at, outcome, run)
    post(StreamEnded(run.no, outcome, run.error))


async def _close(stream: object) -> None:
    """Close the adapter's generator now, not at garbage collection, so its response is
    released however the pass ended (S14)."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception as exc:
        log.warning("closing the provider stream failed: %s", type(exc).__name__)


def _crashed(turn: Turn, run: PassRun, exc: BaseException, now: float) -> None:
    if run.abort.fired:
        _settled(turn, run, now)
        return
    if turn.recorder is not None:
        turn.recorder.on_raise(run.no, now - run.started_at, exc)
    turn.mailbox.post(StreamCrashed(run.no, exc))


def _settled(turn: Turn, run: PassRun, now: float) -> None:
    """The aborted stream has finished: whatever was on the wire has landed (S10)."""
    if turn.recorder is not None and run.aborted_at is not None:
        turn.recorder.on_stall(run.no, now - run.aborted_at)
    turn.mailbox.post(StreamSettled(run.no))
