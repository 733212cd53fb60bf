"""The provider half of the loop (S3-S14): the pass that runs now, its worker, its deadlines
(first token, rolling idle, the settle wait after a timeout) and its kill handle.

Like the other runners it never fires a trigger; the driver asks it for its deadline and
tells it what happened. It is what the stream worker works for (`PassHost`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .channel import TurnChannel
from .config import TurnConfig
from .events import TurnEvent
from .locks import ChannelLock, ChannelLockRegistry
from .mailbox import Mailbox
from .pass_run import PassRun
from .provider import AbortSignal, PassRequest, Provider
from .recording import InputRecorder
from .result import PassResult, TurnStatus
from .stream_pass import stream_worker
from .tasks import Work

log = logging.getLogger(__name__)


class PassRunner:
    """Runs one provider pass at a time under its own abort, deadlines and kill handle."""

    def __init__(
        self,
        *,
        provider: Provider,
        channel: TurnChannel,
        locks: ChannelLockRegistry,
        lock: ChannelLock,
        config: TurnConfig,
        mailbox: Mailbox[TurnEvent],
        turn_id: str,
        spawn: Callable[[Work, str], asyncio.Task[None]],
    ) -> None:
        self.provider = provider
        self.channel = channel
        self.locks = locks
        self.lock = lock
        self.config = config
        self.mailbox = mailbox
        self.recorder: InputRecorder | None = None
        self._turn_id = turn_id
        self._spawn = spawn
        self.run: PassRun | None = None
        self.settle_deadline: float | None = None
        self.timeout_phase = "first_token"

    def begin(self, request: PassRequest, now: float, chars_left: int) -> PassRun:
        """Start the stream under its own abort and kill handle (S3, S4, S7)."""
        no = request.pass_index
        run = PassRun(no=no, request=request, abort=AbortSignal(), started_at=now,
                      deadline=now + self.config.first_token_timeout_s, chars_left=chars_left)
        run.kill_handle = run.abort.fire  # the pass's own slot: the turn's is its stop
        self.locks.set_stream_kill(self.lock, run.kill_handle)
        self.run = run
        self.timeout_phase = "first_token"
        if self.recorder is not None:
            run.record_text = self.recorder.on_pass_start(no)
        run.worker = self._spawn(stream_worker(self, run), f"{self._turn_id}-pass-{no}")
        return run

    @property
    def deadline(self) -> float | None:
        """The settle wait's end while settling, else the stream's first-token or idle
        deadline (re-armed by the worker on every chunk, S5)."""
        if self.settle_deadline is not None:
            return self.settle_deadline
        run = self.run
        return run.deadline if run is not None else None

    def is_current(self, pass_no: int) -> bool:
        run = self.run
        return run is not None and run.no == pass_no

    def first_token(self) -> None:
        """From here a timeout is an idle timeout; the worker already re-armed the deadline
        with the idle budget when the chunk arrived (S5)."""
        self.timeout_phase = "idle"

    def timed_out(self, at: float) -> None:
        """A genuine timeout aborts the stream and starts the bounded settle wait (S10)."""
        run = self.run
        assert run is not None
        run.aborted_at = at
        run.abort.fire("timeout")
        run.deadline = None
        self.settle_deadline = at + self.config.settle_timeout_s

    def record_stall(self) -> None:
        """The settle wait ran out: the journal records the stream as never settling."""
        run = self.run
        if self.recorder is not None and run is not None:
            self.recorder.on_stall(run.no, 2 * self.config.settle_timeout_s + 1.0)

    def abort(self, reason: str) -> None:
        if self.run is not None:
            self.run.abort.fire(reason)

    def close(self, status: TurnStatus, include_landed: bool) -> PassResult | None:
        """Freeze the running pass's result, once (S13); None when it is already closed."""
        run = self.run
        if run is None or run.closed:
            return None
        run.closed = True
        result = run.result(status, include_landed)
        self.end()
        return result

    def end(self) -> None:
        """However the pass ends: timer cleared, kill handle deregistered, the stream
        aborted if still running — the abort is also what removes the worker's progress
        hook, so no late chunk re-arms a timer or touches the lock (S14)."""
        run = self.run
        if run is None:
            return
        run.deadline = None
        if run.kill_handle is not None:
            self.locks.clear_stream_kill(self.lock, run.kill_handle)
            run.kill_handle = None
        self.settle_deadline = None
        run.abort.fire("pass ended")
        worker = run.worker
        if worker is not None and not worker.done():
            worker.cancel()

    def finish(self) -> None:
        """The turn ends: the pass ended, and a pass cut short leaves no unsent text in the
        channel for a fallback to send (G1, S10)."""
        self.end()
        if self.run is None or self.run.flushed:
            return
        try:
            self.channel.discard_unsent()
        except Exception as exc:
            log.warning("turn %s: the channel could not drop unsent text: %s",
                        self._turn_id, type(exc).__name__)
