"""Item 3: the typical turn on our engine, pydantic-ai and LangGraph, side by side.

Same workload on all three (see `workload`): three model passes streaming the same 100
chunks, `get_weather` after the first, `peek_profile_picture` after the second (for the peers
an ordinary second tool call whose result carries the context item; for us a context
restart), then the final answer. Zero-latency model and tools, offline. Every streamed
chunk is delivered to a list, as our in-memory channel does.

- pydantic-ai: an `Agent` on a `FunctionModel(stream_function=...)` that yields the chunks as
  `str` and the call as a `DeltaToolCall`; run with `agent.run(..., event_stream_handler=...)`,
  the handler collecting `TextPart`/`TextPartDelta` content.
- LangGraph: the prebuilt tool-calling agent `langgraph.prebuilt.create_react_agent` (in
  langgraph 1.x it is deprecated in favour of `langchain.agents.create_agent`, which lives in
  the separate `langchain` package; the prebuilt one is what langgraph itself ships) on a fake
  chat model with a native `_astream` yielding one `AIMessageChunk` per chunk and the call as
  `tool_call_chunks`; consumed with `graph.astream(..., stream_mode="messages")`.

Our turn runs with the journal on (the production setting), so it carries work the peers
do not do.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .common import Clock, Section, median, run_async
from .workload import (
    RESTART,
    WEATHER,
    Engine,
    PassPlan,
    check_typical,
    typical_plan,
)

GOAL_SPEEDUP = 2.0
PROMPT = "What's the weather in Oslo, and what is on my avatar?"

TurnFn = Callable[[], Awaitable[str]]


def _expected_text(plan: tuple[PassPlan, ...]) -> str:
    return "".join(t for p in plan for t in p.texts)


# ------------------------------------------------------------------ ours


def ours(plan: tuple[PassPlan, ...]) -> TurnFn:
    engine = Engine(journal=True)

    async def turn() -> str:
        result = await engine.typical_turn(plan=plan)
        check_typical(result, plan)
        return result.delivered_text

    return turn


# ------------------------------------------------------------------ pydantic-ai


def pydantic_ai_available() -> bool:
    try:
        import pydantic_ai  # noqa: F401
    except ImportError:
        return False
    return True


def pydantic_ai(plan: tuple[PassPlan, ...]) -> TurnFn:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        PartDeltaEvent,
        PartStartEvent,
        TextPart,
        TextPartDelta,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

    calls = [(p.call[0], json.dumps(p.call[1]), p.call[2]) if p.call else None for p in plan]

    async def stream_function(messages: list[ModelMessage], info: AgentInfo
                              ) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
        done = sum(1 for m in messages if isinstance(m, ModelRequest)
                   for part in m.parts if isinstance(part, ToolReturnPart))
        for text in plan[done].texts:
            yield text
        call = calls[done]
        if call is not None:
            yield {0: DeltaToolCall(name=call[0], json_args=call[1], tool_call_id=call[2])}

    agent = Agent(FunctionModel(stream_function=stream_function), name="bench")

    @agent.tool_plain
    async def get_weather(city: str) -> dict[str, Any]:
        """Current weather in a city."""
        return dict(WEATHER, city=city)

    @agent.tool_plain
    async def peek_profile_picture(user: str) -> dict[str, Any]:
        """Look at a user's avatar."""
        return RESTART

    async def turn() -> str:
        delivered: list[str] = []

        async def handler(_ctx: Any, events: AsyncIterator[Any]) -> None:
            async for event in events:
                if isinstance(event, PartDeltaEvent):
                    if isinstance(event.delta, TextPartDelta):
                        delivered.append(event.delta.content_delta)
                elif isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                    delivered.append(event.part.content)

        result = await agent.run(PROMPT, event_stream_handler=handler)
        returns = [p for m in result.all_messages() if isinstance(m, ModelRequest)
                   for p in m.parts if isinstance(p, ToolReturnPart)]
        assert [r.tool_name for r in returns] == ["get_weather", "peek_profile_picture"]
        assert returns[1].content == RESTART
        return "".join(delivered)

    return turn


# ------------------------------------------------------------------ LangGraph


def langgraph_available() -> bool:
    try:
        import langchain_core  # noqa: F401
        import langgraph.prebuilt  # noqa: F401
    except ImportError:
        return False
    return True


