"""Model-based tests of the generation turn (G1, G2): Hypothesis generates whole fallback
chains, 1-4 attempts, each with its own provider script (text, keep-alives, tool calls incl.
truncated, unknown and nameless ones, provider errors retryable or not, 429s with
`retry_after`, content-filter blocks, exceptions, stalls that time out and settle, with or
without a landed send), tools shared by the chain (success, failure, raise, hang, an inline
enrichment restart), a channel (an in-memory one, or the real `DiscordChannel` over a fake
Discord, which buffers and reports what it really sent) whose text sends may fail, and `/kill`
and follow-ups at virtual times. Each chain is played by `run_generation_turn` on a
virtual-time loop and checked by the chain oracle `check_chain`:

- every attempt keeps the single-turn invariants (`check_played`, with the attempt's own
  config: `fallback_pending` unless it is the last scripted attempt);
- exactly one terminal outcome: the chain's status and text are the last attempt's, and an
  attempt begins only when the previous one failed as a model (G1: error, timeout or empty
  answer in its own pass), at the instant it ended; the chain stops at the first attempt that
  did not, or after the last;
- the continuation prefill of every pass of attempt k+1 is the original prefill plus what
  the channel really received from attempts 1..k (the sum of their delivered texts), last in
  the request after the history and the notices (S1); what the channel received during an
  attempt is that attempt's own text (never an earlier attempt's again), and the chain's
  delivered text is the attempts' in order;
- errors are suppressed while an attempt remains (no timeout notice from a non-final
  attempt, S12); when every attempt failed, the chain posts at most one notice, last, for
  why the last attempt failed: its deferred timeout notice only if it timed out (G2);
- calls an earlier attempt completed are replayed in the history and named in a request-only
  notice to every later attempt, exactly those, never re-run (a tool runs only when the running
  attempt's own model asked for it; a truncated call never runs, T4); a restart's injected
  context is never carried to a replacement attempt (R10);
- a kill stops the whole chain at its instant: nothing runs after it, an attempt that would
  start after it ends Stopped at once without calling its model.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import aclosing
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import discord
from hypothesis import given
from hypothesis import strategies as st

from discord_io.delivery import DiscordChannel
from fsm.engine.channel import ERROR_NOTICES, NOTICE_TEXT, Notice, NoticeKind
from fsm.engine.config import TurnConfig
from fsm.engine.failures import NOTICE_BY_FAILURE
from fsm.engine.generation import (
    Attempt,
    GenerationResult,
    failure_of,
    run_generation_turn,
    should_fall_back,
)
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.provider import AbortSignal, HistoryEntry, PassRequest, ProviderError, ProviderEvent
from fsm.engine.result import TurnResult
from fsm.engine.stash import ContextStash
from fsm.engine.tools import AnyArgs, FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import Played, run_virtual
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider

from reliability_support import (
    EPS,
    Budgets,
    HypothesisRand,
    Rand,
    _time,
    check_played,
    landed_out_of,
    reliability_settings,
)

CHANNEL = "generation-channel"
STREAM_STATES = frozenset({"AwaitingFirstToken", "Streaming", "Settling"})
TERMINAL = frozenset({"Done", "TimedOut", "Stopped"})
MODEL_FAILURES = frozenset({"error", "timeout", "empty_response"})
KIND_BY_TITLE: dict[str, NoticeKind] = {title: kind for kind, (title, _) in NOTICE_TEXT.items()}
BASE_CONTEXT: list[dict[str, Any]] = [{"role": "user", "content": "what is new?"}]
EARLIER_CALL = {
    "tool_name": "search",
    "arguments": {"q": "earlier"},
    "result": {"success": True, "data": {"answer": 0}},
}
TAIL_RANK = {"tool_history": 0, "notice": 1, "prefill": 2}
NAMED_CALL = re.compile(r"(\w+)\((\{[^()]*\})\)")

# ----------------------------------------------------------------------------- generator

TEXTS = ("Hi", " there", "\n\n", "Para one.\n\n", "ünïcødé ✓ ", "```py\nx = 1\n```\n", "x" * 40)
CALLS: tuple[dict[str, Any], ...] = (
    {"name": "search", "args": {"q": "cats"}},
    {"name": "search", "args": {"q": "dogs"}},
    {"name": "calc", "args": {"n": 3}},
    {"name": "watch", "args": {"url": "v1"}},
    {"name": "watch", "args": {"url": "v2"}},
    {"name": "nope", "args": {}},
    {"name": "", "args": {}},
)
ERRORS: tuple[dict[str, Any], ...] = (
    {
        "error": "overloaded",
        "error_kind": "provider_stream_error",
        "status": 503,
        "retryable": True,
    },
    {"error": "invalid request", "error_kind": "http", "status": 400},
    {
        "error": "Rate limit reached",
        "error_kind": "http",
        "status": 429,
        "retryable": True,
        "retry_after_s": 7.0,
    },
    {
        "error": "the provider's content filter stopped the reply",
        "error_kind": "blocked",
        "type": "content_filter",
    },
    {"error": "server_error"},
)
TOOLS = ("search", "calc", "watch")


def gen_chain_config(r: Rand) -> dict[str, Any]:
    """Small budgets and caps, so chains time out, loop and hit their caps in a few steps."""
    options: dict[str, tuple[Any, ...]] = {
        "first_token_timeout_s": (10.0, 20.0, 45.0),
        "idle_timeout_s": (10.0, 15.0),
        "settle_timeout_s": (0.0, 0.5, 2.0, 5.0),
        "tool_timeout_s": (1.0, 7.5),
        "max_iterations": (1, 2, 3, 5),
        "soft_warn_iteration": (1, 2, 20),
        "max_consecutive_tool_errors": (1, 2, 3),
        "surface_user_errors": (True, False),
        "drafting": (False, True),
        "max_follow_up_interrupts": (0, 1),
    }
    return {key: r.choice(values) for key, values in options.items() if r.chance(70)}


def _gen_call(r: Rand) -> dict[str, Any]:
    call = dict(r.choice(CALLS))
    if r.chance(10):
        call["truncated"] = True
    return call


def gen_chain_pass(r: Rand, b: Budgets, first: bool) -> list[dict[str, Any]]:
    """One provider pass; an attempt's first pass calls a tool more often, so that calls get
    completed before a later pass fails and a fallback must be told about them."""
    steps: list[dict[str, Any]] = []
    at = 0.0
    for _ in range(r.integer(0, 3) if r.chance(15) else r.integer(1, 3)):
        at = _time(r, b, at)
        if r.chance(20):
            steps.append({"at": at, "keepalive": True})
        else:
            steps.append({"at": at, "text": r.choice(TEXTS)})
    at = _time(r, b, at)
    kind = (
        "tool_call"
        if first and r.chance(35)
        else r.choice(
            (
                "tool_call",
                "completed",
                "empty",
                "tool_call",
                "tool_calls",
                "error",
                "error",
                "raise",
                "stall",
                "stall",
                "none",
                "completed",
            )
        )
    )
    if kind in ("completed", "empty"):
        steps.append({"at": at, "end": kind})
    elif kind == "tool_call":
        steps.append({"at": at, "tool_call": _gen_call(r)})
    elif kind == "tool_calls":
        steps.append({"at": at, "tool_calls": [_gen_call(r) for _ in range(r.integer(1, 2))]})
    elif kind == "error":
        steps.append({"at": at, **r.choice(ERRORS)})
    elif kind == "raise":
        steps.append({"at": at, "raise": "connection reset"})
    elif kind == "stall":
        stall: dict[str, Any] = {
            "at": at,
            "stall": True,
            "settles_after": r.choice((0.0, 0.5, 2.0, 9.0)),
        }
        if r.chance(50):
            stall["lands"] = r.choice(TEXTS)
        steps.append(stall)
    return steps


def gen_tool_outcome(r: Rand, b: Budgets, tool: str) -> dict[str, Any]:
    after = r.choice((0.0, 0.5, 2.0, b.tool - 0.5, b.tool, b.tool + 1.0))
    kind = r.choice(("success", "success", "success", "failure", "raise", "hang"))
    if kind == "hang":
        return {"hang": True}
    if kind == "raise":
        return {"after": after, "raise": "tool exploded"}
    if kind == "failure":
        return {"after": after, "success": False, "error": "not found"}
    if tool == "watch" and r.chance(75):
        data: Any = {
            "type": "context_restart_youtube",
            "enhanced_context_item": {"role": "user", "content": "<video summary>"},
        }
    else:
        data = {"answer": r.integer(1, 9)}
    return {"after": after, "success": True, "data": data}


def gen_chain(r: Rand) -> dict[str, Any]:
    """A generation turn's whole outside world, as JSON (printed when a chain fails)."""
    config = gen_chain_config(r)
    b = Budgets.of(config)
    attempts = [
        [
            gen_chain_pass(r, b, number == 0)
            for number in range(r.integer(1, 3) if r.chance(90) else 0)
        ]
        for _ in range(r.integer(1, 4))
    ]
    tools = {tool: [gen_tool_outcome(r, b, tool) for _ in range(r.integer(1, 3))] for tool in TOOLS}
    events: list[dict[str, Any]] = []
    if r.chance(35):
        events.append({"at": _event_time(r, b), "kill": True})
    if r.chance(15):
        events.append({"at": _event_time(r, b), "follow_up": True})
    # a `/kill` the instant attempt k reaches its terminal state, while it is wrapping up
    kill_as_attempt_ends = r.integer(0, len(attempts) - 1) if r.chance(15) else None
    channel: dict[str, Any] = {
        "kind": r.choice(("memory", "discord")),
        "fail_send": r.integer(1, 3) if r.chance(25) else None,
    }
    if channel["kind"] == "discord":
        channel["idle_flush_s"] = r.choice((5.0, None))
        channel["flush_paragraphs"] = r.chance(30)
    request = {
        "prefill": "Draft: " if r.chance(25) else "",
        "notices": ["[note: answer briefly]"] if r.chance(20) else [],
        "history": r.chance(20),
    }
    return {
        "config": config,
        "channel": channel,
        "request": request,
        "attempts": attempts,
        "tools": tools,
        "events": events,
        "kill_as_attempt_ends": kill_as_attempt_ends,
    }


