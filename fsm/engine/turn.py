"""A turn: the driver task that alone fires the machine's triggers.

Workers (the provider stream, a tool, a restart's look-ups) post events to the turn's
mailbox; timers are deadlines the driver waits on; a kill sets a flag, aborts the workers and
jumps the mailbox. Callbacks run by the machine are short and synchronous: anything that
must be awaited (notices, look-ups) happens in the driver or a worker, never in a callback.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from . import events as ev
from .channel import Notice, NoticeKind, TurnChannel
from .config import TurnConfig
from .flags import TurnFlags
from .locks import ChannelLock, ChannelLockRegistry
from .machine import shared_machine
from .mailbox import Mailbox
from .metadata import (
    LookupBudget,
    LookupProgress,
    annotate,
    fetch_reactors,
    neutralize,
    tail_directive,
)
from .prefill import TurnRequest, build_pass_request
from .provider import AbortSignal, HistoryEntry, PassRequest, Provider, ToolCallRequest
from .restart import METADATA_TAIL_DIRECTIVE, RestartRequest, parse_restart, resolve_item
from .result import PassResult, TurnResult, TurnStatus
from .stash import ContextStash
from .stream_pass import PassRun, TextSink, stream_worker
from .table import CRASH_SOURCES, STREAM_STATES, TERMINAL, State
from .tools import ToolContext, ToolRegistry, ToolResult

log = logging.getLogger(__name__)

_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)
_PASS_STATES = frozenset({State.AWAITING_FIRST_TOKEN.value, State.STREAMING.value,
                          State.SETTLING.value})
_STREAM_STATES = frozenset(s.value for s in STREAM_STATES)
_turn_ids = itertools.count(1)
_STATUS_BY_OUTCOME: dict[str, TurnStatus] = {
    "completed": "completed", "empty": "empty_response", "provider_error": "error",
}


class TurnObserver(Protocol):
    """Sees every transition as it happens (the demo's printer, the journal)."""

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None: ...


class InputRecorder(Protocol):
    """Records a live turn's inputs as they really arrive, so it can be replayed."""

    def on_pass_start(self, pass_no: int) -> TextSink:
        """Called as a pass begins; returns what records its content chunks."""
        ...

    def on_landed(self, pass_no: int, text: str) -> None: ...
    def on_keepalive(self, pass_no: int, at: float) -> None: ...
    def on_end(self, pass_no: int, at: float, outcome: str, run: PassRun,
               flush_s: float = 0.0) -> None: ...
    def on_raise(self, pass_no: int, at: float, error: BaseException) -> None: ...
    def on_stall(self, pass_no: int, settles_after: float) -> None: ...
    def on_tool(self, name: str, after: float, outcome: dict[str, Any]) -> None: ...
    def on_event(self, at: float, event: dict[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class _PendingCall:
    no: int
    call: ToolCallRequest
    started_at: float


def _spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """A worker task in a fresh context, so the machine's task bookkeeping does not leak."""
    return asyncio.get_running_loop().create_task(coro, name=name, context=contextvars.Context())


class Turn:
    """One bot reply in one channel, from Preparing to exactly one terminal state."""

    state: str

    def __init__(
        self,
        *,
        provider: Provider,
        channel: TurnChannel,
        locks: ChannelLockRegistry,
        lock: ChannelLock,
        request: TurnRequest | None = None,
        tools: ToolRegistry | None = None,
        stash: ContextStash | None = None,
        config: TurnConfig | None = None,
        observer: TurnObserver | None = None,
        recorder: InputRecorder | None = None,
        turn_id: str | None = None,
    ) -> None:
        self.turn_id = turn_id or f"turn-{next(_turn_ids)}"
        self.provider = provider
        self.channel = channel
        self.locks = locks
        self.lock = lock
        self.request = request if request is not None else TurnRequest()
        self.tools = tools if tools is not None else ToolRegistry()
        self.config = config if config is not None else TurnConfig()
        self.stash = stash if stash is not None else ContextStash(
            ttl_s=self.config.stash_ttl_s, max_items=self.config.stash_max_items,
            max_bytes=self.config.stash_max_bytes,
        )
        self.observer = observer
        self.recorder = recorder
        self.mailbox: Mailbox[ev.TurnEvent] = Mailbox()

        self.flags = TurnFlags()
        self.context_items: list[dict[str, Any]] = list(self.request.context_items)
        self.function_history: list[HistoryEntry] = list(self.request.function_history)
        self.replayable_calls: list[dict[str, Any]] = []
        self.review_log: list[dict[str, Any]] = []
        self.turn_notices: list[str] = []
        self.consecutive_tool_errors = 0
        self.context_items_added = 0
        self.reactor_lookups = 0
        self.notices: list[str] = []
        self.deferred_notice: NoticeKind | None = None
        self.metrics: list[dict[str, Any]] = []
        self.status: TurnStatus | None = None
        self.error: str | None = None
        self.follow_up_queued = False
        self.stop_requested = False
        self.transitions: list[dict[str, Any]] = []
        self.internal_transitions: list[dict[str, Any]] = []
        self.state = State.PREPARING.value

        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0
        self._event_time: float | None = None
        self._outbox: list[Notice] = []
        self._passes: list[PassResult] = []
        self._run: PassRun | None = None
        self._final_text = ""
        self._delivered: list[str] = []
        self._channel_mark = 0
        self._settle_deadline: float | None = None
        self._timeout_phase = "first_token"
        self._calls: deque[ToolCallRequest] = deque()
        self._call_seq = itertools.count(1)
        self._current_call: _PendingCall | None = None
        self._tool_task: asyncio.Task[None] | None = None
        self._tool_abort: AbortSignal | None = None
        self._tool_deadline: float | None = None
        self._pre_tool_text = ""
        self._restart: RestartRequest | None = None
        self._restart_call: ToolCallRequest | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._restart_seq = itertools.count(1)
        self._restart_no = 0
        self._restart_deadline: float | None = None
        self._lookups = LookupProgress()
        self._abandoned: list[asyncio.Task[None]] = []
        self._still_working_sent = False

    # ----------------------------------------------------------------- public API

    async def run(self) -> TurnResult:
        """Drive the turn to its terminal state; always cleans up, whatever happens."""
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self.lock.turn_kill = self.request_stop
        self._channel_mark = len(_channel_delivered(self.channel) or "")
        try:
            await self._drive()
        finally:
            await self._cleanup()
        return self.result()

    def request_stop(self, reason: str = "kill") -> None:
        """`/kill`: honoured at once in every non-terminal state (S7, S16)."""
        if self.stop_requested or self.state in _TERMINAL_NAMES:
            return
        self.stop_requested = True
        if self.recorder is not None and self._loop is not None:
            self.recorder.on_event(self._loop.time() - self._t0, {"kill": True})
        run = self._run
        if run is not None:
            run.abort.fire("kill")
        if self._tool_abort is not None:
            self._tool_abort.fire("kill")
        self.mailbox.post_urgent(ev.Kill(reason))

    def notify_follow_up(self) -> None:
        """A new message from the same user arrived in the channel (S17, T3)."""
        if self.state in _TERMINAL_NAMES:
            return
        if self.recorder is not None and self._loop is not None:
            self.recorder.on_event(self._loop.time() - self._t0, {"follow_up": True})
        self.mailbox.post(ev.FollowUp())

    @property
    def elapsed(self) -> float:
        return (self._loop.time() if self._loop else 0.0) - self._t0

    def result(self) -> TurnResult:
        status: TurnStatus = self.status or "error"
        return TurnResult(
            status=status,
            state=self.state,
            text=self._final_text,
            passes=list(self._passes),
            consecutive_tool_errors=self.consecutive_tool_errors,
            flags=self.flags.as_dict(),
            function_history=[entry.tool_name for entry in self.function_history],
            context_items_added=self.context_items_added,
            stash_items=self.stash.live_count(),
            reactor_lookups=self.reactor_lookups,
            notices=list(self.notices),
            deferred_notice=self.deferred_notice,
            metrics=list(self.metrics),
            delivered_text=self._delivered_text(),
            error=self.error,
            thoughts={"owner": self.request.owner,
                      "log": [p.reasoning for p in self._passes if p.reasoning]},
            review_log=list(self.review_log),
            follow_up_queued=self.follow_up_queued,
        )

    def _delivered_text(self) -> str:
        """What reached the channel during this turn: the channel's own account when it
        keeps one (a Discord channel buffers, so accepting a chunk is not sending it),
        else the text every pass handed over (D2, G1)."""
        sent = _channel_delivered(self.channel)
        if sent is not None:
            return sent[self._channel_mark:]
        return "".join(self._delivered)

    # ----------------------------------------------------------------- the driver

    async def _drive(self) -> None:
        while self.state not in _TERMINAL_NAMES:
            try:
                await self._step()
            except Exception as exc:
                log.exception("turn %s: unexpected failure in %s", self.turn_id, self.state)
                try:
                    await self._fail(exc)
                except Exception:
                    log.exception("turn %s: the crash transition failed too", self.turn_id)
                    self._force_done()

    async def _step(self) -> None:
        state = self.state
        if self.stop_requested:
            await self._fire("kill", ev.Kill("stop requested"))
            return
        if state == State.PREPARING.value:
            if self.lock.stop_requested:
                await self._fire("kill", ev.Kill("stop requested on the channel"))
            elif len(self._passes) >= self.config.max_iterations:
                await self._fire("iteration_cap")
            elif await self._fire("begin", self._prepare_request()):
                # Let the pass's worker call the provider before the mailbox is read again:
                # a pass that began has asked the model, even when a kill or follow-up is
                # already waiting at the same instant (S3, S17).
                await asyncio.sleep(0)
            return
        if state == State.TOOL_CALL.value and self._current_call is None:
            await self._dispatch_next_call()
            return
        if state == State.CONTEXT_RESTART.value and self._restart_task is None:
            await self._begin_restart()
            return
        deadline = self._deadline()
        event = await self.mailbox.get(deadline)
        if event is None:
            await self._on_deadline(deadline)
        else:
            await self._on_event(event)

    async def _fail(self, exc: BaseException) -> None:
        """An unexpected exception ends the turn Done/error; cleanup still runs (S15)."""
        self.error = f"{type(exc).__name__}: {exc}"
        if self.state in _TERMINAL_NAMES:
            return
        if self.state in CRASH_SOURCES:
            await self._fire("crash", ev.WorkerCrashed(exc))
            return
        log.error("turn %s: no crash edge from %s; forcing Done", self.turn_id, self.state)
        self._force_done()

    def _force_done(self) -> None:
        """The last resort when the machine itself cannot move: the turn still ends in one
        terminal state, journaled as a crash."""
        if self.state in _TERMINAL_NAMES:
            return
        self.status = "error"
        self._record(self.elapsed, "crash", self.state, State.DONE.value)
        self.state = State.DONE.value

    def _deadline(self) -> float | None:
        state = self.state
        if state in _STREAM_STATES:
            run = self._run
            return run.deadline if run is not None else None
        if state == State.SETTLING.value:
            return self._settle_deadline
        if state == State.TOOL_CALL.value:
            return self._tool_deadline
        if state == State.CONTEXT_RESTART.value:
            return self._restart_deadline
        return None

    async def _fire(self, trigger: str, payload: Any = None, at: float | None = None) -> bool:
        """Fire `trigger`, journal the transition, then do the awaited follow-up work."""
        source = self.state
        self._event_time = at
        machine = shared_machine()
        try:
            taken = bool(await machine.events[trigger].trigger(self, payload))
        except Exception:
            if self.state != source:  # a callback failed after the state changed
                t = (at if at is not None else self._now()) - self._t0
                self._record(t, trigger, source, self.state)
            raise
        dest = self.state
        if not taken:
            return False
        t = (at if at is not None else self._now()) - self._t0
        if dest == source:
            self.internal_transitions.append({"t": round(t, 6), "event": trigger,
                                              "state": source})
        else:
            self._record(t, trigger, source, dest)
            if source in _PASS_STATES and dest not in _PASS_STATES:
                self._end_pass()
        await self._flush_outbox()
        return taken

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def _record(self, t: float, trigger: str, source: str, dest: str) -> None:
        t = round(t, 6)
        self.transitions.append({"t": t, "event": trigger, "from": source, "to": dest})
        if self.observer is not None:
            self.observer.on_transition(self, t, trigger, source, dest)

    async def _flush_outbox(self) -> None:
        while self._outbox:
            notice = self._outbox.pop(0)
            try:
                await self.channel.post_notice(notice)
            except Exception as exc:
                log.warning("turn %s: notice %s could not be posted: %s",
                            self.turn_id, notice.kind, type(exc).__name__)
                continue
            self.notices.append(notice.kind)

    async def _on_deadline(self, waited: float | None) -> None:
        """The clock reached `waited`. Compared with the deadline waited for, not with the
        clock, so a deadline a rounding error past the loop's clock still fires."""
        deadline = self._deadline()
        if deadline is None or waited is None or deadline > waited:
            return  # the rolling deadline moved on: wait again (S5)
        state = self.state
        if state == State.AWAITING_FIRST_TOKEN.value:
            await self._fire("first_token_timeout", at=deadline)
        elif state == State.STREAMING.value:
            await self._fire("idle_timeout", at=deadline)
        elif state == State.SETTLING.value:
            await self._fire("settle_timeout", at=deadline)
        elif state == State.TOOL_CALL.value:
            await self._tool_timed_out(deadline)
        elif state == State.CONTEXT_RESTART.value:
            await self._restart_timed_out(deadline)

    async def _on_event(self, event: ev.TurnEvent) -> None:
        run = self._run
        if isinstance(event, ev.Kill):
            await self._fire("kill", event)
        elif isinstance(event, ev.FollowUp):
            await self._fire("follow_up", event)
        elif isinstance(event, ev.FirstToken):
            if run is not None and event.pass_no == run.no and self.state == "AwaitingFirstToken":
                await self._fire("first_token", event)
        elif isinstance(event, (ev.StreamEnded, ev.StreamCrashed)) and run is not None \
                and event.pass_no == run.no and self.state == "Settling":
            await self._fire("settled", event)  # it ended as its timer fired: it has settled
        elif isinstance(event, ev.StreamEnded):
            if run is not None and event.pass_no == run.no and self.state in _STREAM_STATES:
                await self._fire(event.outcome, event)
        elif isinstance(event, ev.StreamCrashed):
            if run is not None and event.pass_no == run.no and self.state in _STREAM_STATES:
                self.error = f"{type(event.error).__name__}: {event.error}"
                await self._fire("crash", event)
        elif isinstance(event, ev.StreamSettled):
            if run is not None and event.pass_no == run.no and self.state == "Settling":
                await self._fire("settled", event)
        elif isinstance(event, ev.ToolFinished):
            current = self._current_call
            if current is not None and event.call_no == current.no:
                self._tool_task = None
                await self._on_tool_result(current, event.result)
        elif isinstance(event, ev.RestartReady):
            if event.restart_no == self._restart_no and self.state == "ContextRestart":
                await self._fire("restart", event.payload)
        elif isinstance(event, ev.WorkerCrashed):
            await self._fail(event.error)

    # ----------------------------------------------------------------- guards

    def stop_pending(self, _payload: Any = None) -> bool:
        """A stop was requested for this turn or on its channel (S9)."""
        return self.stop_requested or self.lock.stop_requested

    def follow_up_may_interrupt(self, _payload: Any = None) -> bool:
        return self.lock.follow_up_interrupts < self.locks.max_follow_up_interrupts

    def calls_pending(self, _payload: Any = None) -> bool:
        return bool(self._calls)

    def error_cap_reached(self, payload: Any = None) -> bool:
        failed = isinstance(payload, ToolResult) and not payload.success
        errors = self.consecutive_tool_errors + 1 if failed else 0
        return errors >= self.config.max_consecutive_tool_errors

    # ----------------------------------------------------------------- callbacks

    def on_iteration_cap(self, _payload: Any = None) -> None:
        self.status = "timeout"
        self._outbox.append(Notice.of("max_iterations"))

    def _prepare_request(self) -> PassRequest:
        """Preparing's work: the next pass's request, with the tools the flags allow (S1,
        S2, R8). Done before `begin` so a failure here is a crash from Preparing."""
        return build_pass_request(self.request, self.context_items, self.function_history,
                                  self.tools.schemas(self.flags), len(self._passes) + 1,
                                  self.turn_notices)

    def on_begin(self, payload: Any = None) -> None:
        """Start the stream under its own abort and kill handle (S3, S4, S7)."""
        assert isinstance(payload, PassRequest)
        request = payload
        now = self._now()
        pass_no = request.pass_index
        run = PassRun(no=pass_no, request=request, abort=AbortSignal(), started_at=now,
                      deadline=now + self.config.first_token_timeout_s)
        run.kill_handle = self.request_stop
        self.locks.set_stream_kill(self.lock, run.kill_handle)
        self._run = run
        self._timeout_phase = "first_token"
        self._passes.append(PassResult(index=pass_no, status="function_call"))
        if pass_no == self.config.soft_warn_iteration and not self._still_working_sent:
            self._still_working_sent = True
            self._outbox.append(Notice.of("still_working"))
        if self.recorder is not None:
            run.record_text = self.recorder.on_pass_start(pass_no)
        run.worker = _spawn(stream_worker(self, run), f"{self.turn_id}-pass-{pass_no}")

    def on_first_token(self, _payload: Any = None) -> None:
        """From here a timeout is an idle timeout; the worker already re-armed the deadline
        with the idle budget when the chunk arrived (S5)."""
        self._timeout_phase = "idle"

    def on_stream_timeout(self, _payload: Any = None) -> None:
        """A genuine timeout aborts the stream and starts the bounded settle wait (S10);
        with a stop pending the turn is already Stopped (S9)."""
        run = self._run
        assert run is not None
        if self.state == State.STOPPED.value:
            self._stop(include_landed=False)
            return
        at = self._event_time if self._event_time is not None else self._now()
        run.aborted_at = at
        run.abort.fire("timeout")
        run.deadline = None
        self._settle_deadline = at + self.config.settle_timeout_s

    def on_settled(self, _payload: Any = None) -> None:
        self._finish_timeout(include_landed=True)

    def on_settle_timeout(self, _payload: Any = None) -> None:
        run = self._run
        if self.recorder is not None and run is not None:
            self.recorder.on_stall(run.no, 2 * self.config.settle_timeout_s + 1.0)
        self._finish_timeout(include_landed=False)

    def _finish_timeout(self, include_landed: bool) -> None:
        """Metric, then the phase-aware notice, posted or deferred (S11-S13)."""
        phase = self._timeout_phase
        self.metrics.append({"name": "stream_sdk_timeout", "phase": phase})
        kind: NoticeKind = "timeout_first_token" if phase == "first_token" else "timeout_idle"
        if self.config.surface_user_errors:
            if self.config.fallback_pending:
                self.deferred_notice = kind
            else:
                self._outbox.append(Notice.of(kind))
        self.status = "timeout"
        self._close_pass("timeout", include_landed)

    def on_stream_end(self, payload: Any = None) -> None:
        assert isinstance(payload, ev.StreamEnded)
        status = _STATUS_BY_OUTCOME[payload.outcome]
        if payload.error is not None:
            self.error = f"{payload.error.kind}: {payload.error.message}"
        self.status = status
        self._close_pass(status, include_landed=False)

    def on_tool_call(self, _payload: Any = None) -> None:
        """Keep the pre-tool text for the call's history entry (T7) and queue the calls."""
        run = self._run
        assert run is not None
        self._pre_tool_text = run.text
        self._calls = deque(run.tool_calls)
        self._close_pass("function_call", include_landed=False)

    def on_follow_up(self, _payload: Any = None) -> None:
        if self.state == State.DONE.value:
            self.lock.follow_up_interrupts += 1
            self.status = "follow_up_interrupt"
            self._close_pass("follow_up_interrupt", include_landed=False)
        else:
            self.follow_up_queued = True

    def on_nameless_call(self, _payload: Any = None) -> None:
        self.status = "error"
        self.error = "the provider returned a function call without a tool name"

    def on_tool_outcome(self, payload: Any = None) -> None:
        """Record a tool's outcome on the history and the error count (T5-T7)."""
        current = self._current_call
        assert current is not None and isinstance(payload, ToolResult)
        call = current.call
        self.function_history.append(HistoryEntry(
            tool_name=call.name, arguments=call.arguments, result=payload.for_model(),
            call_id=call.id, pre_tool_text=self._take_pre_tool_text(), success=payload.success,
        ))
        if payload.success:
            self.consecutive_tool_errors = 0
            self.replayable_calls.append({"name": call.name, "arguments": call.arguments,
                                          "result": payload.for_model()})
        else:
            self.consecutive_tool_errors += 1
        self._current_call = None
        self._tool_deadline = None
        if self.state == State.DONE.value:
            self.status = "error"
            self.error = f"{self.consecutive_tool_errors} consecutive tool failures"
            self._outbox.append(Notice.of("tool_error_loop"))

    def _take_pre_tool_text(self) -> str:
        text, self._pre_tool_text = self._pre_tool_text, ""
        return text

    def on_restart_requested(self, payload: Any = None) -> None:
        """No ordinary history entry for the restart call (R1); with drafting on, the review
        log keeps the call and its result (R10)."""
        current = self._current_call
        assert current is not None and isinstance(payload, tuple)
        result, restart = payload
        self._restart = restart
        self._restart_call = current.call
        self._current_call = None
        self._tool_deadline = None
        self._calls.clear()
        pre_tool_text = self._take_pre_tool_text()
        if self.config.drafting:
            self.review_log.append({"call": current.call.name,
                                    "arguments": current.call.arguments,
                                    "result": _without_stash_key(result.for_model()),
                                    "pre_tool_text": pre_tool_text})
        elif pre_tool_text:
            self.turn_notices.append(already_sent_notice(pre_tool_text))

    def on_restart(self, payload: Any = None) -> None:
        """Apply the enrichment, set its flag, reset the error counters (R6-R9)."""
        restart = self._restart
        assert restart is not None
        if restart.kind == "message_metadata":
            items, lookups = payload if isinstance(payload, tuple) else (None, 0)
            self.reactor_lookups += lookups
            if items is not None:
                self.context_items = items
            self.context_items.append(tail_directive(METADATA_TAIL_DIRECTIVE))
            self.context_items_added += 1
        elif payload is not None:
            self.context_items.append(payload)
            self.context_items_added += 1
        if restart.enrichment is not None:
            self.flags.disable(restart.enrichment)
        self.consecutive_tool_errors = 0
        if self.config.drafting and self._restart_call is not None:
            self.review_log.append({"continuation": f"[System: {self._restart_call.name} "
                                                    "added context; continue the reply.]"})
        self._restart = None
        self._restart_call = None
        self._restart_task = None
        self._restart_deadline = None

    def on_kill(self, _payload: Any = None) -> None:
        current = self._current_call
        if current is not None and self._tool_task is not None and self.recorder is not None:
            self.recorder.on_tool(current.call.name, self._now() - current.started_at,
                                  {"hang": True})
        self._stop(include_landed=False)

    def _stop(self, include_landed: bool) -> None:
        self.status = "stopped_by_user"
        self._close_pass("stopped_by_user", include_landed)

    def on_crash(self, payload: Any = None) -> None:
        self.status = "error"
        if isinstance(payload, (ev.StreamCrashed, ev.WorkerCrashed)) and self.error is None:
            self.error = f"{type(payload.error).__name__}: {payload.error}"
        self._close_pass("error", include_landed=False)

    # ----------------------------------------------------------------- passes

    def _close_pass(self, status: TurnStatus, include_landed: bool) -> None:
        """Freeze the running pass's result, once (S13)."""
        run = self._run
        if run is None or run.closed:
            return
        run.closed = True
        result = run.result(status, include_landed)
        self._passes[-1] = result
        self._final_text = result.text
        self._delivered.append(result.text)
        self._end_pass()

    def _end_pass(self) -> None:
        """However the pass ends: timer cleared, kill handle deregistered, the stream
        aborted if still running — the abort is also what removes the worker's progress
        hook, so no late chunk re-arms a timer or touches the lock (S14)."""
        run = self._run
        if run is None:
            return
        run.deadline = None
        if run.kill_handle is not None:
            self.locks.clear_stream_kill(self.lock, run.kill_handle)
            run.kill_handle = None
        self._settle_deadline = None
        run.abort.fire("pass ended")
        worker = run.worker
        if worker is not None and not worker.done():
            worker.cancel()

    def _discard_unsent(self) -> None:
        """The pass was cut short: the channel drops what it has not sent (G1, S10)."""
        try:
            self.channel.discard_unsent()
        except Exception as exc:
            log.warning("turn %s: the channel could not drop unsent text: %s",
                        self.turn_id, type(exc).__name__)

    # ----------------------------------------------------------------- tools

    async def _dispatch_next_call(self) -> None:
        """Run the next queued call, or refuse it without running (T2, T4, R8)."""
        call = self._calls.popleft()
        pending = _PendingCall(no=next(self._call_seq), call=call, started_at=self._now())
        self._current_call = pending
        if not call.name:
            await self._fire("nameless_call")
            return
        refusal = self._refusal(call)
        if refusal is not None:
            await self._on_tool_result(pending, ToolResult.fail(refusal))
            return
        tool = self.tools.get(call.name)
        assert tool is not None
        args = self.tools.parse_args(tool, call.arguments)
        if isinstance(args, str):
            if self.recorder is not None:
                self.recorder.on_tool(call.name, 0.0, {"refused": args})
            await self._on_tool_result(pending, ToolResult.fail(args))
            return
        abort = AbortSignal()
        self._tool_abort = abort
        self._tool_deadline = pending.started_at + self.config.tool_timeout_s
        ctx = ToolContext(channel=self.channel, flags=self.flags, abort=abort, stash=self.stash,
                          turn_id=self.turn_id, context_items=self.context_items)
        self._tool_task = _spawn(self._tool_worker(pending, tool.run, args, ctx),
                                 f"{self.turn_id}-tool-{pending.no}")

    def _refusal(self, call: ToolCallRequest) -> str | None:
        if call.truncated:
            return (f"the arguments of {call.name} were cut off by the provider (output limit "
                    "reached), so the call was not run; call it again with complete arguments")
        return self.tools.refusal(call.name, self.flags)

    async def _tool_worker(
        self,
        pending: _PendingCall,
        run: Callable[[Any, ToolContext], Coroutine[Any, Any, ToolResult]],
        args: Any,
        ctx: ToolContext,
    ) -> None:
        """Run one tool under the watchdog; its exceptions become failed results."""
        name = pending.call.name
        try:
            with self.locks.watchdog(self.lock):
                result = await run(args, ctx)
            if not isinstance(result, ToolResult):
                result = ToolResult.fail(f"{name} returned {type(result).__name__}, "
                                         "not a tool result")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("tool %s raised %s", name, type(exc).__name__)
            result = ToolResult.fail(f"{name} failed: {type(exc).__name__}: {exc}")
            if self.recorder is not None:
                self.recorder.on_tool(name, self._now() - pending.started_at,
                                      {"raise": str(exc)})
        else:
            if self.recorder is not None:
                self.recorder.on_tool(name, self._now() - pending.started_at,
                                      _recorded_outcome(result))
        self.tools.remember(name, result)
        self.mailbox.post(ev.ToolFinished(pending.no, result))

    async def _on_tool_result(self, pending: _PendingCall, result: ToolResult) -> None:
        self._tool_abort = None
        restart = parse_restart(pending.call.name, result.data) if result.success else None
        if restart is not None:
            await self._fire("restart_requested", (result, restart))
        else:
            await self._fire("tool_result", result)

    async def _tool_timed_out(self, deadline: float) -> None:
        """The tool's own timeout: a failed result the model sees (T5)."""
        current = self._current_call
        assert current is not None
        task, self._tool_task = self._tool_task, None
        if self._tool_abort is not None:
            self._tool_abort.fire("timeout")
            self._tool_abort = None
        if task is not None:
            task.cancel()
            self._abandoned.append(task)
        if self.recorder is not None:
            self.recorder.on_tool(current.call.name, deadline - current.started_at,
                                  {"hang": True})
        result = ToolResult.fail(
            f"{current.call.name} timed out after {self.config.tool_timeout_s:g} s")
        await self._fire("tool_timeout", result, at=deadline)

    # ----------------------------------------------------------------- restarts

    async def _begin_restart(self) -> None:
        restart = self._restart
        assert restart is not None
        self._restart_no = next(self._restart_seq)
        if restart.kind == "message_metadata":
            self._restart_deadline = self._now() + self.config.tool_timeout_s
            self._lookups = LookupProgress()
            self._restart_task = _spawn(self._metadata_worker(self._restart_no, self._lookups),
                                        f"{self.turn_id}-metadata")
            return
        item = resolve_item(restart, self.stash)
        self._restart_task = None
        await self._fire("restart", item)

    async def _restart_timed_out(self, deadline: float) -> None:
        """Reactor look-ups that never answer do not hold the turn: past the tool budget
        the reveal goes on with the names found so far and reaction counts for the rest,
        the calls made counted (R6)."""
        task, self._restart_task = self._restart_task, None
        if task is not None:
            task.cancel()
            self._abandoned.append(task)
        log.warning("turn %s: reactor look-ups timed out; revealing with what was found",
                    self.turn_id)
        found = self._lookups
        items = annotate(self.context_items, found.reactors, self.config.metadata_recent_messages)
        await self._fire("restart", (items, found.lookups), at=deadline)

    async def _metadata_worker(self, restart_no: int, progress: LookupProgress) -> None:
        """Reactor look-ups (sequential REST calls, bounded) and the annotated items (R6)."""
        cfg = self.config
        budget = LookupBudget(per_turn=cfg.reactor_lookups_per_turn,
                              per_message=cfg.reactor_lookups_per_message,
                              per_reaction=cfg.reactors_per_reaction)
        try:
            reactors, lookups = await fetch_reactors(self.context_items, self.channel, budget,
                                                     cfg.metadata_recent_messages, progress)
            items = annotate(self.context_items, reactors, cfg.metadata_recent_messages)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.mailbox.post(ev.WorkerCrashed(exc))
            return
        self.mailbox.post(ev.RestartReady(restart_no, (items, lookups)))

    # ----------------------------------------------------------------- cleanup

    async def _cleanup(self) -> None:
        """No worker, timer, kill handle or progress callback outlives the turn (S14), and a
        pass cut short leaves no unsent text in the channel for a fallback to send (G1)."""
        self._end_pass()
        if self._run is not None and not self._run.flushed:
            self._discard_unsent()
        tasks = [t for t in (self._tool_task, self._restart_task) if t is not None]
        tasks += self._abandoned
        if self._run is not None and self._run.worker is not None:
            tasks.append(self._run.worker)
        if self._tool_abort is not None:
            self._tool_abort.fire("turn ended")
        for task in tasks:
            if not task.done():
                task.cancel()
        pending = [t for t in tasks if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=self.config.settle_timeout_s or 1.0)
            for task in still:
                log.warning("turn %s: worker %s ignores cancellation; abandoned",
                            self.turn_id, task.get_name())
        self._tool_task = None
        self._restart_task = None
        self._tool_deadline = None
        self.locks.clear_stream_kill(self.lock)
        if self.lock.turn_kill == self.request_stop:
            self.lock.turn_kill = None
        self.mailbox.clear()


def _channel_delivered(channel: TurnChannel) -> str | None:
    """The channel's record of the text it actually delivered, if it keeps one."""
    text = getattr(channel, "delivered_text", None)
    return text if isinstance(text, str) else None


def _without_stash_key(result: dict[str, Any]) -> dict[str, Any]:
    """A result as the review log keeps it: the live stash key is a one-time random token
    that means nothing once drained (R4), so it is not kept."""
    data = result.get("data")
    if isinstance(data, dict) and "pending_context_key" in data:
        return {**result, "data": {**data, "pending_context_key": "<stashed>"}}
    return result


def already_sent_notice(text: str) -> str:
    """Visible text streamed before a restart call, which has no history entry to carry it
    (R10, drafting off): the next passes are told it was sent, so it is not repeated (T7)."""
    return f"[System: this reply already began with the text below; continue it without " \
           f"repeating it.]\n{neutralize(text)}"


def _recorded_outcome(result: ToolResult) -> dict[str, Any]:
    if result.success:
        return {"success": True, "data": result.data}
    return {"success": False, "error": result.error}
