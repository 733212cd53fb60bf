"""The real-server tier: the provider layer and the engine against llama.cpp's own server on
loopback, with tiny generated models (issue 14). Opt-in: every test is skipped unless
TURN_LLAMA_SERVER names a llama-server binary (see README.md, "Against a real server").

Real processes run in real time; the one timed behaviour, the engine's idle timeout after
SIGSTOP, runs in virtual time once the server is stopped (looptime is switched on for that
phase only: while the server still streams, a virtual clock would fast-forward through the
real waits for its bytes)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fsm.engine.config import TurnConfig
from fsm.engine.generation import Attempt, run_generation_turn
from fsm.engine.locks import ChannelLock, ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.provider import AbortSignal, HistoryEntry, PassRequest, ToolCallRequest
from fsm.engine.turn import Turn
from fsm.scenarios.scripted import InMemoryChannel
from providers.factory import build_provider
from providers.http import SSEProvider
from providers.replay_server import ReplayServer
from providers.result import StreamSummary

from llama_support import (
    SENTENCE,
    THOUGHT,
    LlamaServer,
    make_model,
    running,
    server_binary,
    supports,
)
from providers_support import config_for, sse

pytestmark = pytest.mark.asyncio

WEATHER_TOOL = {"name": "get_weather", "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}
BOUND_S = 60.0
"""How long a step may take before the test fails: a bound for a broken run, never a wait."""


@pytest.fixture(scope="module")
def binary() -> Path:
    return server_binary()


@pytest.fixture(scope="module")
def models(binary: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("llama-models")
    return {end: make_model(directory, end)
            for end in ("eos", "loop", "tool", "think", "think-tool")}


@pytest.fixture(scope="module")
def eos_server(binary: Path, models: dict[str, Path]) -> Iterator[LlamaServer]:
    yield from running(binary, models["eos"])


@pytest.fixture(scope="module")
def loop_server(binary: Path, models: dict[str, Path]) -> Iterator[LlamaServer]:
    yield from running(binary, models["loop"], ctx=4096)


@pytest.fixture(scope="module")
def tool_server(binary: Path, models: dict[str, Path]) -> Iterator[LlamaServer]:
    yield from running(binary, models["tool"])


@pytest.fixture(scope="module")
def small_context_server(binary: Path, models: dict[str, Path]) -> Iterator[LlamaServer]:
    yield from running(binary, models["eos"], ctx=256)


def reasoning_server(binary: Path, model: Path, reasoning_format: str) -> Iterator[LlamaServer]:
    if not supports(binary, "--reasoning-format"):
        pytest.skip("this llama-server build has no --reasoning-format")
    yield from running(binary, model, extra=("--reasoning-format", reasoning_format))


@pytest.fixture(scope="module")
def parsed_think_server(binary: Path, models: dict[str, Path]) -> Iterator[LlamaServer]:
    """Reasoning split out by the server (`reasoning_content`)."""
    yield from reasoning_server(binary, models["think"], "deepseek")


@pytest.fixture(scope="module")
def raw_think_server(binary: Path, models: dict[str, Path]) -> Iterator[LlamaServer]:
    """Reasoning left in the content as a `<think>` block."""
    yield from reasoning_server(binary, models["think"], "none")


@pytest.fixture(scope="module")
def think_tool_server(binary: Path, models: dict[str, Path]) -> Iterator[LlamaServer]:
    yield from reasoning_server(binary, models["think-tool"], "deepseek")


@pytest.fixture
def own_loop_server(binary: Path, models: dict[str, Path]) -> Iterator[LlamaServer]:
    """A server a test may kill or stop."""
    yield from running(binary, models["loop"], ctx=4096)


def ask(text: str = "hi", **fields: Any) -> PassRequest:
    return PassRequest(context_items=[{"role": "user", "content": text}], function_history=[],
                       **fields)


async def summarize(server: LlamaServer, request: PassRequest,
                    **config: Any) -> StreamSummary:
    summary = StreamSummary()
    async with aiohttp.ClientSession() as session:
        provider = build_provider(config_for(server.url, "openai", model="chain", **config),
                                  session)
        async for event in provider.stream(request, AbortSignal()):
            summary.add(event)
    return summary


def channel_lock() -> tuple[ChannelLockRegistry, ChannelLock]:
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "llama")
    assert lock is not None
    return locks, lock


class WatchedChannel(InMemoryChannel):
    """Tells the test when the first text has arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.first_text = asyncio.Event()

    async def deliver(self, text: str) -> None:
        await super().deliver(text)
        self.first_text.set()