def _event_time(r: Rand, b: Budgets) -> float:
    at = r.choice(
        (
            0.5 * r.integer(0, 12),
            2.5 * r.integer(1, 40),
            b.first_token,
            b.idle + 1.0,
            b.first_token + b.settle,
            2 * b.first_token + b.settle,
        )
    )
    return at + (r.choice((1e-6, 0.333333)) if r.chance(20) else 0.0)


@st.composite
def chains(draw: st.DrawFn) -> dict[str, Any]:
    return gen_chain(HypothesisRand(draw))


# ---------------------------------------------------------------------- outside world


class ChainProvider:
    """One attempt's model: the scenario's scripted provider, its error steps carrying the
    provider contract's details (kind, HTTP status, retryable, `retry_after_s`, type)."""

    name = "chain"

    def __init__(self, passes: list[list[dict[str, Any]]]) -> None:
        self.inner = ScriptedProvider(parse_scenario({"passes": passes}).passes)
        self.errors = [next((s for s in steps if "error" in s), None) for steps in passes]

    @property
    def calls(self) -> int:
        return self.inner.calls

    @property
    def requests(self) -> list[PassRequest]:
        return self.inner.requests

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        index = self.inner.calls
        spec = self.errors[index] if index < len(self.errors) else None
        return self._detailed(self.inner.stream(request, abort), spec)

    @staticmethod
    async def _detailed(
        events: AsyncIterator[ProviderEvent], spec: dict[str, Any] | None
    ) -> AsyncIterator[ProviderEvent]:
        async with aclosing(cast(Any, events)) as stream:
            async for event in stream:
                if isinstance(event, ProviderError) and spec is not None:
                    event = scripted_error(spec)
                yield event


