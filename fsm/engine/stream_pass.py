"""One provider pass's worker: consumes the adapter's stream, delivers text, and posts only
the events the driver must act on (first token, end, crash, settle). Chunks after the first
never go through the machine: they update a deadline float and the lock's touch time."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator
from typing import Protocol

from .channel import DeliveryCapReached, TurnChannel
from .clock import on_grid
from .config import TurnConfig
from .events import FirstToken, StreamCrashed, StreamEnded, StreamSettled, TurnEvent
from .locks import ChannelLock, ChannelLockRegistry
from .pass_run import PassRun
from .provider import (
    Finish,
    KeepAlive,
    Provider,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    Usage,
)
from .recording import InputRecorder

log = logging.getLogger(__name__)

__all__ = ["DeliveryTimeout", "PassHost", "stream_worker"]


class _Postbox(Protocol):
    def post(self, event: TurnEvent, at: float | None = None) -> None: ...


class PassHost(Protocol):
    """What the stream worker needs from the turn it works for: the provider to call, the
    channel to deliver into, the lock to touch, the budgets, the driver's mailbox and the
    recorder. A protocol, so the worker does not depend on the driver's module."""

    @property
    def provider(self) -> Provider: ...
    @property
    def channel(self) -> TurnChannel: ...
    @property
    def locks(self) -> ChannelLockRegistry: ...
    @property
    def lock(self) -> ChannelLock: ...
    @property
    def config(self) -> TurnConfig: ...
    @property
    def mailbox(self) -> _Postbox: ...
    @property
    def recorder(self) -> InputRecorder | None: ...


def _outcome(run: PassRun) -> str:
    if run.capped:
        return "delivery_cap"
    if run.error is not None:
        return "provider_error"
    if run.tool_calls:
        return "tool_call"
    if not run.got_token:
        return "empty"
    return "completed"


async def stream_worker(turn: PassHost, run: PassRun) -> None:
    """Drive the adapter's stream for `run`, posting events to `turn`'s mailbox.

    The content-chunk branch is the engine's hot path (BENCHMARKS.md F5): what it needs is
    bound to locals once per pass, and until the pass's abort fires each chunk re-arms the
    idle deadline and touches the lock inline — the abort firing (timeout, kill, end of
    pass) is what removes this progress hook (S5, S14). A chunk with no `<` skips the
    `<details>` filter (T8); what the reply may still deliver is one integer (D5): past it
    the chunk is cut and the stream ends."""
    loop = asyncio.get_running_loop()
    clock = loop.time
    post = turn.mailbox.post
    channel = turn.channel
    deliver = channel.deliver
    recorder = turn.recorder
    record_text = run.record_text
    lock = turn.lock
    idle_s = turn.config.idle_timeout_s
    abort = run.abort
    parts = run.parts
    details = run.details
    filtering = False  # a `<details>` block is open or a tag is held back (T8)
    chars_left = run.chars_left
    started = run.started_at
    deadline = run.deadline if run.deadline is not None else math.inf
    stream: AsyncIterator[ProviderEvent] | None = None
    crashed = False
    ended_at = 0.0
    try:
        with turn.locks.watchdog(lock):
            stream = turn.provider.stream(run.request, abort)
            try:
                async for event in stream:
                    if isinstance(event, TextDelta):
                        text = event.text
                        if not text:
                            continue
                        if type(text) is not str:
                            raise TypeError(f"the provider sent {type(text).__name__} as text")
                        now = clock()
                        if abort.fired or now > deadline:
                            # Aborted, or past its deadline before the driver could act
                            # on it: the timeout comes first, as in replay (S10).
                            if recorder is not None:
                                recorder.on_landed(run.no, text)
                            if details.pending or "<" in text:
                                text = details.feed(text)
                            if text:
                                await deliver(text)
                                run.landed.append(text)
                            continue
                        run.deadline = deadline = now + idle_s
                        lock.last_touch = now
                        if not run.got_token:
                            run.got_token = True
                            post(FirstToken(run.no), now)
                        if record_text is not None:
                            record_text((on_grid(now) - started, text))  # as the mailbox stamps it
                        if filtering or "<" in text:
                            text = details.feed(text)
                            filtering = details.pending
                            if not text:
                                continue
                        chars_left -= len(text)
                        if chars_left < 0:
                            run.capped = True
                            text = text[:len(text) + chars_left]
                            if text:
                                await deliver(text)
                                parts.append(text)
                            break
                        await deliver(text)
                        parts.append(text)
                    elif isinstance(event, KeepAlive):
                        if recorder is not None:
                            recorder.on_keepalive(run.no, clock() - started)
                    elif isinstance(event, ReasoningDelta):
                        run.reasoning.append(event.text)
                        if recorder is not None:
                            recorder.on_step(run.no, clock() - started,
                                             {"reasoning": event.text})
                    elif isinstance(event, ToolCallRequest):
                        run.tool_calls.append(event)
                    elif isinstance(event, Usage):
                        run.usage = event
                        if recorder is not None:
                            recorder.on_step(run.no, clock() - started,
                                             {"usage": event.as_dict()})
                    elif isinstance(event, Finish):
                        run.finish = event.reason
                        if recorder is not None:
                            recorder.on_step(run.no, clock() - started, {"finish": event.reason})
                    elif isinstance(event, ProviderError):
                        run.error = event
                        break
                if not abort.fired and not run.capped:
                    tail = details.finish()[:max(chars_left, 0)]
                    if tail:
                        await deliver(tail)
                        parts.append(tail)
            except DeliveryCapReached:
                run.capped = True  # the channel cut the reply at its message bound (D5)
            if not abort.fired:
                ended_at = on_grid(clock())
                await _flush(turn, run)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the engine cancelled this worker
        crashed = _crashed(turn, run, exc, clock())  # the adapter raised it: not a stop
    except Exception as exc:
        crashed = _crashed(turn, run, exc, clock())
    finally:
        if stream is not None:
            await _close(stream)
    if crashed:
        return
    if abort.fired:
        await _settled(turn, run)
        return
    outcome = _outcome(run)
    flushed_at = on_grid(clock())
    if recorder is not None:
        recorder.on_end(run.no, ended_at - started, outcome, run, flushed_at - ended_at)
    post(StreamEnded(run.no, outcome, run.error), flushed_at)


