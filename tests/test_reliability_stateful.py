"""Stateful model-based test: Hypothesis drives a live `Turn` step by step on a virtual-time
loop, through a provider and tools the test controls (chunks, keep-alives, ends, errors,
garbage, tool outcomes), with kills, channel stop flags and follow-ups at chosen instants,
and compares it after every step with a reference model of SPEC.md written from the spec,
not from the engine: same state, same journal (every transition at its exact time), same
armed deadline, same delivered text, lock and watchdog as S6/S7 say; at the end, the same
result."""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import looptime
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fsm.config import TurnConfig
from fsm.locks import ChannelLockRegistry
from fsm.provider import (
    AbortSignal,
    Finish,
    KeepAlive,
    PassRequest,
    ProviderError,
    TextDelta,
    ToolCallRequest,
)
from fsm.scripted import InMemoryChannel
from fsm.tools import AnyArgs, FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.turn import Turn

from engine_support import check_invariants
from reliability_support import check_walk, reliability_settings

CHANNEL = "stateful"
A, S, ST, TC = "AwaitingFirstToken", "Streaming", "Settling", "ToolCall"
TERMINAL = ("Done", "TimedOut", "Stopped")
CONFIGS: tuple[dict[str, Any], ...] = (
    {"first_token_timeout_s": 40, "idle_timeout_s": 20, "settle_timeout_s": 5,
     "tool_timeout_s": 30, "max_iterations": 4, "soft_warn_iteration": 3,
     "max_consecutive_tool_errors": 2, "max_follow_up_interrupts": 1},
    {"first_token_timeout_s": 15, "idle_timeout_s": 10, "settle_timeout_s": 0,
     "tool_timeout_s": 12, "max_iterations": 2, "soft_warn_iteration": 1,
     "max_consecutive_tool_errors": 1, "max_follow_up_interrupts": 0,
     "surface_user_errors": False},
    {"first_token_timeout_s": 25, "idle_timeout_s": 12, "settle_timeout_s": 2.5,
     "tool_timeout_s": 8, "max_iterations": 6, "soft_warn_iteration": 20,
     "max_consecutive_tool_errors": 3, "fallback_pending": True, "max_follow_up_interrupts": 2},
)
STEPS = st.sampled_from((0.125, 0.5, 1.0, 3.0, 9.0, 17.0, 41.0))
TEXTS = st.sampled_from(("Hi", " there", "\n", "✓ ünï", "x" * 30))
END = object()


