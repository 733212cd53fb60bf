"""Stateful model-based test: Hypothesis drives a live `Turn` step by step on a virtual-time
loop, through a provider and tools the test controls (chunks, keep-alives, ends, errors,
content-filter blocks and refusals, garbage, tool calls incl. truncated ones, tool outcomes,
inline, stashed and message-metadata context restarts, reactor look-ups), with kills, channel
stop flags and follow-ups at chosen instants, and compares it after every step with a
reference model of docs/spec.md written from the spec, not from the engine: same state, same
journal (every transition at its exact time), same armed deadline, same delivered text, the
same request for every pass (context items, tool history, request-only notices, tools
offered), the same stash, lock and watchdog as S6/S7 say; at the end, the same result."""

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

from fsm.engine.config import TurnConfig
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.metadata import tail_directive
from fsm.engine.prefill import TurnRequest
from fsm.engine.provider import (
    AbortSignal,
    Finish,
    KeepAlive,
    PassRequest,
    ProviderError,
    TextDelta,
    ToolCallRequest,
)
from fsm.engine.restart import METADATA_TAIL_DIRECTIVE
from fsm.engine.restart_runner import already_sent_notice
from fsm.engine.tools import AnyArgs, FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.engine.user_text import quoted_name
from fsm.scenarios.format import HistoryMessage, Reaction, parse_scenario
from fsm.scenarios.runner import run_virtual
from fsm.scenarios.scripted import InMemoryChannel, history_items

from engine_support import check_invariants
from reliability_support import build_turn, check_walk, finish, reliability_settings

CHANNEL = "stateful"
A, S, ST, TC, CR = "AwaitingFirstToken", "Streaming", "Settling", "ToolCall", "ContextRestart"
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

# the channel's recent dialogue: one message with a reaction to look up, one replying to it
HISTORY = [
    HistoryMessage(id="m1", author="ana", content="look at this", at="2026-11-30T12:00:00Z",
                   reactions=[Reaction(emoji="👍", users=["bo", "cy"])]),
    HistoryMessage(id="m2", author="bo", content="nice", at="2026-11-30T12:01:00Z",
                   reply_to="m1"),
]
REACTORS = ["bo", "cy"]
TOOL_NAMES = ("work", "watch", "peek", "reveal")
GUARDS = {"watch": "youtube", "peek": "image", "reveal": "message_metadata"}
FLAG_OF = {"youtube": "disable_youtube_processing", "image": "disable_profile_picture_processing",
           "message_metadata": "disable_message_metadata_context", "gif": "disable_gif_processing"}
INLINE_ITEM = {"role": "user", "content": "<video summary>"}
STASHED_ITEM = {"role": "user", "parts": [{"type": "text", "text": "<avatar>"}]}
JUNK_ITEM = {"not": "an item"}
OVERLOADED = ProviderError(kind="provider_stream_error", message="overloaded")
BLOCKED = ProviderError(kind="blocked", type="content_filter",
                        message="the provider's content filter stopped the reply")
CALLS = st.lists(
    st.tuples(st.sampled_from((*TOOL_NAMES, "missing", "", "reveal", "peek", "watch")),
              st.sampled_from((False, False, False, False, True)),  # cut off by the provider
              st.sampled_from(("valid", "junk"))),  # what `peek` stashes
    min_size=1, max_size=2)
Call = tuple[str, bool, str]