def streaming_turn(server: LlamaServer, session: aiohttp.ClientSession, channel: InMemoryChannel,
                   config: TurnConfig | None = None) -> tuple[Turn, ChannelLockRegistry]:
    locks, lock = channel_lock()
    provider = build_provider(config_for(server.url, "openai", model="chain"), session)
    turn = Turn(provider=provider, channel=channel, locks=locks, lock=lock,
                config=config or TurnConfig())
    return turn, locks


async def server_says(server: LlamaServer, pattern: str, start: int) -> bool:
    return await asyncio.to_thread(server.wait_for, pattern, BOUND_S, start)


# --- replies ---------------------------------------------------------------------------------


async def test_plain_reply(eos_server: LlamaServer) -> None:
    """covers S8: the whole sentence, the server's finish word, its usage."""
    summary = await summarize(eos_server, ask())
    assert "".join(summary.text) == SENTENCE
    assert summary.finish_reason == "stop" and summary.error is None
    assert summary.usage is not None and summary.usage.output_tokens == 11  # 10 + end


async def test_plain_reply_through_the_engine(eos_server: LlamaServer) -> None:
    """covers S8: a turn over the real server completes with the text delivered."""
    channel = InMemoryChannel()
    async with aiohttp.ClientSession() as session:
        turn, _ = streaming_turn(eos_server, session, channel)
        result = await asyncio.wait_for(turn.run(), BOUND_S)
    assert result.status == "completed" and channel.text == SENTENCE


async def test_max_tokens(loop_server: LlamaServer) -> None:
    """covers T4, P6: the output limit stops the loop model after five tokens, finish
    `length`: a cut reply, not a complete one."""
    summary = await summarize(loop_server, ask(), max_output_tokens=5)
    assert "".join(summary.text) == " The quick brown fox jumps"
    assert summary.finish_reason == "length"
    assert summary.error is not None and summary.error.type == "truncated"  # P6: not an answer


async def test_stop_sequence(eos_server: LlamaServer) -> None:
    """covers S8: a stop sequence ends the reply before it, finish `stop`."""
    summary = await summarize(eos_server, ask(), extra_body={"stop": [" fox"]})
    assert "".join(summary.text) == " The quick brown"
    assert summary.finish_reason == "stop"


async def test_tool_call_through_jinja(tool_server: LlamaServer) -> None:
    """covers T4: with --jinja the server parses the model's <tool_call> into a real call."""
    summary = await summarize(tool_server, ask("weather in Paris?", tools=[WEATHER_TOOL]))
    assert summary.error is None, summary.error
    [call] = summary.tool_calls
    assert (call.name, call.arguments, call.truncated) == ("get_weather", {"city": "Paris"},
                                                            False)
    assert call.id


# --- reasoning (--reasoning-format) ------------------------------------------------------------


async def test_reasoning_split_out_by_the_server(parsed_think_server: LlamaServer) -> None:
    """covers P4: `--reasoning-format deepseek` streams the think block as reasoning_content:
    reasoning, and only the sentence is text."""
    summary = await summarize(parsed_think_server, ask())
    assert summary.error is None, summary.error
    assert ("".join(summary.reasoning), "".join(summary.text)) == (THOUGHT, SENTENCE)