def scripted_error(step: dict[str, Any]) -> ProviderError:
    """The provider error an error step stands for: the scripted provider's own, or the
    details the step carries (an HTTP status, retryable, `retry_after_s`, a block's type)."""
    if "error_kind" not in step:
        return ProviderError(
            kind="provider_stream_error", message=step["error"], type="scripted_error"
        )
    return ProviderError(
        kind=step["error_kind"],
        message=step["error"],
        type=step.get("type"),
        status=step.get("status"),
        retryable=step.get("retryable", False),
        retry_after_s=step.get("retry_after_s"),
    )


def _key(args: Any) -> str:
    return json.dumps(args, sort_keys=True, ensure_ascii=False)


class ChainTools:
    """The chain's tools, shared by its attempts (as the bot shares its registry): each call
    takes the tool's next scripted outcome and is recorded with the attempt it ran in."""

    def __init__(self, spec: dict[str, list[dict[str, Any]]]) -> None:
        self.current = -1
        self.runs: list[tuple[int, str, str]] = []
        self.registry = ToolRegistry(
            [
                FunctionTool[AnyArgs](
                    name=name,
                    description=f"chain tool {name}",
                    args_model=AnyArgs,
                    func=self._runner(name, outcomes),
                    guard="youtube" if name == "watch" else None,
                )
                for name, outcomes in spec.items()
            ]
        )

    def _runner(
        self, name: str, outcomes: list[dict[str, Any]]
    ) -> Callable[[AnyArgs, ToolContext], Coroutine[Any, Any, ToolResult]]:
        used = itertools.count()

        async def run(args: AnyArgs, _ctx: ToolContext) -> ToolResult:
            self.runs.append((self.current, name, _key(args.model_dump())))
            index = next(used)
            if index >= len(outcomes):
                return ToolResult.fail("no more outcomes")
            outcome = outcomes[index]
            if outcome.get("hang"):
                await asyncio.Event().wait()
            if outcome.get("after", 0) > 0:
                await asyncio.sleep(outcome["after"])
            if "raise" in outcome:
                raise RuntimeError(outcome["raise"])
            if outcome["success"]:
                return ToolResult.ok(outcome["data"])
            return ToolResult.fail(outcome["error"])

        return run


@dataclass
class ChannelLog:
    """What reached the channel, in order, with the attempt running at the time: `("text",
    attempt, text)` and `("notice", attempt, kind)`; `handed` is what the engine handed over
    (for a buffering channel, more than was sent)."""

    current: int = -1
    order: list[tuple[str, int, str]] = field(default_factory=list)
    handed: list[tuple[int, str]] = field(default_factory=list)

    def received(self, before: int) -> str:
        """The text received before the log had `before` entries."""
        return "".join(v for kind, _, v in self.order[:before] if kind == "text")

    def texts(self, attempt: int) -> str:
        return "".join(v for kind, a, v in self.order if kind == "text" and a == attempt)

    def notices(self, attempt: int) -> list[str]:
        return [v for kind, a, v in self.order if kind == "notice" and a == attempt]

    def own(self, attempt: int) -> str:
        return "".join(text for a, text in self.handed if a == attempt)