class Raise:
    """Queued into a controlled stream: raise instead of yielding."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class ControlledStream:
    """One provider pass whose events the test pushes. With `prompt`, the stream ends as soon
    as the abort fires (a well-behaved adapter); otherwise only when the test ends it."""

    def __init__(self, request: PassRequest, abort: AbortSignal, prompt: bool) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.request = request
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
    """Implements `fsm.engine.provider.Provider`; every pass is a `ControlledStream`."""

    name = "controlled"

    def __init__(self, prompt: bool) -> None:
        self.prompt = prompt
        self.streams: list[ControlledStream] = []

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[Any]:
        stream = ControlledStream(request, abort, self.prompt)
        self.streams.append(stream)
        return stream.events()


class ControlledTools:
    """`work` (plain), `watch` (a youtube enrichment, inline transport), `peek` (a profile
    picture: stashes its item as it starts, returns only the key, R3) and `reveal` (the
    message-metadata reveal, R6), the enrichments guarded by their flags: each call waits
    until the test resolves it."""

    def __init__(self) -> None:
        self.pending: asyncio.Future[str] | None = None
        self.runs: list[str] = []
        self.registry = ToolRegistry([
            FunctionTool[AnyArgs](name="work", description="plain", args_model=AnyArgs,
                                  func=self._work),
            FunctionTool[AnyArgs](name="watch", description="enrich", args_model=AnyArgs,
                                  func=self._watch, guard="youtube"),
            FunctionTool[AnyArgs](name="peek", description="enrich", args_model=AnyArgs,
                                  func=self._peek, guard="image"),
            FunctionTool[AnyArgs](name="reveal", description="enrich", args_model=AnyArgs,
                                  func=self._reveal, guard="message_metadata"),
        ])

    async def _wait(self) -> str:
        self.pending = asyncio.get_running_loop().create_future()
        try:
            return await self.pending
        finally:
            self.pending = None

    async def _work(self, _args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        self.runs.append("work")
        return _outcome(await self._wait(), {"n": 1})

    async def _watch(self, _args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        self.runs.append("watch")
        outcome = await self._wait()
        if outcome == "bad_inline":  # a malformed item: an ordinary result, no restart (R1)
            return ToolResult.ok({"type": "context_restart_youtube",
                                  "enhanced_context_item": {"no_role": True}})
        return _outcome(outcome, {"type": "context_restart_youtube",
                                  "enhanced_context_item": dict(INLINE_ITEM)})

    async def _peek(self, args: AnyArgs, ctx: ToolContext) -> ToolResult:
        self.runs.append("peek")
        item = STASHED_ITEM if args.model_dump().get("item") == "valid" else JUNK_ITEM
        key = ctx.stash.put(copy.deepcopy(item))
        outcome = await self._wait()
        if outcome == "drained":  # someone took it first: the key no longer resolves (R5)
            ctx.stash.take(key)
        return _outcome(outcome, {"type": "context_restart_image", "pending_context_key": key})

    async def _reveal(self, _args: AnyArgs, _ctx: ToolContext) -> ToolResult:
        self.runs.append("reveal")
        return _outcome(await self._wait(), {"type": "context_restart_message_metadata"})


class ControlledChannel(InMemoryChannel):
    """The in-memory channel, whose reactor look-ups (R6) wait until the test answers."""

    def __init__(self) -> None:
        super().__init__(HISTORY)
        self.lookup: asyncio.Future[str] | None = None

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        self.reactor_lookups += 1
        self.lookup = asyncio.get_running_loop().create_future()
        try:
            answer = await self.lookup
        finally:
            self.lookup = None
        if answer == "fail":
            raise ConnectionError("the look-up failed")
        return await super().fetch_reactors(message_id, emoji, limit)


def _outcome(kind: str, data: Any) -> ToolResult:
    """`ok` (and the variants only some tools distinguish) succeeds with `data`."""
    if kind == "raise":
        raise RuntimeError("tool broke")
    if kind == "garbage":
        return None  # type: ignore[return-value]
    if kind == "fail":
        return ToolResult.fail("no luck")
    return ToolResult.ok(data)


@dataclass
class Model:
    """docs/spec.md's turn, as a plain simulation over virtual time."""

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
    pass_status: list[str] = field(default_factory=list)
    pass_errors: list[dict[str, Any] | None] = field(default_factory=list)
    channel: str = ""
    calls: deque[Call] = field(default_factory=deque)
    tool: str | None = None
    tool_item: str = "valid"
    runs: list[str] = field(default_factory=list)
    errors: int = 0
    used: set[str] = field(default_factory=set)
    lock_stop: bool = False
    interrupts: int = 0
    queued: bool = False
    status: str | None = None
    error: str | None = None
    text: str = ""
    notices: list[str] = field(default_factory=list)
    deferred: str | None = None
    metrics: list[dict[str, str]] = field(default_factory=list)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    internal: list[dict[str, Any]] = field(default_factory=list)
    tie: bool = False
    # what the next pass is asked with (S1, T7, R1, R6-R8)
    context: list[dict[str, Any]] = field(default_factory=lambda: history_items(HISTORY))
    history: list[str] = field(default_factory=list)
    turn_notices: list[str] = field(default_factory=list)
    pre_tool_text: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    added: int = 0
    lookups: int = 0
    looking_up: bool = False
    stashed: list[float] = field(default_factory=list)  # when each item still held was put

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

    def close_pass(self, include_landed: bool, status: str,
                   error: dict[str, Any] | None = None) -> None:
        text = "".join(self.parts) + ("".join(self.landed) if include_landed else "")
        self.closed.append(text)
        self.pass_status[-1] = status
        self.pass_errors[-1] = error
        self.text = text

    def end(self, event: str, dest: str, status: str, include_landed: bool = False,
            error: dict[str, Any] | None = None) -> None:
        if self.state in (A, S, ST):
            self.close_pass(include_landed, status, error)
        self.go(event, dest)
        self.status = status
        self.deadline = None
        self.tool = None

    def live_stash(self) -> int:
        """Items still in the stash: each lives at most the stash TTL (R3)."""
        return sum(1 for at in self.stashed if self.now - at < self.cfg.stash_ttl_s)

    def flags(self) -> dict[str, bool]:
        return {flag: kind in self.used for kind, flag in FLAG_OF.items()}

    # ------------------------------------------------------------------ flow

    def prepare(self) -> None:
        if self.lock_stop:
            self.end("kill", "Stopped", "stopped_by_user")
        elif self.passes >= self.cfg.max_iterations:
            self.end("iteration_cap", "Done", "timeout")
            if self.cfg.surface_user_errors:  # G2: off means no error notice of any kind
                self.notices.append("max_iterations")
        else:
            self.go("begin", A)
            self.passes += 1
            self.deadline = self.now + self.cfg.first_token_timeout_s
            self.phase = "first_token"
            self.parts, self.landed = [], []
            self.pass_status.append("function_call")
            self.pass_errors.append(None)
            if self.passes - 1 == self.cfg.soft_warn_iteration and self.cfg.surface_user_errors:
                self.notices.append("still_working")  # before the 21st call (T1)
            # the request: the context with every enrichment so far, the tool history, the
            # turn's request-only notices, the tools their flags still allow (S1, R7, R8, T7)
            self.requests.append({
                "context": copy.deepcopy(self.context), "history": list(self.history),
                "notices": list(self.turn_notices),
                "tools": [n for n in TOOL_NAMES if GUARDS.get(n) not in self.used]})

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

    def stream_end(self, kind: str, calls: list[Call]) -> None:
        if kind == "tool_call" and calls:
            text = "".join(self.parts)
            self.pre_tool_text = text if text.strip() else ""  # no whitespace-only text (T7)
            self.close_pass(False, "function_call")
            self.go("tool_call", TC)
            self.calls = deque(calls)
            self.dispatch()
        elif kind in ("error", "blocked"):
            error = BLOCKED if kind == "blocked" else OVERLOADED
            self.error = f"{error.kind}: {error.message}"
            self.end("provider_error", "Done", "error", error=error.as_dict())
        elif kind == "raise":
            self.error = "ConnectionResetError: reset"
            self.end("crash", "Done", "error")
        elif self.parts:  # completed, or a refusal after text: the text is the answer
            self.end("completed", "Done", "completed")
        elif self.passes > 1 and "".join(self.closed).strip():
            # T10: an empty pass after a tool, in a turn that delivered text, completes
            self.end("empty_after_text", "Done", "completed")
            self.pass_status[-1] = "empty_response"
            self.text = "".join(self.closed)
        else:
            self.end("empty", "Done", "empty_response")

    def dispatch(self) -> None:
        """The next queued call: refused without running when the provider cut its arguments
        off (T4), the tool is unknown, or its enrichment was used this turn (R8)."""
        name, truncated, item = self.calls.popleft()
        if not name:
            self.go("nameless_call", "Done")
            self.status = "error"
            self.error = "the provider returned a function call without a tool name"
        elif truncated or name == "missing" or GUARDS.get(name) in self.used:
            self.tool_done(name, False, event="tool_result")
        else:
            self.tool = name
            self.tool_item = item
            self.runs.append(name)
            self.deadline = self.now + self.cfg.tool_timeout_s
            if name == "peek":
                self.stashed.append(self.now)

    def tool_returns(self, outcome: str) -> None:
        """The running tool's outcome, as each tool reads it."""
        name, item = self.tool, self.tool_item
        assert name is not None
        ok = outcome not in ("fail", "raise", "garbage")
        if ok and name == "watch" and outcome != "bad_inline":
            self.restart("youtube", dict(INLINE_ITEM))
        elif ok and name == "peek":
            self.stashed.pop()  # taken by the restart, or drained before it (R4, R5)
            valid = item == "valid" and outcome != "drained"
            self.restart("image", copy.deepcopy(STASHED_ITEM) if valid else None)
        elif ok and name == "reveal":
            self.restart("message_metadata", None)
        else:
            self.tool_done(name, ok, event="tool_result")

    def tool_done(self, name: str, success: bool, event: str) -> None:
        self.tool = None
        self.deadline = None
        self.history.append(name)
        self.pre_tool_text = ""
        self.errors = 0 if success else self.errors + 1
        if self.errors >= self.cfg.max_consecutive_tool_errors:
            self.go(event, "Done")
            self.status = "error"
            self.error = f"{self.errors} consecutive tool failures"
            if self.cfg.surface_user_errors:
                self.notices.append("tool_error_loop")
        elif self.calls:
            self.stay(event)
            self.dispatch()
        else:
            self.go(event, "Preparing")
            self.prepare()

    def restart(self, kind: str, item: dict[str, Any] | None) -> None:
        """A restart request: no history entry (R1); text streamed before the call is named
        to the next passes so it is not repeated (T7, drafting off); a metadata reveal first
        looks up reactors, within the tool budget (R6)."""
        self.tool = None
        self.deadline = None
        self.calls.clear()
        if self.pre_tool_text:
            self.turn_notices.append(already_sent_notice(self.pre_tool_text))
        self.pre_tool_text = ""
        self.go("restart_requested", CR)
        if kind == "message_metadata":
            self.looking_up = True
            self.deadline = self.now + self.cfg.tool_timeout_s
            return
        if item is not None:  # R2, R3, R7; an unresolvable or invalid item: none (R5)
            self.context.append(item)
            self.added += 1
        self.restarted(kind)

    def reactors_answer(self, answer: str | None) -> None:
        """The reveal goes on: look-ups answered (`ok`), failed (`fail`) or out of time
        (None, at the restart's deadline)."""
        self.looking_up = False
        self.deadline = None
        self.lookups += 1
        self.context = annotated(self.context, REACTORS if answer == "ok" else None)
        self.context.append(tail_directive(METADATA_TAIL_DIRECTIVE))
        self.added += 1
        self.restarted("message_metadata")

    def restarted(self, kind: str) -> None:
        self.used.add(kind)  # R8
        self.errors = 0  # R9
        self.go("restart", "Preparing")
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
                assert self.tool is not None
                self.tool_done(self.tool, False, event="tool_timeout")
            elif self.state == CR:
                self.reactors_answer(None)
        self.now = target


