"""A turn: the driver task that alone fires the machine's triggers.

The driver keeps the state, waits on the runners' deadlines and reads the mailbox. Workers
(the provider stream, a tool, a restart's look-ups) belong to the runners beside it
(`PassRunner`, `ToolRunner`, `RestartRunner`), which own their state and post events to the
mailbox; what the turn reports is kept in its `TurnLedger`, what the next pass is built from
in its `Conversation`. A kill sets a flag, aborts the workers and jumps the mailbox.
Callbacks (named in the table's rows) are short and synchronous: anything that must be
awaited (notices, look-ups) happens in the driver or a worker, never in a callback.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Any, ClassVar, Protocol

from transitions.extensions.asyncio import AsyncMachine

from . import events as ev
from .channel import NoticeKind, TurnChannel
from .clock import TurnClock, on_grid
from .config import TurnConfig
from .conversation import Conversation
from .ledger import TurnLedger, channel_delivered
from .locks import ChannelLock, ChannelLockRegistry
from .machine import build_machine
from .mailbox import Mailbox
from .pass_runner import PassRunner
from .prefill import TurnRequest
from .provider import CUT_OFF_FINISHES, PassRequest, Provider
from .recording import InputRecorder
from .restart_runner import RestartRunner
from .result import PassResult, TurnResult, TurnStatus
from .stash import ContextStash
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
_DEADLINE_TRIGGERS: dict[str, str] = {
    State.AWAITING_FIRST_TOKEN.value: "first_token_timeout",
    State.STREAMING.value: "idle_timeout",
    State.SETTLING.value: "settle_timeout",
    State.TOOL_CALL.value: "tool_timeout",
    State.CONTEXT_RESTART.value: "restart",
}
"""What the clock reaching the deadline of a state fires."""


class TurnObserver(Protocol):
    """Sees every transition as it happens (the demo's printer, the journal)."""

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None: ...


class Turn:
    """One bot reply in one channel, from Preparing to exactly one terminal state."""

    state: str
    _EVENTS: ClassVar[dict[type, Callable[[Turn, Any], Awaitable[None]]]]
    """What the driver does with each kind of mailbox event (filled in below the class)."""

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
        self.channel = channel
        self.locks = locks
        self.lock = lock
        self.config = config if config is not None else TurnConfig()
        self.stash = stash if stash is not None else ContextStash(
            ttl_s=self.config.stash_ttl_s, max_items=self.config.stash_max_items,
            max_bytes=self.config.stash_max_bytes,
        )
        self.observer = observer
        self.mailbox: Mailbox[ev.TurnEvent] = Mailbox()
        self.state = State.PREPARING.value
        self.ledger = TurnLedger()
        self.conversation = Conversation.of(request if request is not None else TurnRequest())
        self._clock = TurnClock()
        workers = self._workers = Workers(grace_s=self.config.settle_timeout_s or 1.0,
                                          on_crash=self._worker_crashed)
        runner: dict[str, Any] = {"config": self.config, "locks": locks, "lock": lock,
                                  "mailbox": self.mailbox, "turn_id": self.turn_id,
                                  "spawn": workers.spawn}
        self._passes = PassRunner(provider=provider, channel=channel, **runner)
        self._tools = ToolRunner(tools=tools if tools is not None else ToolRegistry(),
                                 recorder=None, clock=self._now, **runner)
        self._restarts = RestartRunner(channel=channel, clock=self._now, **runner)
        self._passes.recorder = self._tools.recorder = self._restarts.recorder = recorder

    # ----------------------------------------------------------------- public API

    async def run(self) -> TurnResult:
        """Drive the turn to its terminal state; always cleans up, whatever happens. The
        turn's task group owns every worker: when it closes, none is left running (S14)."""
        self._clock.start()
        self.lock.turn_kill = self.request_stop
        self.ledger.channel_mark = len(channel_delivered(self.channel) or "")
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
        self.ledger.stop_requested_at = self.elapsed
        if reason == "stale_lock":  # the sweeper gave up on the turn: not the user's /kill
            self.ledger.error = "the channel lock was released as stale"
        clock = self._clock
        clock.stop_at = clock.arrival()
        if self.recorder is not None and clock.started:
            self.recorder.on_event(clock.stop_at - clock.t0, {"kill": True})
        self._passes.abort("kill")
        self._tools.abort("kill")
        self.mailbox.post_urgent(ev.Kill(reason), clock.stop_at)

    def notify_follow_up(self) -> None:
        """A new message from the same user arrived in the channel (S17, T3)."""
        if self.state in _TERMINAL_NAMES:
            return
        at = self._clock.arrival()
        if self.recorder is not None and self._clock.started:
            self.recorder.on_event(at - self._clock.t0, {"follow_up": True})
        self.mailbox.post(ev.FollowUp(), at)

    @property
    def recorder(self) -> InputRecorder | None:
        """What records this turn's inputs; may be attached after construction (a
        generation turn attaches one per attempt), so the runners follow it."""
        return self._passes.recorder

    @recorder.setter
    def recorder(self, value: InputRecorder | None) -> None:
        self._passes.recorder = self._tools.recorder = self._restarts.recorder = value

    provider = property(lambda self: self._passes.provider, doc="The model this turn calls.")
    tools = property(lambda self: self._tools.registry, doc="The tools the model may call.")
    request = property(lambda self: self.conversation.request)
    flags = property(lambda self: self.conversation.flags)
    function_history = property(lambda self: self.conversation.function_history)
    replayable_calls = property(lambda self: self._tools.replayable_calls)
    transitions = property(lambda self: self.ledger.transitions)
    internal_transitions = property(lambda self: self.ledger.internal_transitions)
    status = property(lambda self: self.ledger.status)
    error = property(lambda self: self.ledger.error)
    metrics = property(lambda self: self.ledger.metrics)
    follow_up_queued = property(lambda self: self.ledger.follow_up_queued)
    stop_requested_at = property(lambda self: self.ledger.stop_requested_at,
                                 doc="Seconds into the turn a stop was asked for.")

    @property
    def stop_requested(self) -> bool:
        return self.ledger.stop_requested_at is not None

    @property
    def pass_results(self) -> tuple[PassResult, ...]:
        """The passes so far; a pass's result is final once the pass has ended (what an
        observer reads at the transition that ends it)."""
        return tuple(self.ledger.passes)

    elapsed = property(lambda self: self._clock.elapsed, doc="Seconds since the turn began.")

    def result(self) -> TurnResult:
        conversation, restarts = self.conversation, self._restarts
        return self.ledger.result(
            self.state, self.channel, owner=conversation.request.owner,
            flags=conversation.flags.as_dict(),
            function_history=[entry.tool_name for entry in conversation.function_history],
            consecutive_tool_errors=self._tools.consecutive_errors,
            context_items_added=restarts.context_items_added,
            reactor_lookups=restarts.reactor_lookups, stash_items=self.stash.live_count())

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
            self._passes.finish()  # the task group then cancels and awaits the workers
            self._tools.end()

    async def _step(self) -> None:
        state, clock = self.state, self._clock
        if self.stop_requested:
            if self.mailbox.arrived_before(clock.stop_at):
                # What arrived before the kill happened before it (a chunk in the same
                # read as the one the user reacted to): handled first, as in replay.
                earlier = self.mailbox.take_earliest()
                clock.logical = self.mailbox.received_at
                await self._on_event(earlier)
                return
            clock.logical = max(clock.logical, clock.stop_at)
            await self._fire("kill", ev.Kill("stop requested"))
            return
        if state == State.PREPARING.value:
            await self._prepare()
            return
        if state == State.TOOL_CALL.value and self._tools.current is None:
            conversation = self.conversation
            await self._fire_verdict(self._tools.dispatch(
                self.channel, conversation.flags, self.stash, conversation.context_items))
            return
        if state == State.CONTEXT_RESTART.value and not self._restarts.started:
            await self._fire_verdict(self._restarts.begin(self.conversation.context_items,
                                                          self.stash))
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
            clock.logical = arrived
            await self._on_event(event)

    async def _prepare(self) -> None:
        if self.lock.stop_requested:
            if self.recorder is not None:  # asked for before this turn began
                self.recorder.on_event(self._clock.logical - self._clock.t0,
                                       {"kill": True, "before_start": True})
            await self._fire("kill", ev.Kill("stop requested on the channel"))
        elif len(self.ledger.passes) >= self.config.max_iterations:
            await self._fire("iteration_cap")
        elif await self._fire("begin", self._next_request()):
            # Let the pass's worker call the provider before the mailbox is read again:
            # a pass that began has asked the model, even when a kill or follow-up is
            # already waiting at the same instant (S3, S17).
            await asyncio.sleep(0)

    def _next_request(self) -> PassRequest:
        """Preparing's work: the next pass's request, with the tools the flags allow (S1,
        S2, R8). Done before `begin` so a failure here is a crash from Preparing."""
        conversation = self.conversation
        return conversation.next_request(self.tools.schemas(conversation.flags),
                                         len(self.ledger.passes) + 1)

    async def _fail(self, exc: BaseException) -> None:
        """An unexpected exception ends the turn Done/error; cleanup still runs (S15)."""
        self.ledger.error = f"{type(exc).__name__}: {exc}"
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
        self.ledger.status = "error"
        self._record(self.elapsed, "crash", self.state, State.DONE.value)
        self.state = State.DONE.value

    def _worker_crashed(self, exc: BaseException) -> None:
        self.mailbox.post(ev.WorkerCrashed(exc))

    def _deadline(self) -> float | None:
        state = self.state
        if state in _PASS_STATES:
            return self._passes.deadline
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
        try:
            taken = bool(await shared_machine().events[trigger].trigger(self, payload))
        except Exception:
            if self.state != source:  # a callback failed after the state changed
                self._record((at if at is not None else self._now()) - self._clock.t0,
                             trigger, source, self.state)
            raise
        dest = self.state
        if not taken:
            return False
        t = (at if at is not None else self._now()) - self._clock.t0
        if dest == source:
            self.ledger.record_internal(t, trigger, source)
        else:
            self._record(t, trigger, source, dest)
            if source in _PASS_STATES and dest not in _PASS_STATES:
                self._passes.end()
        await self.ledger.post_notices(self.channel, self.turn_id)
        return taken

    def _now(self) -> float:
        return self._clock.now()

    def _record(self, t: float, trigger: str, source: str, dest: str) -> None:
        t = self.ledger.record(t, trigger, source, dest)
        if self.observer is not None:
            self.observer.on_transition(self, t, trigger, source, dest)

    async def _on_deadline(self, waited: float | None) -> None:
        """The clock reached `waited`. Compared with the deadline waited for, not with the
        clock, so a deadline a rounding error past the loop's clock still fires."""
        deadline = self._deadline()
        if deadline is None or waited is None or deadline > waited:
            return  # the rolling deadline moved on: wait again (S5)
        deadline = self._clock.logical = on_grid(deadline)
        trigger = _DEADLINE_TRIGGERS[self.state]
        payload: Any = None
        if trigger == "tool_timeout":
            payload = self._tools.timed_out(deadline)
        elif trigger == "restart":
            payload = self._restarts.timed_out(self.conversation.context_items)
        await self._fire(trigger, payload, at=deadline)

    async def _on_event(self, event: ev.TurnEvent) -> None:
        await self._EVENTS[type(event)](self, event)

    async def _on_stream_event(self, event: ev.StreamEnded | ev.StreamCrashed) -> None:
        if not self._passes.is_current(event.pass_no):
            return
        if self.state == State.SETTLING.value:
            await self._fire("settled", event)  # it ended as its timer fired: it has settled
        elif self.state not in _STREAM_STATES:
            return
        elif isinstance(event, ev.StreamCrashed):
            self.ledger.error = f"{type(event.error).__name__}: {event.error}"
            await self._fire("crash", event)
        elif event.outcome != "empty" or not await self._fire("empty_after_text", event):
            await self._fire(event.outcome, event)

    async def _on_first_token_event(self, event: ev.FirstToken) -> None:
        if self._passes.is_current(event.pass_no) and self.state == "AwaitingFirstToken":
            await self._fire("first_token", event)

    async def _on_settled_event(self, event: ev.StreamSettled) -> None:
        if self._passes.is_current(event.pass_no) and self.state == "Settling":
            await self._fire("settled", event)

    async def _on_restart_ready(self, event: ev.RestartReady) -> None:
        if self._restarts.ready(event) and self.state == "ContextRestart":
            await self._fire("restart", event.payload)

    # ----------------------------------------------------------------- guards

    def stop_pending(self, _payload: Any = None) -> bool:
        """A stop was requested for this turn or on its channel (S9)."""
        return self.stop_requested or self.lock.stop_requested

    def follow_up_may_interrupt(self, _payload: Any = None) -> bool:
        return self.lock.follow_up_interrupts < self.locks.max_follow_up_interrupts

    def calls_pending(self, _payload: Any = None) -> bool:
        return self._tools.has_queued()

    def error_cap_reached(self, payload: Any = None) -> bool:
        return self._tools.error_cap_reached(payload)

    def tool_policy_ends_turn(self, payload: Any = None) -> bool:
        return self._tools.policy_ends_turn(payload)

    def delivered_text_stands(self, _payload: Any = None) -> bool:
        """An empty pass after a tool, in a turn that already delivered text, completes
        with that text, unless the tool required the model to speak after it or a limit
        cut the pass off (a model that spent its budget thinking has not answered, T10)."""
        run = self._passes.run
        if run is not None and run.finish in CUT_OFF_FINISHES:
            return False
        return (len(self.ledger.passes) > 1 and not self._tools.follow_up_required
                and bool(self.ledger.delivered_text(self.channel).strip()))

    # ----------------------------------------------------------------- callbacks
    # Each is named in its rows of the table, whose `does` says what it does and why.

    def on_begin(self, payload: Any = None) -> None:
        assert isinstance(payload, PassRequest)
        chars_left = self.ledger.begin_pass(payload.pass_index, self.config)
        self._passes.begin(payload, self._now(), chars_left)

    def on_first_token(self, _payload: Any = None) -> None:
        self._passes.first_token()

    def on_stream_timeout(self, _payload: Any = None) -> None:
        if self.state == State.STOPPED.value:  # a stop was pending (S9)
            self._end("stopped_by_user")
        else:
            self._passes.timed_out(self._now())  # the deadline's instant (`_on_deadline`)

    def on_settled(self, _payload: Any = None) -> None:
        self.ledger.timeout(self._passes.timeout_phase, self.config)
        self._end("timeout", include_landed=True)

    def on_settle_timeout(self, _payload: Any = None) -> None:
        self._passes.record_stall()
        self.ledger.timeout(self._passes.timeout_phase, self.config)
        self._end("timeout")

    def on_stream_end(self, payload: Any = None) -> None:
        assert isinstance(payload, ev.StreamEnded)
        if payload.error is not None:
            self.ledger.error = f"{payload.error.kind}: {payload.error.message}"
        self._end(_STATUS_BY_OUTCOME[payload.outcome])

    def on_empty_after_text(self, _payload: Any = None) -> None:
        self._end("completed", pass_status="empty_response")
        self.ledger.final_text = self.ledger.delivered_text(self.channel)

    def on_iteration_cap(self, _payload: Any = None) -> None:
        self._end("timeout", notice="max_iterations")

    def on_delivery_cap(self, _payload: Any = None) -> None:
        self._end("delivery_cap", notice="delivery_cap")

    def on_tool_call(self, _payload: Any = None) -> None:
        run = self._passes.run
        assert run is not None
        self._tools.queue(run.tool_calls, run.text)
        self._close_pass("function_call")

    def on_follow_up(self, _payload: Any = None) -> None:
        if self.state == State.DONE.value:
            self.lock.follow_up_interrupts += 1
            self._end("follow_up_interrupt")
        else:
            self.ledger.follow_up_queued = True

    def on_nameless_call(self, _payload: Any = None) -> None:
        self.ledger.error = "the provider returned a function call without a tool name"
        self._end("error")

    def on_tool_outcome(self, payload: Any = None) -> None:
        assert isinstance(payload, ToolResult)
        self._tools.record(payload, self.conversation.function_history)
        if self.state == State.DONE.value:  # the loop ended the turn (T6, T9)
            error = self._tools.loop_ended()
            if error is None:
                self._end("completed")
            else:
                self.ledger.error = error
                self._end("error", notice="tool_error_loop")

    def on_restart_requested(self, payload: Any = None) -> None:
        assert isinstance(payload, tuple)
        result, restart = payload
        call, pre_tool_text = self._tools.take_restart_call()
        self._review(self._restarts.requested(restart, call, result, pre_tool_text,
                                              self.conversation))

    def on_restart(self, payload: Any = None) -> None:
        self._review(self._restarts.apply(payload, self.conversation))
        self._tools.reset_errors()

    def on_kill(self, _payload: Any = None) -> None:
        self._tools.record_killed()
        self._end("stopped_by_user")

    def on_crash(self, payload: Any = None) -> None:
        if isinstance(payload, (ev.StreamCrashed, ev.WorkerCrashed)):
            self.ledger.crash = payload.error
            if self.ledger.error is None:
                self.ledger.error = f"{type(payload.error).__name__}: {payload.error}"
        self._end("error")

    def _end(self, status: TurnStatus, *, pass_status: TurnStatus | None = None,
             include_landed: bool = False, notice: NoticeKind | None = None) -> None:
        """The turn's status, its notice if any, and the running pass's result, frozen."""
        self.ledger.status = status
        if notice is not None:
            self.ledger.notify(notice, self.config)
        self._close_pass(pass_status or status, include_landed)

    def _close_pass(self, status: TurnStatus, include_landed: bool = False) -> None:
        result = self._passes.close(status, include_landed)
        if result is not None:
            self.ledger.close_pass(result)

    def _review(self, entry: dict[str, Any] | None) -> None:
        if entry is not None:  # with drafting on, the review log keeps it (R10)
            self.ledger.review_log.append(entry)


async def _kill(turn: Turn, event: ev.Kill) -> None:
    await turn._fire("kill", event)


async def _follow_up(turn: Turn, event: ev.FollowUp) -> None:
    await turn._fire("follow_up", event)


async def _tool_finished(turn: Turn, event: ev.ToolFinished) -> None:
    await turn._fire_verdict(turn._tools.finished(event))


async def _worker_failed(turn: Turn, event: ev.WorkerCrashed) -> None:
    await turn._fail(event.error)


Turn._EVENTS = {
    ev.Kill: _kill,
    ev.FollowUp: _follow_up,
    ev.FirstToken: Turn._on_first_token_event,
    ev.StreamEnded: Turn._on_stream_event,
    ev.StreamCrashed: Turn._on_stream_event,
    ev.StreamSettled: Turn._on_settled_event,
    ev.ToolFinished: _tool_finished,
    ev.RestartReady: Turn._on_restart_ready,
    ev.WorkerCrashed: _worker_failed,
}


@lru_cache(maxsize=1)
def shared_machine() -> AsyncMachine:
    """The process-wide machine every turn fires its triggers on, its names checked
    against the driver when it is built."""
    return build_machine(Turn)

