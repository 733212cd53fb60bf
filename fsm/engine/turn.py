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
from .channel import TurnChannel
from .clock import TurnClock, on_grid
from .config import TurnConfig
from .conversation import Conversation
from .edges import EdgeCallbacks
from .ledger import TurnLedger, channel_delivered
from .locks import ChannelLock, ChannelLockRegistry
from .machine import build_machine
from .mailbox import Mailbox
from .pass_runner import PassRunner
from .prefill import TurnRequest
from .provider import Provider
from .recording import InputRecorder
from .restart_runner import RestartRunner
from .result import PassResult, TurnResult
from .stash import ContextStash
from .table import CRASH_SOURCES, STREAM_STATES, TERMINAL, State
from .tasks import Workers
from .tool_runner import ToolRunner, Verdict
from .tools import ToolRegistry

log = logging.getLogger(__name__)

_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)
_PASS_STATES = frozenset({State.AWAITING_FIRST_TOKEN.value, State.STREAMING.value,
                          State.SETTLING.value})
_STREAM_STATES = frozenset(s.value for s in STREAM_STATES)
_turn_ids = itertools.count(1)
_DEADLINE_OWNERS: dict[str, str] = {
    **{state: "_passes" for state in _PASS_STATES},
    State.TOOL_CALL.value: "_tools", State.CONTEXT_RESTART.value: "_restarts",
}
"""The runner whose deadline the driver waits on in each state."""
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


class Turn(EdgeCallbacks):
    """One bot reply in one channel, from Preparing to exactly one terminal state: the
    driver that keeps the state, waits on the runners' deadlines and reads the mailbox."""

    state: str
    _EVENTS: ClassVar[dict[type, Callable[[Turn, Any], Awaitable[Any]]]]
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
        workers = self._workers = Workers(
            self.turn_id, grace_s=self.config.settle_timeout_s or 1.0,
            on_crash=lambda exc: self.mailbox.post(ev.WorkerCrashed(exc)))
        runner: dict[str, Any] = {"config": self.config, "locks": locks, "lock": lock,
                                  "mailbox": self.mailbox, "turn_id": self.turn_id,
                                  "spawn": workers.spawn}
        self._passes = PassRunner(provider=provider, channel=channel, **runner)
        self._tools = ToolRunner(tools=tools if tools is not None else ToolRegistry(),
                                 recorder=None, clock=self._clock.now, **runner)
        self._restarts = RestartRunner(channel=channel, clock=self._clock.now, **runner)
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
        """`/kill`: honoured at once in every non-terminal state (S7, S16). The stream and a
        running tool are aborted with `reason` (`kill`, or `stale_lock` from the sweeper)."""
        if self.stop_requested or self.state in _TERMINAL_NAMES:
            return
        self.ledger.stop_requested_at = self.elapsed
        if reason == "stale_lock":  # the sweeper gave up on the turn: not the user's /kill
            self.ledger.error = "the channel lock was released as stale"
        clock = self._clock
        clock.stop_at = clock.arrival()
        if self.recorder is not None and clock.started:
            self.recorder.on_event(clock.stop_at - clock.t0, {"kill": True})
        self._passes.abort(reason)
        self._tools.abort(reason)
        self.mailbox.post_urgent(ev.Kill(), clock.stop_at)

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
            await self._fire("kill", ev.Kill())
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
            await self._fire("kill", ev.Kill())
        elif len(self.ledger.passes) >= self.config.max_iterations:
            await self._fire("iteration_cap")
        elif await self._fire("begin", self.conversation.next_request(
                self._tools.registry, len(self.ledger.passes) + 1)):
            # Let the pass's worker call the provider before the mailbox is read again:
            # a pass that began has asked the model, even when a kill or follow-up is
            # already waiting at the same instant (S3, S17).
            await asyncio.sleep(0)

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

    def _deadline(self) -> float | None:
        runner = _DEADLINE_OWNERS.get(self.state)
        return getattr(self, runner).deadline if runner is not None else None

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
                self._record((at if at is not None else self._clock.now()) - self._clock.t0,
                             trigger, source, self.state)
            raise
        dest = self.state
        if not taken:
            return False
        t = (at if at is not None else self._clock.now()) - self._clock.t0
        if dest == source:
            self.ledger.record_internal(t, trigger, source)
        else:
            self._record(t, trigger, source, dest)
            if source in _PASS_STATES and dest not in _PASS_STATES:
                self._passes.end()
        await self.ledger.post_notices(self.channel, self.turn_id)
        return taken

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


async def _stream_ended(turn: Turn, event: ev.StreamEnded | ev.StreamCrashed) -> None:
    if not turn._passes.is_current(event.pass_no):
        return
    if turn.state == State.SETTLING.value:
        await turn._fire("settled", event)  # it ended as its timer fired: it has settled
    elif turn.state not in _STREAM_STATES:
        return
    elif isinstance(event, ev.StreamCrashed):
        turn.ledger.error = f"{type(event.error).__name__}: {event.error}"
        await turn._fire("crash", event)
    elif event.outcome != "empty" or not await turn._fire("empty_after_text", event):
        await turn._fire(event.outcome, event)


async def _first_token(turn: Turn, event: ev.FirstToken) -> None:
    if turn._passes.is_current(event.pass_no) and turn.state == "AwaitingFirstToken":
        await turn._fire("first_token", event)


async def _settled(turn: Turn, event: ev.StreamSettled) -> None:
    if turn._passes.is_current(event.pass_no) and turn.state == "Settling":
        await turn._fire("settled", event)


async def _restart_ready(turn: Turn, event: ev.RestartReady) -> None:
    if turn._restarts.ready(event) and turn.state == "ContextRestart":
        await turn._fire("restart", event.payload)


Turn._EVENTS = {
    ev.Kill: lambda turn, event: turn._fire("kill", event),
    ev.FollowUp: lambda turn, event: turn._fire("follow_up", event),
    ev.FirstToken: _first_token,
    ev.StreamEnded: _stream_ended,
    ev.StreamCrashed: _stream_ended,
    ev.StreamSettled: _settled,
    ev.ToolFinished: lambda turn, event: turn._fire_verdict(turn._tools.finished(event)),
    ev.RestartReady: _restart_ready,
    ev.WorkerCrashed: lambda turn, event: turn._fail(event.error),
}


@lru_cache(maxsize=1)
def shared_machine() -> AsyncMachine:
    """The process-wide machine every turn fires its triggers on, its names checked
    against the driver when it is built."""
    return build_machine(Turn)

