"""A turn: the driver task that alone fires the machine's triggers.

Workers (the provider stream, a tool, a restart's look-ups) post events to the turn's
mailbox; timers are deadlines the driver waits on; a kill sets a flag, aborts the workers and
jumps the mailbox. Callbacks run by the machine are short and synchronous: anything that
must be awaited (notices, look-ups) happens in the driver or a worker, never in a callback.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Protocol

from . import events as ev
from .channel import Notice, NoticeKind, TurnChannel
from .clock import on_grid
from .config import TurnConfig
from .details import details_suffix
from .failures import turn_failure
from .flags import TurnFlags
from .locks import ChannelLock, ChannelLockRegistry
from .machine import shared_machine
from .mailbox import Mailbox
from .metadata import tail_directive
from .pass_run import PassRun
from .prefill import TurnRequest, build_pass_request
from .provider import CUT_OFF_FINISHES, AbortSignal, HistoryEntry, PassRequest, Provider
from .recording import InputRecorder
from .restart import METADATA_TAIL_DIRECTIVE, RestartRequest
from .restart_runner import RestartRunner, already_sent_notice, without_stash_key
from .result import PassResult, TurnResult, TurnStatus
from .stash import ContextStash
from .stream_pass import stream_worker
from .table import CRASH_SOURCES, STREAM_STATES, TERMINAL, State
from .tasks import Workers
from .tool_runner import ToolRunner, Verdict
from .tools import ToolRegistry, ToolResult

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
        self._recorder = recorder
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
        self.stop_requested_at: float | None = None
        """Seconds into the turn a stop was asked for: where kill latency counts from."""
        self.transitions: list[dict[str, Any]] = []
        self.internal_transitions: list[dict[str, Any]] = []
        self.state = State.PREPARING.value

        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0
        self._logical = 0.0
        """The driver's clock: when the input it is acting on arrived (journal replay)."""
        self._stop_at = 0.0
        self._event_time: float | None = None
        self._outbox: list[Notice] = []
        self._passes: list[PassResult] = []
        self._run: PassRun | None = None
        self._final_text = ""
        self._delivered: list[str] = []
        self._channel_mark = 0
        self._settle_deadline: float | None = None
        self._timeout_phase = "first_token"
        self._still_working_sent = False
        self._crash: BaseException | None = None
        self._batch_text = ""
        """The visible text of the pass whose tool calls run now (T9)."""
        self._end_requested = False
        """A call of this batch declared that its success ends the turn (T9)."""
        self._follow_up_required = False
        """A call of the last batch declared that the model must speak after it (T10)."""
        self._workers = Workers(grace_s=self.config.settle_timeout_s or 1.0,
                                on_crash=self._worker_crashed)
        self._tools = ToolRunner(tools=self.tools, config=self.config, locks=locks, lock=lock,
                                 mailbox=self.mailbox, recorder=recorder,
                                 turn_id=self.turn_id, clock=self._now,
                                 spawn=self._workers.spawn)
        self._restarts = RestartRunner(config=self.config, channel=channel,
                                       mailbox=self.mailbox, turn_id=self.turn_id,
                                       clock=self._now, locks=locks, lock=lock,
                                       spawn=self._workers.spawn)
        self._restarts.recorder = recorder

    # ----------------------------------------------------------------- public API

    async def run(self) -> TurnResult:
        """Drive the turn to its terminal state; always cleans up, whatever happens. The
        turn's task group owns every worker: when it closes, none is left running (S14)."""
        self._loop = asyncio.get_running_loop()
        self._t0 = self._logical = on_grid(self._loop.time())
        self.lock.turn_kill = self.request_stop
        self._channel_mark = len(_channel_delivered(self.channel) or "")
        try:
            await self._workers.own(self._drive)
        finally:
            self.locks.clear_stream_kill(self.lock)
            if self.lock.turn_kill == self.request_stop:
                self.lock.turn_kill = None
            self.mailbox.clear()
        return self.result()

    def request_stop(self, reason: str = "kill") -> None:
        """`/kill`: honoured at once in every non-terminal state (S7, S16)."""
        if self.stop_requested or self.state in _TERMINAL_NAMES:
            return
        self.stop_requested = True
        self.stop_requested_at = self.elapsed
        if reason == "stale_lock":  # the sweeper gave up on the turn: not the user's /kill
            self.error = "the channel lock was released as stale"
        self._stop_at = self._arrival()
        if self.recorder is not None and self._loop is not None:
            self.recorder.on_event(self._stop_at - self._t0, {"kill": True})
        run = self._run
        if run is not None:
            run.abort.fire("kill")
        self._tools.abort("kill")
        self.mailbox.post_urgent(ev.Kill(reason), self._stop_at)

    def notify_follow_up(self) -> None:
        """A new message from the same user arrived in the channel (S17, T3)."""
        if self.state in _TERMINAL_NAMES:
            return
        at = self._arrival()
        if self.recorder is not None and self._loop is not None:
            self.recorder.on_event(at - self._t0, {"follow_up": True})
        self.mailbox.post(ev.FollowUp(), at)

    def _arrival(self) -> float:
        """An outside input's arrival on the engine's clock (the grid of `clock.on_grid`)."""
        return on_grid(self._loop.time()) if self._loop is not None else self._t0

    @property
    def recorder(self) -> InputRecorder | None:
        """What records this turn's inputs; may be attached after construction (a
        generation turn attaches one per attempt), so the tool runner follows it."""
        return self._recorder

    @recorder.setter
    def recorder(self, value: InputRecorder | None) -> None:
        self._recorder = value
        self._tools.recorder = value
        self._restarts.recorder = value

    @property
    def pass_results(self) -> tuple[PassResult, ...]:
        """The passes so far; a pass's result is final once the pass has ended (what an
        observer reads at the transition that ends it)."""
        return tuple(self._passes)

    @property
    def elapsed(self) -> float:
        return (self._loop.time() if self._loop else 0.0) - self._t0

    def result(self) -> TurnResult:
        status: TurnStatus = self.status or "error"
        last_error = self._passes[-1].error if self._passes else None
        return TurnResult(
            status=status,
            state=self.state,
            text=self._final_text + details_suffix([p.details for p in self._passes]),
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
            failure=turn_failure(status, last_error, self._crash),
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
        try:
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
        finally:
            self._close()

    def _worker_crashed(self, exc: BaseException) -> None:
        self.mailbox.post(ev.WorkerCrashed(exc))

    async def _step(self) -> None:
        state = self.state
        if self.stop_requested:
            if self.mailbox.arrived_before(self._stop_at):
                # What arrived before the kill happened before it (a chunk in the same
                # read as the one the user reacted to): handled first, as in replay.
                earlier = self.mailbox.take_earliest()
                self._logical = self.mailbox.received_at
                await self._on_event(earlier)
                return
            self._logical = max(self._logical, self._stop_at)
            await self._fire("kill", ev.Kill("stop requested"))
            return
        if state == State.PREPARING.value:
            if self.lock.stop_requested:
                if self.recorder is not None:  # asked for before this turn began
                    self.recorder.on_event(self._logical - self._t0,
                                           {"kill": True, "before_start": True})
                await self._fire("kill", ev.Kill("stop requested on the channel"))
            elif len(self._passes) >= self.config.max_iterations:
                await self._fire("iteration_cap")
            elif await self._fire("begin", self._prepare_request()):
                # Let the pass's worker call the provider before the mailbox is read again:
                # a pass that began has asked the model, even when a kill or follow-up is
                # already waiting at the same instant (S3, S17).
                await asyncio.sleep(0)
            return
        if state == State.TOOL_CALL.value and self._tools.current is None:
            await self._fire_verdict(self._tools.dispatch(self.channel, self.flags, self.stash,
                                                          self.context_items))
            return
        if state == State.CONTEXT_RESTART.value and not self._restarts.started:
            await self._fire_verdict(self._restarts.begin(self.context_items, self.stash))
            return
        deadline = self._deadline()
        event = await self.mailbox.get(deadline)
        arrived = self.mailbox.received_at
        if event is not None and deadline is not None and arrived > on_grid(deadline):
            # It arrived after the deadline (the driver was busy): the deadline comes
            # first, as it does when the journal replays on its recorded clock.
            self.mailbox.put_back(event, arrived)
            event = None
        if event is None:
            await self._on_deadline(deadline)
        else:
            self._logical = arrived
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
            return self._tools.deadline
        if state == State.CONTEXT_RESTART.value:
            return self._restarts.deadline
        return None

    async def _fire_verdict(self, verdict: Verdict | None) -> None:
        """Fire what a runner decided, if it decided anything yet. A tool result first
        offers the turn's end to the tool's loop policy (T9)."""
        if verdict is None:
            return
        trigger, payload = verdict
        if trigger == "tool_result" and await self._fire("tool_ended_turn", payload):
            return
        await self._fire(trigger, payload)

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
        """The driver's clock: the arrival of the input being handled (or the deadline
        that fired), never the moment the driver got to it — so a transition's time, a
        pass's start and a tool's budget are the same when the journal replays."""
        assert self._loop is not None
        return self._logical

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
        deadline = self._logical = on_grid(deadline)
        state = self.state
        if state == State.AWAITING_FIRST_TOKEN.value:
            await self._fire("first_token_timeout", at=deadline)
        elif state == State.STREAMING.value:
            await self._fire("idle_timeout", at=deadline)
        elif state == State.SETTLING.value:
            await self._fire("settle_timeout", at=deadline)
        elif state == State.TOOL_CALL.value:
            await self._fire("tool_timeout", self._tools.timed_out(deadline), at=deadline)
        elif state == State.CONTEXT_RESTART.value:
            await self._fire("restart", self._restarts.timed_out(self.context_items),
                             at=deadline)

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
                if event.outcome == "empty" and await self._fire("empty_after_text", event):
                    return
                await self._fire(event.outcome, event)
        elif isinstance(event, ev.StreamCrashed):
            if run is not None and event.pass_no == run.no and self.state in _STREAM_STATES:
                self.error = f"{type(event.error).__name__}: {event.error}"
                await self._fire("crash", event)
        elif isinstance(event, ev.StreamSettled):
            if run is not None and event.pass_no == run.no and self.state == "Settling":
                await self._fire("settled", event)
        elif isinstance(event, ev.ToolFinished):
            await self._fire_verdict(self._tools.finished(event))
        elif isinstance(event, ev.RestartReady):
            if self._restarts.ready(event) and self.state == "ContextRestart":
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
        return self._tools.has_queued()

    def error_cap_reached(self, payload: Any = None) -> bool:
        failed = isinstance(payload, ToolResult) and not payload.success
        errors = self.consecutive_tool_errors + 1 if failed else 0
        return errors >= self.config.max_consecutive_tool_errors

    def delivered_text_stands(self, _payload: Any = None) -> bool:
        """An empty pass after a tool, in a turn that already delivered text, completes
        with that text, unless the tool required the model to speak after it or a limit
        cut the pass off (a model that spent its budget thinking has not answered, T10)."""
        run = self._run
        if run is not None and run.finish in CUT_OFF_FINISHES:
            return False
        return (len(self._passes) > 1 and not self._follow_up_required
                and bool(self._delivered_text().strip()))

    def tool_policy_ends_turn(self, payload: Any = None) -> bool:
        """The last call of the batch is done and a call of it declared that its success
        ends the turn: it delivered the reply itself, or visible text came before it (T9).
        A failure reaching the error cap ends it as that error instead (T6)."""
        if self.calls_pending() or self.error_cap_reached(payload):
            return False
        return self._end_requested or self._ends_turn(payload)

    def _ends_turn(self, payload: Any) -> bool:
        current = self._tools.current
        if not isinstance(payload, ToolResult) or not payload.success or current is None:
            return False
        tool = self.tools.get(current.call.name)
        policy = tool.loop if tool is not None else "next_pass"
        return policy == "ends_turn" or (policy == "end_after_pre_tool_text"
                                         and bool(self._batch_text.strip()))

    def _notify(self, kind: NoticeKind) -> None:
        """Queue a user-facing notice; with user errors off none is posted (G2)."""
        if self.config.surface_user_errors:
            self._outbox.append(Notice.of(kind))

    # ----------------------------------------------------------------- callbacks

    def on_iteration_cap(self, _payload: Any = None) -> None:
        self.status = "timeout"
        self._notify("max_iterations")

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
                      deadline=now + self.config.first_token_timeout_s,
                      chars_left=self.config.max_delivered_chars
                      - sum(len(p.text) for p in self._passes))
        run.kill_handle = run.abort.fire  # the pass's own slot: the turn's is request_stop
        self.locks.set_stream_kill(self.lock, run.kill_handle)
        self._run = run
        self._timeout_phase = "first_token"
        self._passes.append(PassResult(index=pass_no, status="function_call"))
        if pass_no - 1 == self.config.soft_warn_iteration and not self._still_working_sent:
            self._still_working_sent = True  # iteration index 20: before the 21st call (T1)
            self._notify("still_working")
        if self.recorder is not None:
            run.record_text = self.recorder.on_pass_start(pass_no)
        run.worker = self._workers.spawn(stream_worker(self, run),
                                         f"{self.turn_id}-pass-{pass_no}")

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

    def on_empty_after_text(self, _payload: Any = None) -> None:
        """The empty pass adds nothing: the turn is the text it already delivered (T10)."""
        self.status = "completed"
        self._close_pass("empty_response", include_landed=False)
        self._final_text = self._delivered_text()

    def on_delivery_cap(self, _payload: Any = None) -> None:
        """The reply reached its delivery bound: what was within it stays, the rest is never
        sent, and the user is told why the reply stops there (D5)."""
        self.status = "delivery_cap"
        self._notify("delivery_cap")
        self._close_pass("delivery_cap", include_landed=False)

    def on_tool_call(self, _payload: Any = None) -> None:
        """Keep the pre-tool text for the call's history entry (T7) and queue the calls."""
        run = self._run
        assert run is not None
        self._tools.queue(run.tool_calls, run.text)
        self._batch_text = run.text
        self._end_requested = False
        self._follow_up_required = False
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
        assert isinstance(payload, ToolResult)
        ends = self._ends_turn(payload)
        self._end_requested = self._end_requested or ends
        call = self._tools.settle_current().call
        tool = self.tools.get(call.name)
        if payload.success and tool is not None and tool.loop == "requires_follow_up":
            self._follow_up_required = True
        self.function_history.append(HistoryEntry(
            tool_name=call.name,
            arguments={} if call.truncated else call.arguments,  # never shown a call not made
            result=payload.for_model(),
            call_id=call.id, pre_tool_text=self._tools.take_pre_tool_text(),
            success=payload.success, batch=self._tools.batch, reasoning=call.reasoning,
        ))
        if payload.success:
            self.consecutive_tool_errors = 0
            self.replayable_calls.append({"name": call.name, "arguments": call.arguments,
                                          "result": payload.for_model()})
        else:
            self.consecutive_tool_errors += 1
        if self.state != State.DONE.value:
            return
        if self.consecutive_tool_errors >= self.config.max_consecutive_tool_errors:
            self.status = "error"
            self.error = f"{self.consecutive_tool_errors} consecutive tool failures"
            self._notify("tool_error_loop")
        else:
            self.status = "completed"  # the tool's loop policy ended the turn (T9)

    def on_restart_requested(self, payload: Any = None) -> None:
        """No ordinary history entry for the restart call (R1): its pre-tool text is named to
        the next passes, so it is not repeated (T7); with drafting on, the review log also
        keeps the call and its result (R10)."""
        assert isinstance(payload, tuple)
        result, restart = payload
        call = self._tools.settle_current().call
        self._tools.drop_queued()
        self._restarts.requested(restart, call)
        pre_tool_text = self._tools.take_pre_tool_text()
        if self.config.drafting:
            self.review_log.append({"call": call.name,
                                    "arguments": call.arguments,
                                    "result": without_stash_key(result.for_model()),
                                    "pre_tool_text": pre_tool_text})
        if pre_tool_text:
            self.turn_notices.append(already_sent_notice(pre_tool_text))

    def on_restart(self, payload: Any = None) -> None:
        """Apply the enrichment, set its flag, reset the error counters (R6-R9)."""
        restart: RestartRequest | None = self._restarts.pending
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
        call = self._restarts.call
        if self.config.drafting and call is not None:
            self.review_log.append({"continuation": f"[System: {call.name} "
                                                    "added context; continue the reply.]"})
        self._restarts.applied()

    def on_kill(self, _payload: Any = None) -> None:
        self._tools.record_killed()
        self._stop(include_landed=False)

    def _stop(self, include_landed: bool) -> None:
        self.status = "stopped_by_user"
        self._close_pass("stopped_by_user", include_landed)

    def on_crash(self, payload: Any = None) -> None:
        self.status = "error"
        if isinstance(payload, (ev.StreamCrashed, ev.WorkerCrashed)):
            self._crash = payload.error
            if self.error is None:
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

    # ----------------------------------------------------------------- the end

    def _close(self) -> None:
        """No timer, kill handle or progress callback outlives the turn (S14; the task group
        then cancels and awaits the workers), and a pass cut short leaves no unsent text in
        the channel for a fallback to send (G1)."""
        self._end_pass()
        if self._run is not None and not self._run.flushed:
            self._discard_unsent()
        self._tools.end()


def _channel_delivered(channel: TurnChannel) -> str | None:
    """The channel's record of the text it actually delivered, if it keeps one."""
    text = getattr(channel, "delivered_text", None)
    return text if isinstance(text, str) else None