async def test_reasoning_left_in_the_content_is_moved_out(raw_think_server: LlamaServer) -> None:
    """covers P4: `--reasoning-format none` leaves `<think>…</think>` in the content, token by
    token; the think filter moves it to reasoning, so the engine delivers only the answer."""
    summary = await summarize(raw_think_server, ask())
    assert ("".join(summary.reasoning), "".join(summary.text)) == (THOUGHT, SENTENCE.lstrip())
    channel = InMemoryChannel()
    async with aiohttp.ClientSession() as session:
        turn, _ = streaming_turn(raw_think_server, session, channel)
        result = await asyncio.wait_for(turn.run(), BOUND_S)
    assert result.status == "completed" and channel.text == SENTENCE.lstrip()
    assert "think" not in channel.text and result.passes[0].reasoning == THOUGHT


async def test_reasoning_content_goes_back_with_its_tool_call(
    think_tool_server: LlamaServer,
) -> None:
    """covers P5: the pass's reasoning_content rides on its call into the history and goes
    back on the tool-call turn; the server accepts it and its chat template renders it as
    the turn's think block (llama.cpp's /apply-template shows the prompt it built). Three
    requests in a row on one pooled connection: the server may close it under the next one,
    which the client sends again (P8)."""
    async with aiohttp.ClientSession() as session:
        provider: SSEProvider = build_provider(
            config_for(think_tool_server.url, "openai", model="chain"), session)
        request = ask("weather in Paris?", tools=[WEATHER_TOOL])
        events = [e async for e in provider.stream(request, AbortSignal())]
        [call] = [e for e in events if isinstance(e, ToolCallRequest)]
        assert call.reasoning is not None
        entry = HistoryEntry(call.name, call.arguments, {"success": True, "data": "sunny"},
                             call_id=call.id, reasoning=call.reasoning)
        follow = PassRequest(context_items=request.context_items, function_history=[entry],
                             tools=[WEATHER_TOOL])
        body = provider.request_body(follow)
        root = think_tool_server.url.removesuffix("/v1")
        async with aiohttp.ClientSession() as own, \
                own.post(f"{root}/apply-template", json=body) as response:
            prompt = (await response.json())["prompt"]
        second = StreamSummary()
        async for event in provider.stream(follow, AbortSignal()):
            second.add(event)
    assert body["messages"][1]["reasoning_content"] == THOUGHT
    assert f"<think>{THOUGHT}</think>" in prompt and "<tool_response>" in prompt
    assert second.error is None and second.tool_calls  # accepted (this model calls again)


# --- failures ----------------------------------------------------------------------------------


async def test_context_overflow_is_named_and_the_user_told(
    small_context_server: LlamaServer,
) -> None:
    """covers G1, G2: HTTP 400 "exceeds the available context size" is
    context_length_exceeded; on the last attempt the channel gets the notice saying so."""
    channel = InMemoryChannel()
    long_prompt = "word " * 400
    async with aiohttp.ClientSession() as session:
        locks, lock = channel_lock()
        provider = build_provider(config_for(small_context_server.url, "openai", model="chain"),
                                  session)
        result = await asyncio.wait_for(run_generation_turn(
            [Attempt(provider, "llama")], channel=channel, locks=locks, lock=lock,
            request=TurnRequest(context_items=[{"role": "user", "content": long_prompt}])),
            BOUND_S)
    [attempt] = result.attempts
    error = attempt.passes[-1].error
    assert error is not None and (error["status"], error["type"]) == (400,
                                                                      "context_length_exceeded")
    assert "exceeds the available context size" in error["message"]
    assert [n.kind for n in channel.notices] == ["failed_context_too_long"]


async def test_kill_mid_stream_cancels_the_servers_task(loop_server: LlamaServer) -> None:
    """covers S7, S3: /kill closes the connection at once; the server logs that it cancelled
    the generation."""
    channel = WatchedChannel()
    start = len(loop_server.lines)
    async with aiohttp.ClientSession() as session:
        turn, locks = streaming_turn(loop_server, session, channel)
        task = asyncio.create_task(turn.run())
        await asyncio.wait_for(channel.first_text.wait(), BOUND_S)
        locks.request_stop("c")
        result = await asyncio.wait_for(task, BOUND_S)
    assert result.status == "stopped_by_user" and channel.text.startswith(" The")
    assert await server_says(loop_server, r"cancel task", start), loop_server.log()


