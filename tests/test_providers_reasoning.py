"""Reasoning models end to end (issue 25, item 2): a recorded thinking + tool-call pass
through the real adapter over TLS on loopback (the provider's real host name, so its
capabilities are that host's), the real engine running the tool, then the next request's
body checked field by field — on each adapter, and through a fallback and a context restart.
The streams are in tests/fixtures/sse/reasoning/ (README there names their sources)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fsm.engine.generation import Attempt, run_generation_turn
from fsm.engine.prefill import TurnRequest
from fsm.engine.tools import FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.scenarios.scripted import InMemoryChannel
from providers.config import ProviderConfig
from providers.factory import build_provider
from providers.gemini import SKIP_SIGNATURE

from providers_support import TEST_KEY, RealHosts, anthropic_sse, channel_lock

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

STREAMS = Path(__file__).resolve().parent / "fixtures" / "sse" / "reasoning"
QUESTION = [{"role": "user", "content": "alice: weather in Paris?"}]
ANSWER = "Let me check the weather. It is sunny in Paris."
FORECAST = {"success": True, "data": {"city": "Paris", "forecast": "sunny"}}


class CityArgs(BaseModel):
    city: str


async def weather(args: CityArgs, _ctx: ToolContext) -> ToolResult:
    return ToolResult.ok({"city": args.city, "forecast": "sunny"})


def registry(*extra: FunctionTool[Any]) -> ToolRegistry:
    return ToolRegistry([FunctionTool("get_weather", "Weather for a city", CityArgs, weather),
                         *extra])


def stream(name: str) -> bytes:
    return (STREAMS / f"{name}.sse").read_bytes()


def config(kind: str, model: str, base_url: str, **extra: Any) -> ProviderConfig:
    return ProviderConfig.model_validate({"kind": kind, "model": model, "base_url": base_url,
                                          "api_key": TEST_KEY, **extra})


async def run_turn(hosts: RealHosts, provider_config: ProviderConfig,
                   tools: ToolRegistry | None = None) -> tuple[Any, InMemoryChannel]:
    assert hosts.session is not None
    locks, lock = channel_lock()
    channel = InMemoryChannel()
    turn = Turn(provider=build_provider(provider_config, hosts.session), channel=channel,
                locks=locks, lock=lock, tools=tools or registry(),
                request=TurnRequest(context_items=QUESTION, system_prompt="Be brief."))
    return await turn.run(), channel


# --- one thinking + tool pass, then the next request, per adapter --------------------------

ANTHROPIC_TURN = [
    {"type": "thinking", "thinking": "The user asks about Paris weather. I should call "
     "get_weather.", "signature": "RklYVFVSRS1zaWduYXR1cmUtdGhpbmtpbmctMDAwMQ=="},
    {"type": "redacted_thinking", "data": "RklYVFVSRS1yZWRhY3RlZC10aGlua2luZy0wMDAx"},
    {"type": "text", "text": "Let me check the weather."},
    {"type": "tool_use", "id": "toolu_FIXTUREthink1", "name": "get_weather",
     "input": {"city": "Paris"}},
]


async def test_anthropic_thinking_and_tool_use_then_the_next_request() -> None:
    """covers P2, P5, T7: the signed thinking block and the redacted one come back first in
    the tool-use turn, exactly as streamed, with thinking still on; the thinking text is
    reasoning (never delivered), and the reply completes."""
    async with RealHosts({"api.anthropic.com"}, stream("anthropic_thinking_then_tool_use"),
                         stream("anthropic_thinking_then_answer")) as hosts:
        result, channel = await run_turn(hosts, config(
            "anthropic", "claude-sonnet-4-5", "https://api.anthropic.com/v1",
            reasoning={"budget_tokens": 2048}))
    first, second = hosts.bodies()
    assert result.status == "completed" and channel.text == ANSWER
    assert result.passes[0].reasoning == ("The user asks about Paris weather. I should call "
                                          "get_weather.")
    assert result.passes[0].usage == {"input_tokens": 412, "output_tokens": 96}
    for body in (first, second):
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
        assert body["max_tokens"] == 4096 + 2048
    assert second["messages"][0] == {"role": "user", "content": [
        {"type": "text", "text": "alice: weather in Paris?"}]}
    assert second["messages"][1] == {"role": "assistant", "content": ANTHROPIC_TURN}
    assert second["messages"][2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_FIXTUREthink1",
         "content": '{"success": true, "data": {"city": "Paris", "forecast": "sunny"}}',
         "is_error": False}]}
    assert len(second["messages"]) == 3


async def test_gemini_thought_and_function_call_then_the_next_request() -> None:
    """covers P2, P5, T7: Gemini 3's signature comes back on its call part; the thought
    summary is reasoning; `thinkingConfig` is sent on every pass."""
    url = "https://generativelanguage.googleapis.com/v1beta"
    async with RealHosts({"generativelanguage.googleapis.com"},
                         stream("gemini_thought_then_function_call"),
                         stream("gemini_answer")) as hosts:
        result, channel = await run_turn(hosts, config("gemini", "gemini-3-pro-preview", url,
                                                       reasoning={"effort": "high"}))
    first, second = hosts.bodies()
    assert result.status == "completed" and channel.text == ANSWER
    assert result.passes[0].reasoning.startswith("**Checking the weather**")
    for body in (first, second):
        assert body["generationConfig"]["thinkingConfig"] == {"thinkingLevel": "HIGH",
                                                              "includeThoughts": True}
    assert second["contents"][1] == {"role": "model", "parts": [
        {"text": "Let me check the weather."},
        {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
         "thoughtSignature": "RklYVFVSRS1nZW1pbmktdGhvdWdodC1zaWduYXR1cmUtMDAwMQ=="}]}
    assert second["contents"][2] == {"role": "user", "parts": [
        {"functionResponse": {"name": "get_weather", "response": FORECAST}}]}
    assert len(second["contents"]) == 3


@pytest.mark.parametrize(("name", "model", "url", "reasoning", "thought", "carried"), [
    ("deepseek", "deepseek-v4-pro", "https://api.deepseek.com", {"effort": "high"},
     "The user wants the weather in Paris. I will call get_weather.",
     {"reasoning_content": "The user wants the weather in Paris. I will call get_weather."}),
    ("openrouter", "anthropic/claude-sonnet-4.5", "https://openrouter.ai/api/v1",
     {"budget_tokens": 2048}, "The user wants Paris weather.",
     {"reasoning_details": [{"type": "reasoning.text", "text": "The user wants Paris weather.",
                             "format": "anthropic-claude-v1", "index": 0,
                             "signature": "RklYVFVSRS1vcGVucm91dGVyLXNpZ25hdHVyZQ=="}]}),
    ("mistral", "magistral-medium-latest", "https://api.mistral.ai/v1", {"effort": "medium"},
     "Weather needs the tool.",
     {"content": [{"type": "thinking", "thinking": [
         {"type": "text", "text": "Weather needs the tool."}]},
         {"type": "text", "text": "Let me check the weather."}]}),
])
async def test_chat_completions_reasoning_and_tool_call_then_the_next_request(
        name: str, model: str, url: str, reasoning: dict[str, Any], thought: str,
        carried: dict[str, Any]) -> None:
    """covers P2, P5, T7: DeepSeek's reasoning_content, OpenRouter's reasoning_details
    (merged from its pieces, signature included) and Mistral's thinking chunks come back on
    the tool-call turn, in the field that host takes, on its real host."""
    host = url.split("/")[2]
    first_stream = {"deepseek": "deepseek_reasoning_then_tool_call",
                    "openrouter": "openrouter_reasoning_details_then_tool_call",
                    "mistral": "mistral_magistral_thinking_then_tool_call"}[name]
    async with RealHosts({host}, stream(first_stream), stream(f"{name}_answer")) as hosts:
        result, channel = await run_turn(hosts, config("openai", model, url,
                                                       reasoning=reasoning))
    _, second = hosts.bodies()
    assert result.status == "completed" and channel.text == ANSWER
    assert result.passes[0].reasoning == thought
    turn = second["messages"][2]
    call_id = turn["tool_calls"][0]["id"]
    expected = {"role": "assistant", "content": "Let me check the weather.",
                "tool_calls": [{"id": call_id, "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris"}'}}], **carried}
    assert turn == expected
    assert second["messages"][3] == {"role": "tool", "tool_call_id": call_id,
                                     "content": '{"success": true, "data": {"city": "Paris", '
                                                '"forecast": "sunny"}}'}


# --- through a fallback --------------------------------------------------------------------

OVERLOADED = anthropic_sse({"type": "error", "error": {"type": "overloaded_error",
                                                       "message": "Overloaded"}})


async def fallback_after_tool(fallback: ProviderConfig, hosts_names: set[str],
                              answer: bytes) -> dict[str, Any]:
    """Claude thinks and calls the tool, then fails; the fallback's first request."""
    async with RealHosts({"api.anthropic.com"}, stream("anthropic_thinking_then_tool_use"),
                         OVERLOADED) as primary, RealHosts(hosts_names, answer) as other:
        assert primary.session is not None and other.session is not None
        locks, lock = channel_lock()
        channel = InMemoryChannel()
        result = await run_generation_turn(
            [Attempt(build_provider(config("anthropic", "claude-sonnet-4-5",
                                           "https://api.anthropic.com/v1",
                                           reasoning={"budget_tokens": 2048}),
                                    primary.session), "claude"),
             Attempt(build_provider(fallback, other.session), "fallback")],
            channel=channel, locks=locks, lock=lock, tools=registry(),
            request=TurnRequest(context_items=QUESTION))
    assert [a.status for a in result.attempts] == ["error", "completed"]
    body: dict[str, Any] = other.bodies()[0]
    return body