class Raise:
    """Queued into a controlled stream: raise instead of yielding."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class ControlledStream:
    """One provider pass whose events the test pushes. With `prompt`, the stream ends as soon
    as the abort fires (a well-behaved adapter); otherwise only when the test ends it."""

    def __init__(self, abort: AbortSignal, prompt: bool) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.abort = abort
        if prompt:
            abort.add_callback(lambda: self.queue.put_nowait(END))

    async def events(self) -> AsyncIterator[Any]:
        while True:
            item = await self.queue.get()
            if item is END:
                return
            if isinstance(item, Raise):
                raise item.error
            yield item


class ControlledProvider:
    """Implements `fsm.provider.Provider`; every pass is a `ControlledStream`."""

    name = "controlled"

    def __init__(self, prompt: bool) -> None:
        self.prompt = prompt
        self.streams: list[ControlledStream] = []

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[Any]:
        stream = ControlledStream(abort, self.prompt)
        self.streams.append(stream)
        return stream.events()


class ControlledTools:
    """`work` (plain) and `watch` (a youtube enrichment, guarded by its flag): each call waits
    until the test resolves it."""

    def __init__(self) -> None:
        self.pending: asyncio.Future[str] | None = None
        self.registry = ToolRegistry([
            FunctionTool[AnyArgs](name="work", description="plain", args_model=AnyArgs,
                                  func=self._work),
            FunctionTool[AnyArgs](name="watch", description="enrich", args_model=AnyArgs,
                                  func=self._watch, guard="youtube"),
        ])

    async def _wait(self) -> str:
        self.pending = asyncio.get_running_loop().create_future()
        try:
            return await self.pending
        finally:
            self.pending = None

    async def _work(self, _args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        return _outcome(await self._wait(), {"n": 1})

    async def _watch(self, _args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        return _outcome(await self._wait(), {
            "type": "context_restart_youtube",
            "enhanced_context_item": {"role": "user", "content": "<video summary>"}})


def _outcome(kind: str, data: Any) -> ToolResult:
    if kind == "raise":
        raise RuntimeError("tool broke")
    if kind == "garbage":
        return None  # type: ignore[return-value]
    if kind == "fail":
        return ToolResult.fail("no luck")
    return ToolResult.ok(data)


@dataclass
class Model:
    """SPEC.md's turn, as a plain simulation over virtual time."""

    cfg: TurnConfig
    prompt: bool
    now: float = 0.0
    t0: float = 0.0
    state: str = "Preparing"
    passes: int = 0
    deadline: float | None = None
    phase: str = "first_token"
    parts: list[str] = field(default_factory=list)
    landed: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    channel: str = ""
    calls: deque[str] = field(default_factory=deque)
    tool: str | None = None
    errors: int = 0
    youtube_used: bool = False
    lock_stop: bool = False
    interrupts: int = 0
    queued: bool = False
    status: str | None = None
    text: str = ""
    notices: list[str] = field(default_factory=list)
    deferred: str | None = None
    metrics: list[dict[str, str]] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    internal: list[dict[str, Any]] = field(default_factory=list)
    tie: bool = False

    # ------------------------------------------------------------------ bookkeeping

    @property
    def running(self) -> bool:
        return self.state not in TERMINAL

    def go(self, event: str, dest: str) -> None:
        self.transitions.append({"t": self.now - self.t0, "event": event, "from": self.state,
                                 "to": dest})
        if self.state in (A, S, ST) and dest not in (A, S, ST):
            self.deadline = None
        self.state = dest

    def stay(self, event: str) -> None:
        self.internal.append({"t": self.now - self.t0, "event": event, "state": self.state})

    def close_pass(self, include_landed: bool) -> None:
        text = "".join(self.parts) + ("".join(self.landed) if include_landed else "")
        self.closed.append(text)
        self.text = text

    def end(self, event: str, dest: str, status: str, include_landed: bool = False) -> None:
        if self.state in (A, S, ST):
            self.close_pass(include_landed)
        self.go(event, dest)
        self.status = status
        self.deadline = None
        self.tool = None

    # ------------------------------------------------------------------ flow

    def prepare(self) -> None:
        if self.lock_stop:
            self.end("kill", "Stopped", "stopped_by_user")
        elif self.passes >= self.cfg.max_iterations:
            self.end("iteration_cap", "Done", "timeout")
            self.notices.append("max_iterations")
        else:
            self.go("begin", A)
            self.passes += 1
            self.deadline = self.now + self.cfg.first_token_timeout_s
            self.phase = "first_token"
            self.parts, self.landed = [], []
            if self.passes == self.cfg.soft_warn_iteration:
                self.notices.append("still_working")

    def token(self, text: str) -> None:
        self.channel += text
        if self.state == ST:
            self.landed.append(text)
            return
        self.parts.append(text)
        self.deadline = self.now + self.cfg.idle_timeout_s
        if self.state == A:
            self.go("first_token", S)
            self.phase = "idle"

    def stream_end(self, kind: str, calls: list[str]) -> None:
        if kind == "tool_call" and calls:
            self.close_pass(False)
            self.go("tool_call", TC)
            self.calls = deque(calls)
            self.dispatch()
        elif kind == "error":
            self.end("provider_error", "Done", "error")
        elif kind == "raise":
            self.end("crash", "Done", "error")
        elif self.parts:
            self.end("completed", "Done", "completed")
        else:
            self.end("empty", "Done", "empty_response")

    def dispatch(self) -> None:
        name = self.calls.popleft()
        if not name:
            self.go("nameless_call", "Done")
            self.status = "error"
        elif name == "missing" or (name == "watch" and self.youtube_used):
            self.tool_done(False, restart=False, event="tool_result")
        else:
            self.tool = name
            self.deadline = self.now + self.cfg.tool_timeout_s

    def tool_done(self, success: bool, restart: bool, event: str) -> None:
        self.tool = None
        self.deadline = None
        if restart:
            self.go("restart_requested", "ContextRestart")
            self.calls.clear()
            self.youtube_used = True
            self.errors = 0
            self.go("restart", "Preparing")
            self.prepare()
            return
        self.errors = 0 if success else self.errors + 1
        if self.errors >= self.cfg.max_consecutive_tool_errors:
            self.go(event, "Done")
            self.status = "error"
            self.notices.append("tool_error_loop")
        elif self.calls:
            self.stay(event)
            self.dispatch()
        else:
            self.go(event, "Preparing")
            self.prepare()

    def stream_timeout(self) -> None:
        event = "first_token_timeout" if self.state == A else "idle_timeout"
        if self.lock_stop:
            self.end(event, "Stopped", "stopped_by_user")
            return
        self.go(event, ST)
        if self.prompt:
            self.finish_timeout("settled", include_landed=True)
        elif self.cfg.settle_timeout_s == 0:
            self.finish_timeout("settle_timeout", include_landed=False)
        else:
            self.deadline = self.now + self.cfg.settle_timeout_s

    def finish_timeout(self, event: str, include_landed: bool) -> None:
        phase = self.phase
        self.metrics.append({"name": "stream_sdk_timeout", "phase": phase})
        kind = f"timeout_{phase}"
        if self.cfg.surface_user_errors and self.cfg.fallback_pending:
            self.deferred = kind
        elif self.cfg.surface_user_errors:
            self.notices.append(kind)
        self.end(event, "TimedOut", "timeout", include_landed)

    def kill(self) -> None:
        self.end("kill", "Stopped", "stopped_by_user")

    def follow_up(self) -> None:
        if self.state in (A, S) and self.interrupts < self.cfg.max_follow_up_interrupts:
            self.interrupts += 1
            self.end("follow_up", "Done", "follow_up_interrupt")
        else:
            self.queued = True
            self.stay("follow_up")

    def advance(self, target: float) -> None:
        """Fire every deadline before `target`; a deadline exactly at `target` is a tie the
        harness avoids (`tie` is set)."""
        while self.running and self.deadline is not None and self.deadline <= target:
            if self.deadline == target:
                self.tie = True
                return
            self.now = self.deadline
            if self.state in (A, S):
                self.stream_timeout()
            elif self.state == ST:
                self.finish_timeout("settle_timeout", include_landed=False)
            elif self.state == TC:
                self.tool_done(False, restart=False, event="tool_timeout")
        self.now = target