def annotated(items: list[dict[str, Any]], reactors: list[str] | None) -> list[dict[str, Any]]:
    """R6: the recent dialogue annotated with its ref handle, author identity, sent time,
    reply reference and reactions (with the reactors' names when the look-up answered).
    The rendered `annotated_text` line is compared apart (`shape`)."""
    dialogue = [item for item in items if item.get("type") == "dialogue"]
    refs = {item["message_id"]: f"ref_{n}" for n, item in enumerate(dialogue, 1)}
    out = []
    for item in items:
        if item.get("type") != "dialogue":
            out.append(item)
            continue
        meta: dict[str, Any] = {"ref": refs[item["message_id"]],
                                "message_id": item["message_id"], "author": item["author"],
                                "author_id": item["author_id"], "sent_at": item["sent_at"]}
        if item.get("reply_to"):
            meta["reply_to"] = refs[item["reply_to"]]
        reactions = [{**r, **({"users": reactors} if reactors is not None else {})}
                     for r in item["reactions"]]
        if reactions:
            meta["reactions"] = reactions
        out.append({**item, "metadata": meta})
    return out


def shape(item: dict[str, Any]) -> dict[str, Any]:
    """A context item without its rendered line, which must name its ref and author."""
    if "metadata" in item:
        meta = item["metadata"]
        assert item["annotated_text"].startswith(f"{meta['ref']} | {quoted_name(meta['author'])}")
        return {k: v for k, v in item.items() if k != "annotated_text"}
    assert "annotated_text" not in item
    return item


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
        self.channel = ControlledChannel()

        async def create() -> None:
            self.locks = ChannelLockRegistry(
                max_follow_up_interrupts=cfg.max_follow_up_interrupts)
            lock = self.locks.try_acquire(CHANNEL, owner=f"turn {self.turns}")
            assert lock is not None
            self.turn = Turn(provider=self.provider, channel=self.channel, locks=self.locks,
                             lock=lock, tools=self.tools.registry, config=cfg,
                             request=TurnRequest(context_items=history_items(HISTORY)),
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
    @rule(kind=st.sampled_from(("completed", "error", "raise", "tool_call", "blocked",
                                "refusal", "tool_call", "tool_call")),
          calls=CALLS, dt=STEPS)
    def stream_ends(self, kind: str, calls: list[Call], dt: float) -> None:
        """The provider ends the pass: completed, a provider error, an exception, tool calls
        (some with arguments the provider cut off, T4), a content-filter block (a provider
        error of kind `blocked`, as the OpenAI-compatible and Gemini adapters report it) or a
        refusal stop (Anthropic's `refusal` stop reason: whatever text came is the answer)."""
        queue = self._stream().queue
        if kind in ("error", "blocked"):
            queue.put_nowait(BLOCKED if kind == "blocked" else OVERLOADED)
        elif kind == "raise":
            queue.put_nowait(Raise(ConnectionResetError("reset")))
        elif kind == "tool_call":
            for name, truncated, item in calls:
                queue.put_nowait(ToolCallRequest(name=name, arguments={"item": item},
                                                 truncated=truncated))
            queue.put_nowait(Finish("tool_calls"))
        else:
            queue.put_nowait(Finish("refusal" if kind == "refusal" else "stop"))
        queue.put_nowait(END)
        self.model.stream_end(kind, calls)  # type: ignore[union-attr]
        self._advance(dt)

    @precondition(lambda self: self.running and self.model.state in (A, S))
    @rule(name=st.sampled_from(("watch", "peek", "reveal")),
          item=st.sampled_from(("valid", "junk")), text=st.one_of(st.none(), TEXTS), dt=STEPS)
    def enrichment_call(self, name: str, item: str, text: str | None, dt: float) -> None:
        """The model asks for one enrichment, the way into the restarts (R1-R9), perhaps
        after some text of its reply (which the next passes are told was sent, T7)."""
        if text is not None:
            self._stream().queue.put_nowait(TextDelta(text))
            self.model.token(text)  # type: ignore[union-attr]
        self.stream_ends(kind="tool_call", calls=[(name, False, item)], dt=dt)

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
    @rule(outcome=st.sampled_from(("ok", "ok", "ok", "fail", "raise", "garbage", "bad_inline",
                                   "drained")),
          dt=STEPS)
    def tool_returns(self, outcome: str, dt: float) -> None:
        """The tool's outcome: `ok`, failures, and for the enrichments a malformed inline item
        (`watch`) or a stash key drained before the restart takes it (`peek`)."""
        model = self.model
        assert model is not None and self.tools.pending is not None
        self.tools.pending.set_result(outcome)
        model.tool_returns(outcome)
        self._advance(dt)

    @precondition(lambda self: self.running and self.model.state == CR
                  and self.model.looking_up)
    @rule(answer=st.sampled_from(("ok", "fail")), dt=STEPS)
    def reactors(self, answer: str, dt: float) -> None:
        """The reveal's reactor look-up answers, or fails (R6: counts only)."""
        model = self.model
        assert model is not None and self.channel.lookup is not None
        self.channel.lookup.set_result(answer)
        model.reactors_answer(answer)
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
        # every pass was asked with what the model predicts (S1, T7, R1-R8)
        streams = self.provider.streams
        assert len(streams) == len(model.requests)
        for number, (stream, expected) in enumerate(zip(streams, model.requests, strict=True)):
            request = stream.request
            assert request.pass_index == number + 1
            assert [shape(item) for item in request.context_items] == expected["context"]
            assert [entry.tool_name for entry in request.function_history] == \
                expected["history"]
            assert request.request_notices == expected["notices"]
            assert [tool["name"] for tool in request.tools] == expected["tools"]
        now = self.loop.time()
        held = [e for e in turn.stash._entries.values() if now - e.stored_at < turn.stash.ttl_s]
        assert len(held) == model.live_stash(), "R3, R4: the stash"
        lock = turn.lock
        if model.running:
            in_pass = model.state in (A, S, ST)
            assert (lock.stream_kill is not None) == in_pass, "S7: one kill handle per pass"
            busy = in_pass or (model.state == TC and model.tool is not None) \
                or (model.state == CR and model.looking_up)  # R6 look-ups, S6
            assert lock.watchdog_depth == int(busy), "S6: exempt exactly while a pass/tool runs"
            if model.state in (A, S):
                assert turn._passes.run is not None and turn._passes.run.deadline == model.deadline
            elif model.state == ST:
                assert turn._passes.settle_deadline == model.deadline
            elif model.state == TC and model.tool is not None:
                assert turn._tools.deadline == model.deadline
            elif model.state == CR:
                assert turn._restarts.deadline == model.deadline
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
        assert result.error == model.error
        assert result.text == model.text
        assert result.delivered_text == "".join(model.closed)
        assert len(result.passes) == model.passes
        assert [p.status for p in result.passes] == model.pass_status
        assert [p.error for p in result.passes] == model.pass_errors
        assert result.follow_up_queued == model.queued
        assert result.flags == model.flags()
        assert result.function_history == model.history
        assert result.context_items_added == model.added
        assert result.reactor_lookups == model.lookups
        assert result.stash_items == model.live_stash()
        assert result.notices == model.notices
        assert result.deferred_notice == model.deferred
        assert result.metrics == model.metrics
        assert self.tools.runs == model.runs, "T4: a truncated or refused call never runs"
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
# covers S1, S4, S5, S6, S7, S8, S9, S10, S11, S12, S13, S14, S15, S16, S17, T1, T2, T3, T4,
# T5, T6, T7, R1, R2, R3, R4, R5, R6, R7, R8, R9, D4: a live turn against a reference model of
# docs/spec.md, step by step (stashed, inline and metadata restarts, truncated calls, content-filter
# blocks and refusal stops included)


class _LookupsHang(InMemoryChannel):
    """A channel whose reactor look-ups never answer."""

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        self.reactor_lookups += 1
        await asyncio.Event().wait()
        return []


def test_b18_metadata_reveal_whose_look_ups_time_out_still_annotates_the_dialogue() -> None:
    # covers R6 (and B5's "degrades to reaction counts"): past the tool budget the reveal goes
    # on with the dialogue annotated (refs, authors, times) and reaction counts only
    raw = {"name": "b18", "config": {"tool_timeout_s": 5.0},
           "passes": [[{"at": 1.0, "tool_call": {"name": "reveal_message_metadata"}}],
                      [{"at": 1.0, "text": "Ana posted it."}, {"at": 2.0, "end": "completed"}]],
           "tools": {"reveal_message_metadata": {"guard": "message_metadata", "outcomes": [
               {"after": 0.0, "success": True,
                "data": {"type": "context_restart_message_metadata"}}]}},
           "history": [{"id": "m1", "author": "ana", "content": "look", "at": "2026-11-30T12:00Z",
                        "reactions": [{"emoji": "👍", "users": ["bo"]}]}]}

    async def scenario() -> tuple[Turn, Any]:
        turn = build_turn(raw, channel=_LookupsHang(parse_scenario(raw).history))
        return turn, await finish(turn)

    turn, result = run_virtual(scenario)
    assert [t["t"] for t in turn.transitions if t["event"] == "restart"] == [6.0]
    second = turn.provider.requests[1]  # type: ignore[attr-defined]
    dialogue = [item for item in second.context_items if item.get("type") == "dialogue"]
    assert dialogue and all("metadata" in item for item in dialogue), dialogue  # today: none
    assert dialogue[0]["metadata"]["reactions"] == [{"emoji": "👍", "count": 1}]
    assert result.reactor_lookups == 1  # the one REST call made; today 0