async def test_fallback_to_the_same_model_carries_its_thinking() -> None:
    """covers P5, G1: the same Claude model behind a second endpoint continues after the
    first attempt's tool call: its request still starts that turn with the thinking blocks,
    and thinking stays on."""
    body = await fallback_after_tool(
        config("anthropic", "claude-sonnet-4-5", "https://claude.gateway.example/v1",
               reasoning={"budget_tokens": 2048}),
        {"claude.gateway.example"}, stream("anthropic_thinking_then_answer"))
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    [turn] = [m for m in body["messages"] if m["role"] == "assistant"]
    assert turn["content"][:2] == ANTHROPIC_TURN[:2]
    assert turn["content"][-1] == ANTHROPIC_TURN[-1]


async def test_fallback_to_another_claude_drops_the_blocks_and_thinking() -> None:
    """covers P5, G1: another Claude model cannot verify those signatures: no block is sent,
    and thinking is off for the request whose last tool turn it did not think."""
    body = await fallback_after_tool(
        config("anthropic", "claude-opus-4-1", "https://api.anthropic.com/v1",
               reasoning={"budget_tokens": 2048}),
        {"api.anthropic.com"}, stream("anthropic_thinking_then_answer"))
    assert "thinking" not in body
    [turn] = [m for m in body["messages"] if m["role"] == "assistant"]
    assert turn["content"] == ANTHROPIC_TURN[2:]  # the delivered text (S1), then the call