def langgraph(plan: tuple[PassPlan, ...]) -> TurnFn:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
    from langchain_core.tools import tool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

    def pass_of(messages: list[BaseMessage]) -> PassPlan:
        return plan[sum(1 for m in messages if isinstance(m, ToolMessage))]

    class FakeStreamingChat(BaseChatModel):
        """Streams the planned chunks natively (no thread hop), then the planned call."""

        @property
        def _llm_type(self) -> str:
            return "bench-fake-streaming"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: list[BaseMessage], stop: Any = None,
                      run_manager: Any = None, **kwargs: Any) -> ChatResult:
            p = pass_of(messages)
            calls = ([{"name": p.call[0], "args": p.call[1], "id": p.call[2]}]
                     if p.call else [])
            message = AIMessage(content="".join(p.texts), tool_calls=calls)
            return ChatResult(generations=[ChatGeneration(message=message)])

        async def _astream(self, messages: list[BaseMessage], stop: Any = None,
                           run_manager: Any = None, **kwargs: Any
                           ) -> AsyncIterator[ChatGenerationChunk]:
            p = pass_of(messages)
            for text in p.texts:
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=text))
                if run_manager is not None:
                    await run_manager.on_llm_new_token(text, chunk=chunk)
                yield chunk
            if p.call is not None:
                name, args, call_id = p.call
                yield ChatGenerationChunk(message=AIMessageChunk(
                    content="", tool_call_chunks=[{"name": name, "args": json.dumps(args),
                                                   "id": call_id, "index": 0}]))

    @tool
    async def get_weather(city: str) -> dict[str, Any]:
        """Current weather in a city."""
        return dict(WEATHER, city=city)

    @tool
    async def peek_profile_picture(user: str) -> dict[str, Any]:
        """Look at a user's avatar."""
        return RESTART

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = create_react_agent(FakeStreamingChat(), [get_weather, peek_profile_picture])

    async def turn() -> str:
        delivered: list[str] = []
        tool_names: list[str] = []
        async for message, _meta in graph.astream({"messages": [("user", PROMPT)]},
                                                  stream_mode="messages"):
            if isinstance(message, AIMessageChunk):
                if message.content:
                    delivered.append(message.content)  # type: ignore[arg-type]
            elif isinstance(message, ToolMessage):
                tool_names.append(message.name or "")
        assert tool_names == ["get_weather", "peek_profile_picture"], tool_names
        return "".join(delivered)

    return turn


# ------------------------------------------------------------------ the comparison


async def time_turns(turn: TurnFn, turns: int, expected: str) -> float:
    assert await turn() == expected  # warm, and check the workload really ran
    with Clock() as clock:
        for _ in range(turns):
            text = await turn()
    assert text == expected
    return clock.wall / turns


def contenders(plan: tuple[PassPlan, ...]) -> dict[str, Callable[[], TurnFn]]:
    out: dict[str, Callable[[], TurnFn]] = {"ours": lambda: ours(plan)}
    if pydantic_ai_available():
        out["pydantic-ai"] = lambda: pydantic_ai(plan)
    if langgraph_available():
        out["langgraph"] = lambda: langgraph(plan)
    return out


def measure(turns: int = 200, repeats: int = 5) -> Section:
    section = Section("peers", f"3. Peers, typical turn ({turns} turns × {repeats} repeats)")
    plan = typical_plan()
    expected = _expected_text(plan)
    makers = contenders(plan)
    samples: dict[str, list[float]] = {name: [] for name in makers}

    async def one_round() -> None:
        for name, make in makers.items():
            samples[name].append(await time_turns(make(), turns, expected))

    for _ in range(repeats):
        run_async(one_round)
    per_turn = {name: median(values) for name, values in samples.items()}
    for name, seconds in per_turn.items():
        section.add(f"{name}: time per typical turn", 1e6 * seconds, "µs",
                    note=f"{1 / seconds:,.0f} turns/s")
    peers = {k: v for k, v in per_turn.items() if k != "ours"}
    missing = [p for p in ("pydantic-ai", "langgraph") if p not in per_turn]
    if peers:
        fastest = min(peers, key=lambda k: peers[k])
        # the speed-up of each repeat, side by side, then the median
        speedups = [min(samples[p][i] for p in peers) / samples["ours"][i]
                    for i in range(repeats)]
        section.judged("our turn vs the faster peer (speed-up)", speedups, "×",
                       goal=f"≥ {GOAL_SPEEDUP}×", at_least=GOAL_SPEEDUP,
                       note=f"faster peer: {fastest}"
                       + (f"; not installed: {', '.join(missing)}" if missing else ""))
    else:
        section.add("our turn vs the faster peer (speed-up)", float("nan"), "×",
                    f"≥ {GOAL_SPEEDUP}×", None, "no peer installed (pip install '.[bench]')")
    section.details["samples_s_per_turn"] = samples
    section.details["missing"] = missing
    return section
