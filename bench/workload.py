"""The workloads, defined once and used by our engine and by the peers alike.

The typical turn (items 2, 3, 6) is three model passes and two tool runs:

1. 40 text chunks, then a call of `get_weather(city="Oslo")`;
2. 20 text chunks, then a call of `peek_profile_picture(user="ana")`, whose result is a
   `context_restart_image` with an inline context item (our engine: a context restart);
3. 40 text chunks and a normal stop.

That is 100 chunks, one ordinary tool call, one context restart and a final answer. The
provider and the tools answer at once (zero latency): what is measured is the framework.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from fsm import (
    AbortSignal,
    ChannelLock,
    ChannelLockRegistry,
    Finish,
    FunctionTool,
    PassRequest,
    ProviderEvent,
    TextDelta,
    ToolCallRequest,
    ToolContext,
    ToolRegistry,
    ToolResult,
    Turn,
    TurnConfig,
    TurnObserver,
    TurnResult,
)
from fsm.journal import JournalRecorder
from fsm.scenarios.scripted import InMemoryChannel

_WORDS = ("The ", "weather ", "in ", "Oslo ", "is ", "cold, ", "and ", "your ", "avatar ",
          "shows ", "a ", "cat ", "wearing ", "a ", "tiny ", "hat. ", "Anything ", "else? ")


def chunk_texts(n: int) -> list[str]:
    """`n` token-sized text chunks (distinct objects are not needed: strings are shared)."""
    return [_WORDS[i % len(_WORDS)] for i in range(n)]


PASS_CHUNKS = (40, 20, 40)
"""Chunks per pass of the typical turn: 100 in all."""

WEATHER = {"city": "Oslo", "temp_c": -3, "sky": "snow"}
PICTURE_ITEM = {"role": "user", "content": "<profile picture of ana: a cat in a tiny hat>"}
RESTART = {"type": "context_restart_image", "enhanced_context_item": PICTURE_ITEM}


@dataclass(frozen=True, slots=True)
class PassPlan:
    texts: tuple[str, ...]
    call: tuple[str, dict[str, Any], str] | None  # (name, arguments, call id)


def typical_plan(chunks: tuple[int, int, int] = PASS_CHUNKS) -> tuple[PassPlan, ...]:
    texts = chunk_texts(sum(chunks))
    a, b, _ = chunks
    return (
        PassPlan(tuple(texts[:a]), ("get_weather", {"city": "Oslo"}, "call_1")),
        PassPlan(tuple(texts[a:a + b]), ("peek_profile_picture", {"user": "ana"}, "call_2")),
        PassPlan(tuple(texts[a + b:]), None),
    )


# ------------------------------------------------------------------ our engine's side


class PlanProvider:
    """A zero-latency provider: each pass is an async generator that never awaits."""

    name = "bench"

    def __init__(self, plan: tuple[PassPlan, ...]) -> None:
        self.plan = plan
        self.calls = 0

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        index = self.calls
        self.calls += 1
        return _play(self.plan[index])


async def _play(plan: PassPlan) -> AsyncIterator[ProviderEvent]:
    for text in plan.texts:
        yield TextDelta(text)
    if plan.call is not None:
        name, args, call_id = plan.call
        yield ToolCallRequest(name=name, arguments=args, id=call_id)
        yield Finish("tool_calls")
    else:
        yield Finish("stop")


class TextProvider:
    """One pass of `texts` as TextDelta events, optionally yielding to the loop each chunk
    (`await asyncio.sleep(0)`, closer to real I/O). Nothing else is yielded."""

    name = "bench-text"

    def __init__(self, texts: list[str], yield_each: bool = False) -> None:
        self.texts = texts
        self.yield_each = yield_each

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        return text_source(self.texts, self.yield_each)


async def text_source(texts: list[str], yield_each: bool) -> AsyncIterator[TextDelta]:
    if yield_each:
        import asyncio

        sleep = asyncio.sleep
        for text in texts:
            await sleep(0)
            yield TextDelta(text)
    else:
        for text in texts:
            yield TextDelta(text)


class StallProvider:
    """A provider that never sends a first token; it honours the abort (S3)."""

    name = "bench-stall"

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        return _stall(abort)


async def _stall(abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
    await abort.wait()
    return
    yield  # pragma: no cover - makes this an async generator


class CityArgs(BaseModel):
    city: str


class UserArgs(BaseModel):
    user: str


async def get_weather(args: CityArgs, ctx: ToolContext) -> ToolResult:
    return ToolResult.ok(dict(WEATHER, city=args.city))


async def peek_profile_picture(args: UserArgs, ctx: ToolContext) -> ToolResult:
    return ToolResult.ok(RESTART)


def tool_registry() -> ToolRegistry:
    """The bot's tools: shared by all turns, as in production."""
    return ToolRegistry([
        FunctionTool(name="get_weather", description="Current weather in a city.",
                     args_model=CityArgs, func=get_weather),
        FunctionTool(name="peek_profile_picture", description="Look at a user's avatar.",
                     args_model=UserArgs, func=peek_profile_picture, guard="image"),
    ])


class Engine:
    """What a bot process holds once: the lock registry, the config and the tools."""

    def __init__(self, journal: bool = True) -> None:
        self.locks = ChannelLockRegistry()
        # The per-chunk workload streams far more than one reply may deliver (D5).
        self.config = TurnConfig(max_delivered_chars=10**9)
        self.tools = tool_registry()
        self.journal = journal

    def turn(self, channel_id: str, provider: Any, observer: TurnObserver | None = None
             ) -> tuple[Turn, ChannelLock, InMemoryChannel]:
        lock = self.locks.try_acquire(channel_id, owner="bench")
        assert lock is not None, f"channel {channel_id} is busy"
        channel = InMemoryChannel()
        recorder = JournalRecorder(channel_id, self.config, self.tools) if self.journal else None
        turn = Turn(provider=provider, channel=channel, locks=self.locks, lock=lock,
                    tools=self.tools, config=self.config, observer=observer, recorder=recorder)
        return turn, lock, channel

    async def run_turn(self, channel_id: str, provider: Any) -> tuple[TurnResult, InMemoryChannel]:
        turn, lock, channel = self.turn(channel_id, provider)
        try:
            result = await turn.run()
        finally:
            self.locks.release(lock)
        return result, channel

    async def typical_turn(self, channel_id: str = "bench",
                           plan: tuple[PassPlan, ...] | None = None) -> TurnResult:
        plan = plan if plan is not None else typical_plan()
        result, _channel = await self.run_turn(channel_id, PlanProvider(plan))
        return result


def check_typical(result: TurnResult, plan: tuple[PassPlan, ...] | None = None) -> None:
    """The typical turn really did what it claims (so a broken engine cannot look fast)."""
    plan = plan if plan is not None else typical_plan()
    assert result.status == "completed", result.status
    assert len(result.passes) == 3, result.passes
    assert result.function_history == ["get_weather"], result.function_history
    assert result.flags["disable_profile_picture_processing"], result.flags
    assert result.context_items_added == 1
    assert result.delivered_text == "".join(t for p in plan for t in p.texts)