async def test_fallback_to_gemini_3_signs_the_foreign_call() -> None:
    """covers P5, G1: Gemini 3 refuses an unsigned current-turn call; Claude's call gets the
    documented validator-skipping signature, and no Claude block reaches Gemini."""
    body = await fallback_after_tool(
        config("gemini", "gemini-3-pro-preview",
               "https://generativelanguage.googleapis.com/v1beta"),
        {"generativelanguage.googleapis.com"}, stream("gemini_answer"))
    [call] = [p for c in body["contents"] for p in c["parts"] if "functionCall" in p]
    assert call == {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                    "thoughtSignature": SKIP_SIGNATURE}
    assert "RklYVFVSRS1zaWduYXR1cmUtdGhpbmtpbmctMDAwMQ==" not in str(body)
    assert "The user asks about Paris weather" not in str(body)


# --- through a context restart -------------------------------------------------------------


class VideoArgs(BaseModel):
    url: str


async def video(_args: VideoArgs, _ctx: ToolContext) -> ToolResult:
    return ToolResult.ok({"type": "context_restart_youtube", "enhanced_context_item": {
        "role": "user", "content": "[video summary: a sunny day in Paris]"}})


async def test_context_restart_keeps_the_earlier_turns_thinking() -> None:
    """covers P5, R1: after a restart (whose own call is not in the history) the next
    request still carries the earlier tool turn's thinking blocks, so thinking stays on."""
    youtube_call = anthropic_sse(
        {"type": "message_start", "message": {"id": "msg_FIXTUREyt", "type": "message",
                                              "role": "assistant", "content": [],
                                              "usage": {"input_tokens": 500}}},
        {"type": "content_block_start", "index": 0, "content_block": {
            "type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {
            "type": "thinking_delta", "thinking": "Watch the video too."}},
        {"type": "content_block_delta", "index": 0, "delta": {
            "type": "signature_delta", "signature": "RklYVFVSRS15b3V0dWJl"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "toolu_FIXTUREyt", "name": "process_youtube_video",
            "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {
            "type": "input_json_delta", "partial_json": '{"url": "https://youtu.be/x"}'}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
         "usage": {"output_tokens": 30}},
        {"type": "message_stop"})
    tools = registry(FunctionTool("process_youtube_video", "Watch a video", VideoArgs, video,
                                  guard="youtube"))
    async with RealHosts({"api.anthropic.com"}, stream("anthropic_thinking_then_tool_use"),
                         youtube_call, stream("anthropic_thinking_then_answer")) as hosts:
        result, channel = await run_turn(hosts, config(
            "anthropic", "claude-sonnet-4-5", "https://api.anthropic.com/v1",
            reasoning={"budget_tokens": 2048}), tools)
    third = hosts.bodies()[2]
    assert result.status == "completed" and channel.text == ANSWER
    assert third["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assistant = [m for m in third["messages"] if m["role"] == "assistant"]
    assert [m["content"] for m in assistant] == [ANTHROPIC_TURN]
    assert any("[video summary" in block.get("text", "")
               for m in third["messages"] for block in m["content"])