async def test_server_killed_mid_stream_is_an_error_with_the_text_kept(
    own_loop_server: LlamaServer,
) -> None:
    """covers S8, S15, G1: the process dies mid-reply: an error the chain falls back on
    (not a completed reply), the delivered text kept."""
    channel = WatchedChannel()
    async with aiohttp.ClientSession() as session:
        turn, _ = streaming_turn(own_loop_server, session, channel)
        task = asyncio.create_task(turn.run())
        await asyncio.wait_for(channel.first_text.wait(), BOUND_S)
        own_loop_server.signal(signal.SIGKILL)
        result = await asyncio.wait_for(task, BOUND_S)
    assert result.status == "error" and result.passes[-1].error is not None
    assert result.passes[-1].error["type"] in {"connection_error", "incomplete_stream"}
    assert channel.text.startswith(" The") and result.delivered_text == channel.text


async def test_sigstop_is_an_idle_timeout(own_loop_server: LlamaServer) -> None:
    """covers S5, S10, S11: a server that stops mid-stream (SIGSTOP: connection open, no
    bytes) ends the pass at the idle budget; measured in virtual time once it is stopped."""
    channel = WatchedChannel()
    config = TurnConfig(idle_timeout_s=30, settle_timeout_s=5)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        turn, _ = streaming_turn(own_loop_server, session, channel, config)
        started = loop.time()
        task = asyncio.create_task(turn.run())
        await asyncio.wait_for(channel.first_text.wait(), BOUND_S)
        own_loop_server.signal(signal.SIGSTOP)
        stopped = loop.time() - started
        with loop.looptime_enabled():
            result = await task
    assert result.status == "timeout"
    [timeout] = [t for t in turn.transitions if t["event"] == "idle_timeout"]
    assert 30.0 <= timeout["t"] <= stopped + 30.0 + 0.01  # 30 s after the last bytes
    assert own_loop_server.process.poll() is None  # stopped, not dead: the engine timed out
    assert channel.text.startswith(" The")


# --- the fallback continuation onto llama.cpp -----------------------------------------------


async def test_llamacpp_echoes_a_trailing_assistant_message(eos_server: LlamaServer) -> None:
    """covers S1: what the echo strip is for, seen on the raw wire (no adapter)."""
    body = {"model": "chain", "stream": True, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": " The quick brown"}]}
    async with aiohttp.ClientSession() as session, \
            session.post(f"{eos_server.url}/chat/completions", json=body) as response:
        raw = (await response.read()).decode()
    contents = [json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                for line in raw.splitlines()
                if line.startswith("data: {") and '"choices":[{' in line]
    assert "".join(contents).startswith(" The quick brown")


async def test_fallback_onto_llamacpp_delivers_nothing_twice(eos_server: LlamaServer) -> None:
    """covers G1, S1: the primary fails mid-reply; llama.cpp gets the delivered text as a
    native prefill and echoes it, glued to its first token (" The quick brown The"): the
    echo is dropped, so the channel shows the primary's text once, then what the model wrote
    (this chain model writes its sentence after any prompt)."""
    delivered = " The quick brown"
    primary = ReplayServer(sse({"choices": [{"index": 0, "delta": {"content": delivered}}]}))
    channel = InMemoryChannel()
    async with primary, aiohttp.ClientSession() as session:
        locks, lock = channel_lock()
        llama: SSEProvider = build_provider(
            config_for(eos_server.url, "openai", model="chain"), session)
        result = await asyncio.wait_for(run_generation_turn(
            [Attempt(build_provider(config_for(primary, "openai"), session), "primary"),
             Attempt(llama, "llama")],
            channel=channel, locks=locks, lock=lock,
            request=TurnRequest(context_items=[{"role": "user", "content": "hi"}])), BOUND_S)
    assert [a.status for a in result.attempts] == ["error", "completed"]
    assert result.attempts[1].text == SENTENCE
    assert channel.text == delivered + SENTENCE
    assert channel.text.count(delivered) == 2  # the primary's and the model's own: no echo