class LiveTurn(RuleBasedStateMachine):
    """The harness: one virtual-time loop, one turn at a time, the model alongside."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = looptime.new_event_loop(start=0.0)
        self.locks: ChannelLockRegistry | None = None
        self.model: Model | None = None
        self.turn: Turn | None = None
        self.task: asyncio.Task[Any] | None = None
        self.turns = 0

    # ---------------------------------------------------------------- harness

    @initialize(config=st.sampled_from(CONFIGS), prompt=st.booleans(), dt=STEPS)
    def start(self, config: dict[str, Any], prompt: bool, dt: float) -> None:
        self.config = config
        self.prompt = prompt and config["settle_timeout_s"] > 0
        self._new_turn(dt)

    def _new_turn(self, dt: float) -> None:
        cfg = TurnConfig(**self.config)
        model = Model(cfg=cfg, prompt=self.prompt, now=self.loop.time(), t0=self.loop.time())
        self.provider = ControlledProvider(self.prompt)
        self.tools = ControlledTools()
        self.channel = InMemoryChannel()

        async def create() -> None:
            self.locks = ChannelLockRegistry(
                max_follow_up_interrupts=cfg.max_follow_up_interrupts)
            lock = self.locks.try_acquire(CHANNEL, owner=f"turn {self.turns}")
            assert lock is not None
            self.turn = Turn(provider=self.provider, channel=self.channel, locks=self.locks,
                             lock=lock, tools=self.tools.registry, config=cfg,
                             turn_id=f"live-{self.turns}")
            self.task = asyncio.get_running_loop().create_task(self.turn.run())

        self.loop.run_until_complete(create())
        self.turns += 1
        self.model = model
        model.prepare()
        self._advance(dt)

    def _advance(self, dt: float) -> None:
        """Run the loop for `dt` of virtual time; the model fires the same deadlines."""
        model = self.model
        assert model is not None
        target = model.now + dt
        while True:
            probe = copy.deepcopy(model)
            probe.advance(target)
            if not probe.tie:
                break
            target += 0.0625
        model.advance(target)
        self.loop.run_until_complete(asyncio.sleep(target - self.loop.time()))
        assert self.loop.time() == target

    def _stream(self) -> ControlledStream:
        return self.provider.streams[-1]

    @property
    def running(self) -> bool:
        return self.model is not None and self.model.running

    # ---------------------------------------------------------------- provider rules

    @precondition(lambda self: self.running and self.model.state in (A, S, ST))
    @rule(text=TEXTS, dt=STEPS)
    def chunk(self, text: str, dt: float) -> None:
        self._stream().queue.put_nowait(TextDelta(text))
        self.model.token(text)  # type: ignore[union-attr]
        self._advance(dt)

    @precondition(lambda self: self.running and self.model.state in (A, S))
    @rule(kind=st.sampled_from(("keepalive", "empty", "garbage")), dt=STEPS)
    def not_a_token(self, kind: str, dt: float) -> None:
        event = {"keepalive": KeepAlive("ping"), "empty": TextDelta(""), "garbage": object()}
        self._stream().queue.put_nowait(event[kind])
        self._advance(dt)

    @precondition(lambda self: self.running and self.model.state in (A, S))
    @rule(kind=st.sampled_from(("completed", "error", "raise", "tool_call")),
          calls=st.lists(st.sampled_from(("work", "watch", "missing", "")), min_size=1,
                         max_size=2),
          dt=STEPS)
    def stream_ends(self, kind: str, calls: list[str], dt: float) -> None:
        queue = self._stream().queue
        if kind == "error":
            queue.put_nowait(ProviderError(kind="provider_stream_error", message="overloaded"))
        elif kind == "raise":
            queue.put_nowait(Raise(ConnectionResetError("reset")))
        elif kind == "tool_call":
            for name in calls:
                queue.put_nowait(ToolCallRequest(name=name, arguments={}))
            queue.put_nowait(Finish("tool_calls"))
        else:
            queue.put_nowait(Finish("stop"))
        queue.put_nowait(END)
        self.model.stream_end(kind, calls)  # type: ignore[union-attr]
        self._advance(dt)

    @precondition(lambda self: self.running and self.model.state == ST)
    @rule(lands=st.one_of(st.none(), TEXTS), how=st.sampled_from(("end", "raise")), dt=STEPS)
    def settle(self, lands: str | None, how: str, dt: float) -> None:
        model = self.model
        assert model is not None
        queue = self._stream().queue
        if lands is not None:
            queue.put_nowait(TextDelta(lands))
            model.token(lands)
        queue.put_nowait(END if how == "end" else Raise(OSError("closed")))
        model.finish_timeout("settled", include_landed=True)
        self._advance(dt)

    # ---------------------------------------------------------------- tool rules

    @precondition(lambda self: self.running and self.model.state == TC
                  and self.model.tool is not None)
    @rule(outcome=st.sampled_from(("ok", "fail", "raise", "garbage")), dt=STEPS)
    def tool_returns(self, outcome: str, dt: float) -> None:
        model = self.model
        assert model is not None and self.tools.pending is not None
        self.tools.pending.set_result(outcome)
        success = outcome == "ok"
        model.tool_done(success, restart=success and model.tool == "watch", event="tool_result")
        self._advance(dt)

    # ---------------------------------------------------------------- user rules

    @precondition(lambda self: self.running)
    @rule(event=st.sampled_from(("kill", "/kill", "stop flag only", "follow-up")), dt=STEPS)
    def user(self, event: str, dt: float) -> None:
        """What the channel does: `/kill` (S7, D3) or the turn's own stop, the channel's stop
        flag without the kill handles (S9: a timer finds it pending), a follow-up (S17)."""
        model, turn, locks = self.model, self.turn, self.locks
        assert model is not None and turn is not None and locks is not None
        if event == "kill":
            turn.request_stop()
            model.kill()
        elif event == "/kill":
            assert locks.request_stop(CHANNEL)
            model.kill()
        elif event == "stop flag only":
            turn.lock.stop_requested = True
            model.lock_stop = True
        else:
            turn.notify_follow_up()
            model.follow_up()
        self._advance(dt)

    @precondition(lambda self: self.running)
    @rule(dt=STEPS)
    def wait(self, dt: float) -> None:
        self._advance(dt)

    @precondition(lambda self: not self.running)
    @rule(dt=STEPS)
    def next_turn(self, dt: float) -> None:
        """A new turn in the same channel on the same loop, once the last one ended (D4)."""
        self._new_turn(dt)

    # ---------------------------------------------------------------- checks

    @invariant()
    def matches_the_model(self) -> None:
        model, turn = self.model, self.turn
        if model is None or turn is None:
            return
        assert turn.transitions == model.transitions
        assert turn.internal_transitions == model.internal
        assert turn.state == model.state
        assert self.channel.text == model.channel, "delivered text diverged"
        lock = turn.lock
        if model.running:
            in_pass = model.state in (A, S, ST)
            assert (lock.stream_kill is not None) == in_pass, "S7: one kill handle per pass"
            busy = in_pass or (model.state == TC and model.tool is not None)
            assert lock.watchdog_depth == int(busy), "S6: exempt exactly while a pass/tool runs"
            if model.state in (A, S):
                assert turn._run is not None and turn._run.deadline == model.deadline
            elif model.state == ST:
                assert turn._settle_deadline == model.deadline
            elif model.state == TC and model.tool is not None:
                assert turn._tool_deadline == model.deadline
            assert not self.task.done()  # type: ignore[union-attr]
        else:
            self._check_end()

    def _check_end(self) -> None:
        model, turn, task = self.model, self.turn, self.task
        assert model is not None and turn is not None and task is not None
        assert task.done(), "the turn did not return at its terminal instant"
        if getattr(self, "_checked", None) is turn:
            return
        self._checked = turn
        result = task.result()
        assert result.status == model.status
        assert result.text == model.text
        assert result.delivered_text == "".join(model.closed)
        assert len(result.passes) == model.passes
        assert result.follow_up_queued == model.queued
        assert result.flags["disable_youtube_processing"] == model.youtube_used
        assert result.notices == model.notices
        assert result.deferred_notice == model.deferred
        assert result.metrics == model.metrics
        assert self.locks is not None
        self.locks.release(turn.lock)
        check_walk(turn)
        check_invariants(_Played(turn, self.locks))
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        assert not pending, f"tasks outlived the turn: {[t.get_name() for t in pending]}"

    def teardown(self) -> None:
        try:
            if self.turn is not None and self.task is not None and not self.task.done():
                self.turn.request_stop()
                self.loop.run_until_complete(self.task)
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()


@dataclass
class _Played:
    """What `check_invariants` reads from a played scenario."""

    turn: Turn
    locks: ChannelLockRegistry

    @property
    def transitions(self) -> list[dict[str, Any]]:
        return self.turn.transitions


LiveTurn.TestCase.settings = reliability_settings(ci_examples=300, stateful_step_count=30)
TestLiveTurn = LiveTurn.TestCase
# covers S4, S5, S6, S7, S9, S10, S11, S12, S13, S14, S15, S16, S17, T1, T2, T3, T5, T6, R1,
# R8, R9, D4: a live turn against a reference model of SPEC.md, step by step