class MemoryChannel(InMemoryChannel):
    """The in-memory channel (no record of its own: the turn counts what it handed over);
    its `fail_send`-th delivery raises and is not received."""

    def __init__(self, log: ChannelLog, fail_send: int | None) -> None:
        super().__init__()
        self.log = log
        self.fail_send = fail_send
        self.deliveries = 0

    async def deliver(self, text: str) -> None:
        self.deliveries += 1
        if self.deliveries == self.fail_send:
            raise ConnectionError("the send failed")
        await super().deliver(text)
        self.log.order.append(("text", self.log.current, text))
        self.log.handed.append((self.log.current, text))

    async def post_notice(self, notice: Notice) -> None:
        await super().post_notice(notice)
        self.log.order.append(("notice", self.log.current, notice.kind))


class FakeDiscord:
    """The part of discord.py `DiscordChannel` uses: a messageable whose sends take no time
    and are logged as Discord received them; its `fail_send`-th text message fails as an HTTP
    error would."""

    def __init__(self, log: ChannelLog, fail_send: int | None) -> None:
        self.log = log
        self.fail_send = fail_send
        self.text_sends = 0
        self.ids = itertools.count(1)
        self.contents: dict[int, str] = {}
        self.position: dict[int, int] = {}
        self.http = SimpleNamespace(request=self._no_rest)  # only reactor look-ups use it

    @staticmethod
    async def _no_rest(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a generation chain makes no REST call but sends")

    def get_partial_messageable(self, _channel_id: int) -> FakeDiscord:
        return self

    async def send(self, **kwargs: Any) -> SimpleNamespace:
        message_id = next(self.ids)
        if kwargs.get("content") is not None:
            self.text_sends += 1
            if self.text_sends == self.fail_send:
                raise OSError("the send failed")
            # the text it accounts for is read back from the channel's record (`resolve`)
            self.contents[message_id] = kwargs["content"]
            self.position[message_id] = len(self.log.order)
            self.log.order.append(("text", self.log.current, ""))
        else:
            kind = KIND_BY_TITLE[kwargs["embed"].title]
            self.log.order.append(("notice", self.log.current, kind))
        return SimpleNamespace(id=message_id)


class RecordingDiscordChannel(DiscordChannel):
    """The real Discord channel over the fake Discord."""

    def __init__(self, log: ChannelLog, spec: dict[str, Any]) -> None:
        self.fake = FakeDiscord(log, spec["fail_send"])
        super().__init__(
            cast(discord.Client, self.fake),
            1,
            idle_flush_s=spec["idle_flush_s"],
            flush_paragraphs=spec["flush_paragraphs"],
        )
        self.log = log

    async def deliver(self, text: str) -> None:
        await super().deliver(text)
        self.log.handed.append((self.log.current, text))

    def resolve(self) -> None:
        """Check the channel's record against what Discord received (D2: every message that
        reached it, and only those, with what was sent) and log the text each accounts for."""
        assert [(m.message_id, m.content) for m in self.delivered] == list(
            self.fake.contents.items()
        ), "the channel's record is not what Discord received"
        for message in self.delivered:
            _, attempt, _ = self.log.order[self.fake.position[message.message_id]]
            self.log.order[self.fake.position[message.message_id]] = (
                "text",
                attempt,
                message.source,
            )


# ------------------------------------------------------------------------------ playing


@dataclass
class AttemptRun:
    index: int
    turn: Turn
    provider: ChainProvider
    start: float
    killed_before_start: bool
    sent_before: str
    """The channel's own account of what it delivered before the attempt began."""
    log_mark: int
    """How much of the channel log (what Discord or the in-memory channel received) was
    there when the attempt began."""
    pending_at_start: str
    """Text the channel still buffered, unsent, when the attempt began."""


@dataclass
class ChainRun:
    result: GenerationResult
    attempts: list[AttemptRun]
    log: ChannelLog
    end: float
    locks: ChannelLockRegistry
    stash: ContextStash
    runs: list[tuple[int, str, str]]
    kills: list[float]
    """When each `/kill` was issued, in chain time."""

    def events(self, raw: dict[str, Any]) -> list[dict[str, Any]]:
        """The kills as they were issued and the scripted follow-ups."""
        return [{"at": t, "kill": True} for t in self.kills] + [
            e for e in raw["events"] if e.get("follow_up")
        ]


def initial_request(raw: dict[str, Any]) -> TurnRequest:
    spec = raw["request"]
    history = [HistoryEntry(**EARLIER_CALL)] if spec["history"] else []
    return TurnRequest(
        context_items=[dict(item) for item in BASE_CONTEXT],
        prefill=spec["prefill"],
        request_notices=list(spec["notices"]),
        function_history=history,
    )


async def play_chain(raw: dict[str, Any]) -> ChainRun:
    """Play the chain on the running (virtual-time) loop; events fire at their chain times."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    config = TurnConfig.model_validate(raw["config"])
    locks = ChannelLockRegistry(max_follow_up_interrupts=config.max_follow_up_interrupts)
    lock = locks.try_acquire(CHANNEL, owner="chain")
    assert lock is not None
    stash = ContextStash()
    log = ChannelLog()
    spec = raw["channel"]
    discord_channel = RecordingDiscordChannel(log, spec) if spec["kind"] == "discord" else None
    channel = discord_channel or MemoryChannel(log, spec["fail_send"])
    tools = ChainTools(raw["tools"])
    providers = [ChainProvider(passes) for passes in raw["attempts"]]
    runs: list[AttemptRun] = []
    kills: list[float] = []
    killed = False

    def kill() -> None:
        nonlocal killed
        killed = True
        kills.append(loop.time() - t0)
        locks.request_stop(CHANNEL)

    class KillAsAttemptEnds:
        def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
            if dest in TERMINAL and len(runs) - 1 == raw["kill_as_attempt_ends"]:
                kill()

    def on_attempt(turn: Turn) -> None:
        index = len(runs)
        received = log.received(len(log.order))
        sent = discord_channel.delivered_text if discord_channel is not None else received
        pending = discord_channel.pending_text if discord_channel is not None else ""
        start = loop.time() - t0
        runs.append(
            AttemptRun(index, turn, providers[index], start, killed, sent, len(log.order), pending)
        )
        log.current = tools.current = index

    async def fire(event: dict[str, Any]) -> None:
        await asyncio.sleep(max(0.0, t0 + event["at"] - loop.time()))
        if event.get("kill"):
            kill()
        elif runs:
            runs[-1].turn.notify_follow_up()

    side = [loop.create_task(fire(event)) for event in raw["events"]]
    try:
        result = await run_generation_turn(
            [Attempt(p, f"model-{i}") for i, p in enumerate(providers)],
            channel=channel,
            locks=locks,
            lock=lock,
            request=initial_request(raw),
            config=config,
            tools=tools.registry,
            stash=stash,
            on_attempt=on_attempt,
            observer=KillAsAttemptEnds(),
        )
        end = loop.time() - t0
        if discord_channel is not None:
            discord_channel.resolve()
    finally:
        for task in side:
            task.cancel()
        await asyncio.gather(*side, return_exceptions=True)
        if discord_channel is not None:
            await discord_channel.aclose()
            await asyncio.sleep(0)  # `aclose` cancels its idle flush without awaiting it
        locks.release(lock)
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current]
    assert not left, f"tasks outlived the chain: {[t.get_name() for t in left]}"
    return ChainRun(result, runs, log, end, locks, stash, tools.runs, kills)


# -------------------------------------------------------------------------------- oracle


def model_failure(result: TurnResult, turn: Turn) -> bool:
    """G1: a failure of the model itself, in its own pass: the turn left a stream state for
    Done or TimedOut with an error, a timeout or an empty answer."""
    last = turn.transitions[-1]
    return result.status in MODEL_FAILURES and last["from"] in STREAM_STATES


def named_calls(notices: list[str]) -> Counter[tuple[str, str]]:
    """The calls the request-only notices name as completed by an earlier attempt."""
    return Counter(
        (m.group(1), _key(json.loads(m.group(2))))
        for notice in notices
        for m in NAMED_CALL.finditer(notice)
    )


def _squash(text: str) -> str:
    """Text without whitespace: a Discord channel drops whitespace-only messages and trims."""
    return "".join(text.split())


def attempt_raw(
    raw: dict[str, Any], events: list[dict[str, Any]], index: int, start: float
) -> dict[str, Any]:
    """The attempt as a scenario of its own: its script, its config, the chain's events from
    its start on, in its own time."""
    last = len(raw["attempts"]) - 1
    return {
        "name": f"attempt-{index}",
        "config": {**raw["config"], "fallback_pending": index < last},
        "passes": raw["attempts"][index],
        "events": [
            {**e, "at": max(0.0, e["at"] - start)} for e in events if e["at"] >= start - EPS
        ],
    }


def check_chain(raw: dict[str, Any], run: ChainRun) -> None:
    try:
        _check_chain(raw, run)
    except AssertionError as exc:
        exc.add_note(f"chain: {json.dumps(raw, ensure_ascii=False)}")
        for a in run.attempts:
            exc.add_note(f"attempt {a.index} from {a.start:g}: {a.turn.transitions}")
        raise


def _check_chain(raw: dict[str, Any], run: ChainRun) -> None:
    cfg = TurnConfig.model_validate(raw["config"])
    scripted = len(raw["attempts"])
    gen = run.result
    attempts = run.attempts
    results = gen.attempts
    n = len(attempts)
    discord_kind = raw["channel"]["kind"] == "discord"
    may_fail = raw["channel"]["fail_send"] is not None
    log = run.log

    # one TurnResult per attempt the chain ran, in order
    assert 1 <= n <= scripted and len(results) == n
    assert gen.labels == [f"model-{i}" for i in range(n)]
    final, final_turn = results[-1], attempts[-1].turn
    for a, result in zip(attempts, results, strict=True):
        assert result.state == a.turn.state

    # G1: an attempt begins only after the previous one failed as a model, at the instant it
    # ended; the chain ends at the first attempt that did not fail so, or after the last
    for a, result in zip(attempts[:-1], results[:-1], strict=True):
        assert model_failure(result, a.turn), (
            f"attempt {a.index} ended {result.state}/{result.status} and was replaced"
        )
    assert n == scripted or not model_failure(final, final_turn), (
        f"the chain stopped after a model failure with {scripted - n} attempt(s) left"
    )
    for prev, nxt in itertools.pairwise(attempts):
        assert abs(nxt.start - (prev.start + prev.turn.transitions[-1]["t"])) <= EPS
    assert abs(run.end - (attempts[-1].start + final_turn.transitions[-1]["t"])) <= EPS

    # exactly one terminal outcome: the last attempt's
    assert gen.status == final.status and gen.text == final.text

    # the notices each attempt's turn posted, and the one the chain may post after them
    posted = gen.deferred_notice_posted or gen.failure_notice_posted
    for a, result in zip(attempts, results, strict=True):
        extra = [posted] if posted is not None and a.index == n - 1 else []
        assert log.notices(a.index) == result.notices + extra

    # every attempt keeps the single-turn invariants, with its own config
    for a, result in zip(attempts, results, strict=True):
        view = SimpleNamespace(
            text=log.texts(a.index),
            notices=[Notice.of(cast(NoticeKind, k)) for k in result.notices],
        )
        played = Played(
            turn=a.turn,
            result=result,
            transitions=list(a.turn.transitions),
            channel=cast(InMemoryChannel, view),
            provider=cast(Any, a.provider),
            locks=run.locks,
            stash=run.stash,
        )
        check_played(
            played,
            attempt_raw(raw, run.events(raw), a.index, a.start),
            channel_keeps_record=discord_kind,
            delivery_may_fail=may_fail,
        )

    # the provider's own error (HTTP status, retryable, retry-after, a block) is what the
    # failed pass reports, untouched (S8, S13)
    for a, result in zip(attempts, results, strict=True):
        for number, pass_result in enumerate(result.passes):
            if pass_result.error is not None:
                step = next(s for s in raw["attempts"][a.index][number] if "error" in s)
                assert pass_result.error == scripted_error(step).as_dict()

    _check_continuation(raw, run)
    _check_delivery(run, discord_kind)
    _check_notices(cfg, run, scripted)
    _check_kill(run)


def _check_continuation(raw: dict[str, Any], run: ChainRun) -> None:
    """S1, G1, R10, T4: the prefill, the replayed calls and their notice; nothing re-run."""
    request = initial_request(raw)
    prefill = request.prefill
    completed: list[HistoryEntry] = list(request.function_history)
    for a, result in zip(run.attempts, run.result.attempts, strict=True):
        if a.index > 0:
            prefill += run.result.attempts[a.index - 1].delivered_text
        # the prefill is what the channel really showed when the attempt began (G1, S10, B15):
        # its own account, and what reached Discord (or the in-memory channel)
        assert request.prefill + a.sent_before == prefill, (
            f"attempt {a.index} continues from {prefill!r}, the channel had {a.sent_before!r}"
        )
        received = run.log.received(a.log_mark)
        assert request.prefill + received == prefill, (
            f"attempt {a.index} continues from {prefill!r}, the channel received {received!r}"
        )
        for number, pass_request in enumerate(a.provider.requests):
            kinds = [item["kind"] for item in pass_request.tail]
            assert kinds == sorted(kinds, key=TAIL_RANK.__getitem__), kinds
            if pass_request.function_history:
                # S1: folded into the first tool-call turn, not repeated at the end
                first = pass_request.function_history[0]
                assert pass_request.prefill == "" and "prefill" not in kinds
                if prefill.strip():
                    assert first.pre_tool_text.startswith(prefill)
            else:
                assert pass_request.prefill == prefill
                if prefill:
                    assert pass_request.tail[-1] == {
                        "kind": "prefill",
                        "role": "assistant",
                        "content": prefill,
                    }
            if number == 0:
                # what earlier attempts completed, replayed and named; no injected media
                assert pass_request.context_items == BASE_CONTEXT
                assert [
                    (e.tool_name, e.arguments, e.result) for e in pass_request.function_history
                ] == [(e.tool_name, e.arguments, e.result) for e in completed]
                replayed = completed[len(request.function_history) :]
                assert named_calls(pass_request.request_notices) == Counter(
                    (e.tool_name, _key(e.arguments)) for e in replayed
                )
        # a tool runs only when this attempt's own model asked for it; a truncated call never
        asked: Counter[tuple[str, str]] = Counter()
        for number, steps in enumerate(raw["attempts"][a.index][: a.provider.calls]):
            if not result.passes[number].tool_calls:
                continue
            step = next(s for s in steps if "tool_call" in s or "tool_calls" in s)
            calls = [step["tool_call"]] if "tool_call" in step else step["tool_calls"]
            asked.update((c["name"], _key(c["args"])) for c in calls if not c.get("truncated"))
        ran = Counter((name, args) for attempt, name, args in run.runs if attempt == a.index)
        assert not ran - asked, f"attempt {a.index} ran {ran - asked} its model never asked for"
        new = a.turn.function_history[len(a.turn.request.function_history) :]
        for entry in new:
            if entry.success:
                assert ran[(entry.tool_name, _key(entry.arguments))] > 0
                completed.append(entry)


def _check_delivery(run: ChainRun, discord_kind: bool) -> None:
    """G1, S10, B15: delivered text never shrinks, is never sent twice, is what was sent."""
    gen, log = run.result, run.log
    assert gen.delivered_text == "".join(r.delivered_text for r in gen.attempts)
    for a, result in zip(run.attempts, gen.attempts, strict=True):
        sent = log.texts(a.index)
        if discord_kind:
            # what Discord received during the attempt is the attempt's delivered text, and
            # it is the attempt's own: no buffer left by an earlier attempt (B16, fixed)
            assert result.delivered_text == sent
            assert a.pending_at_start == "", (
                f"attempt {a.index} began with {a.pending_at_start!r} still unsent"
            )
            assert _squash(log.own(a.index)).startswith(_squash(sent)), (
                f"attempt {a.index} sent {sent!r}, it handed over {log.own(a.index)!r}"
            )
        else:
            played = SimpleNamespace(turn=a.turn, transitions=a.turn.transitions)
            assert sent == result.delivered_text + landed_out_of(cast(Played, played))


def _check_notices(cfg: TurnConfig, run: ChainRun, scripted: int) -> None:
    """S12, G2: errors suppressed while an attempt remains; when the chain failed and its
    last attempt posted no error notice of its own, one notice last, for why that last
    attempt failed: its deferred timeout notice, else one naming the failure's kind (each
    attempt clears an earlier one's deferral). Never two error notices."""
    gen, log = run.result, run.log
    results = gen.attempts
    final = results[-1]
    deferred = final.deferred_notice
    for r in results[:-1]:
        assert not [k for k in r.notices if k.startswith("timeout_")]
    failure = failure_of(final)
    expected: str | None = None
    if (
        cfg.surface_user_errors
        and failure not in (None, "destination_unavailable")
        and not any(k in ERROR_NOTICES for k in final.notices)
    ):
        if failure == "timeout":
            expected = deferred
        else:
            assert failure is not None
            expected = NOTICE_BY_FAILURE[failure]
    is_timeout = expected is not None and expected.startswith("timeout_")
    assert gen.deferred_notice_posted == (expected if is_timeout else None)
    assert gen.failure_notice_posted == (None if is_timeout else expected)
    error_notices = [v for kind, _, v in log.order if kind == "notice" and v in ERROR_NOTICES]
    assert len(error_notices) <= 1, error_notices
    if expected is not None:
        assert log.order[-1] == ("notice", len(results) - 1, expected), "not posted last"
    assert gen.notices == [k for r in results for k in r.notices] + (
        [expected] if expected is not None else []
    )
    assert len(results) == scripted or not should_fall_back(final)


def _check_kill(run: ChainRun) -> None:
    """S7, S16, D3: a kill stops the whole chain at its instant; no attempt runs after it."""
    kills = sorted(run.kills)
    stopped = [
        a.index
        for a, r in zip(run.attempts, run.result.attempts, strict=True)
        if r.state == "Stopped"
    ]
    if not kills:
        assert not stopped
        return
    kill_at = kills[0]
    assert run.end <= kill_at + EPS, f"the chain ran until {run.end} past the kill {kill_at}"
    assert stopped in ([], [len(run.attempts) - 1])
    if stopped:
        assert abs(run.end - kill_at) <= EPS
    for a in run.attempts:
        if a.killed_before_start:
            assert a.provider.calls == 0
            assert a.turn.transitions == [
                {"t": 0.0, "event": "kill", "from": "Preparing", "to": "Stopped"}
            ]


def play_and_check_chain(raw: dict[str, Any]) -> ChainRun:
    run = run_virtual(lambda: play_chain(raw))
    check_chain(raw, run)
    return run


# --------------------------------------------------------------------------------- tests


@reliability_settings(ci_examples=500)
@given(raw=chains())
def test_generated_fallback_chains_keep_every_invariant(raw: dict[str, Any]) -> None:
    # covers G1, G2, S1, S10, S12, S13, S15, S16, S17, T4, T5, T6, R10, D2, D3 (and, per
    # attempt, everything `check_played` covers): generated chains of 1-4 attempts
    play_and_check_chain(raw)


def _chain(attempts: list[list[list[dict[str, Any]]]], **extra: Any) -> dict[str, Any]:
    """A hand-written chain in the generator's format."""
    raw: dict[str, Any] = {
        "config": {"first_token_timeout_s": 20.0, "idle_timeout_s": 10.0, "settle_timeout_s": 5.0},
        "channel": {"kind": "memory", "fail_send": None},
        "request": {"prefill": "", "notices": [], "history": False},
        "attempts": attempts,
        "tools": {tool: [] for tool in TOOLS},
        "events": [],
        "kill_as_attempt_ends": None,
    }
    raw.update(extra)
    return raw


DISCORD = {"kind": "discord", "fail_send": None, "idle_flush_s": 5.0, "flush_paragraphs": False}


def test_kill_while_a_failed_attempt_wraps_up_stops_the_whole_chain() -> None:
    # covers G1, S16, D3: a `/kill` that lands after an attempt timed out, before the chain
    # moved on, still stops the chain: the next attempt ends Stopped at once, its model never
    # called, and no timeout notice is posted (the user stopped it; not every attempt failed)
    raw = _chain(
        [
            [[{"at": 1.0, "text": "Partial"}, {"at": 2.0, "stall": True}]],
            [[{"at": 1.0, "text": " rest"}, {"at": 2.0, "end": "completed"}]],
        ],
        kill_as_attempt_ends=0,
    )
    run = play_and_check_chain(raw)
    _, second = run.attempts
    assert [r.state for r in run.result.attempts] == ["TimedOut", "Stopped"]
    assert second.killed_before_start and second.provider.calls == 0
    assert run.kills == [11.0] and run.end == 11.0
    assert run.result.deferred_notice_posted is None and run.log.notices(1) == []


def test_completed_calls_are_replayed_not_rerun_and_media_is_not_carried() -> None:
    # covers G1, S1, T7, R1, R10: a call completed before the primary failed is replayed and
    # named to the fallback, whose model never sees the restart's injected item; no tool runs
    # twice
    raw = _chain(
        [
            [
                [{"at": 1.0, "tool_call": {"name": "search", "args": {"q": "cats"}}}],
                [{"at": 1.0, "tool_call": {"name": "watch", "args": {"url": "v1"}}}],
                [
                    {"at": 1.0, "text": "Cats are"},
                    {
                        "at": 2.0,
                        "error": "overloaded",
                        "status": 503,
                        "error_kind": "http",
                        "retryable": True,
                    },
                ],
            ],
            [[{"at": 1.0, "text": " great."}, {"at": 2.0, "end": "completed"}]],
        ],
        tools={
            "search": [{"after": 0.5, "success": True, "data": {"answer": 1}}],
            "calc": [],
            "watch": [
                {
                    "after": 0.5,
                    "success": True,
                    "data": {
                        "type": "context_restart_youtube",
                        "enhanced_context_item": {"role": "user", "content": "<video summary>"},
                    },
                }
            ],
        },
    )
    run = play_and_check_chain(raw)
    fallback = run.attempts[1].provider.requests[0]
    assert [e.tool_name for e in fallback.function_history] == ["search"]
    assert named_calls(fallback.request_notices) == Counter({("search", '{"q": "cats"}'): 1})
    # the delivered text is folded into the replayed call's turn (S1), not repeated last
    assert fallback.context_items == BASE_CONTEXT and fallback.prefill == ""
    assert fallback.function_history[0].pre_tool_text == "Cats are"
    assert [(a, name) for a, name, _ in run.runs] == [(0, "search"), (0, "watch")]
    assert run.result.status == "completed" and run.result.delivered_text == "Cats are great."


def test_b16_text_a_timed_out_attempt_left_unsent_is_not_sent_inside_the_fallback() -> None:
    # covers G1, S10, D1, D2: what the user sees is the fallback's prefill, then its own text
    raw = _chain(
        [
            [[{"at": 1.0, "text": "Hello wor"}, {"at": 2.0, "stall": True}]],
            [[{"at": 1.0, "text": "Hi there."}, {"at": 2.0, "end": "completed"}]],
        ],
        channel=DISCORD,
    )
    run = run_virtual(lambda: play_chain(raw))
    seen = "".join(text for kind, _, text in run.log.order if kind == "text")
    prefill = run.attempts[1].provider.requests[0].prefill
    assert seen == prefill + "Hi there.", (seen, prefill)  # today "Hello worHi there.", ""


def test_b16_text_landing_within_the_settle_wait_is_in_the_continuation() -> None:
    # covers S10, S13, G1
    raw = _chain(
        [
            [
                [
                    {"at": 1.0, "text": "Hello.\n\n"},
                    {"at": 2.0, "stall": True, "settles_after": 1.0, "lands": "World.\n\n"},
                ]
            ],
            [[{"at": 1.0, "text": "Bye."}, {"at": 2.0, "end": "completed"}]],
        ],
        channel=DISCORD,
    )
    run = run_virtual(lambda: play_chain(raw))
    primary = run.result.attempts[0]
    assert primary.passes[0].text == "Hello.\n\nWorld.\n\n"
    assert primary.delivered_text == primary.passes[0].text  # today "Hello.\n\n"
    assert run.attempts[1].provider.requests[0].prefill == "Hello.\n\nWorld.\n\n"