async def _flush(turn: PassHost, run: PassRun) -> None:
    """The stream has ended: the model is done, so its inactivity timer stops (S15: only
    the engine's own inactivity timeout is a timeout), and the channel gets the delivery
    budget to send what the pass handed it — a Discord channel may be waiting out rate
    limits. Running out of it is a failed send (D2)."""
    run.deadline = None
    budget = turn.config.delivery_timeout_s
    try:
        async with asyncio.timeout(budget):
            await turn.channel.finish_pass()
    except TimeoutError:
        raise DeliveryTimeout(f"the channel did not finish sending within {budget:g} s") from None
    except DeliveryCapReached:
        run.capped = True  # what was within the bound is sent; the rest was dropped (D5)
    run.flushed = True


class DeliveryTimeout(Exception):
    """The channel took longer than the delivery budget to send a finished pass."""


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


def _crashed(turn: PassHost, run: PassRun, exc: BaseException, now: float) -> bool:
    """Report the failure at once (True); a stream that was aborted settles instead (S10)."""
    if run.abort.fired:
        return False
    now = on_grid(now)
    if turn.recorder is not None:
        turn.recorder.on_raise(run.no, now - run.started_at, exc)
    turn.mailbox.post(StreamCrashed(run.no, exc), now)
    return True


async def _settled(turn: PassHost, run: PassRun) -> None:
    """The aborted stream has finished: whatever was on the wire has landed (S10). After a
    timeout the channel sends what the pass handed it — the text it still buffered and what
    landed since — within the driver's settle deadline, so it is in the delivered text a
    fallback continues from; a send that outlives the wait is cut off there, and what was
    not sent by then is dropped when the turn ends (`discard_unsent`)."""
    if run.aborted_at is not None:
        try:
            await turn.channel.finish_pass()
        except Exception as exc:
            log.warning("flushing what landed failed: %s", type(exc).__name__)
    settled_at = on_grid(asyncio.get_running_loop().time())
    if turn.recorder is not None and run.aborted_at is not None:
        turn.recorder.on_stall(run.no, settled_at - run.aborted_at)
    turn.mailbox.post(StreamSettled(run.no), settled_at)
