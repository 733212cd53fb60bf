"""What a provider accepts, checked on the wire (issue 14, items 9-12): how a prefill is sent
(native, prefix flag, instruction, off) and an echoed prefill stripped, the output limit's
field name, tools off or allowed by name, Mistral's ids and turn order, Gemini's
function-response ids. Golden request bodies live in tests/fixtures/requests/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fsm.engine.provider import (
    AbortSignal,
    Finish,
    HistoryEntry,
    PassRequest,
    TextDelta,
    ToolCallRequest,
)
from providers.capabilities import default_max_tokens_field, default_prefill
from providers.config import ProviderConfig
from providers.factory import build_provider
from providers.openai import MISTRAL_BRIDGE, mistral_call_id
from providers.prefill import EchoStrip, continuation_instruction
from providers.replay_server import ReplayServer

from providers_support import FIXTURES, OK_STREAMS, RealHosts, collect, sse

REQUESTS = Path(__file__).resolve().parent / "fixtures" / "requests"
OK = OK_STREAMS
TOOLS = [
    {"name": "get_weather", "description": "Weather for a place",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
    {"name": "peek_avatar", "description": "Look at a user's avatar",
     "parameters": {"type": "object", "properties": {"user": {"type": "string"}}}},
]
DELIVERED = "The forecast for Paris: sunny in the morning,"


def continuation(*, with_history: bool = True, notices: bool = True) -> PassRequest:
    """A fallback's request: context, a completed tool call, a notice, the delivered text."""
    history = [HistoryEntry(tool_name="get_weather", arguments={"city": "Paris"},
                            result={"forecast": "sunny, then rain"},
                            call_id="call_FIXTURE_weather_0001")] if with_history else []
    return PassRequest(
        context_items=[{"role": "user", "content": "alice: weather in Paris?"}],
        function_history=history,
        tools=TOOLS,
        system_prompt="You are a helpful bot.",
        prefill=DELIVERED,
        request_notices=["[System: an earlier attempt already completed these tool calls: "
                         "get_weather({\"city\": \"Paris\"}).]"] if notices else [],
    )


async def sent_body(kind: str, request: PassRequest, **config: Any) -> dict[str, Any]:
    async with ReplayServer(OK[kind]) as server:
        _, summary = await collect(server, kind, request=request, **config)
    assert summary.error is None, summary.error
    body: dict[str, Any] = json.loads(server.requests[0].body)
    return body


def golden(name: str) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((REQUESTS / f"{name}.json").read_text())
    return value


# --- 9: the prefill as a capability ------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "model", "base_url", "mode"),
    [
        ("anthropic", "claude-opus-4-6", None, "instruction"),
        ("anthropic", "claude-sonnet-4-6-20260201", None, "instruction"),
        ("anthropic", "claude-sonnet-4-5-20250929", None, "native"),
        ("anthropic", "claude-3-5-haiku-20241022", None, "native"),
        ("gemini", "gemini-2.5-flash", None, "instruction"),
        ("gemini", "gemini-3-pro-preview", None, "instruction"),
        ("gemini", "gemini-flash-latest", None, "instruction"),
        ("gemini", "gemini-2.0-flash", None, "native"),
        ("openai", "gpt-4.1-mini", None, "instruction"),
        ("openai", "gpt-4o", "https://myres.openai.azure.com/openai/v1", "instruction"),
        ("openai", "mistral-large-latest", "https://api.mistral.ai/v1", "prefix-flag"),
        ("openai", "chain", "http://127.0.0.1:8080/v1", "native"),
        ("openai", "qwen3:8b", "http://127.0.0.1:11434/v1", "native"),
    ],
)
def test_prefill_defaults_by_kind_host_and_model(
    kind: str, model: str, base_url: str | None, mode: str
) -> None:
    """covers S1: the models that reject a trailing assistant turn do not get one."""
    assert default_prefill(kind, model, base_url) == mode


@pytest.mark.asyncio
async def test_claude_46_continuation_is_an_instruction_in_the_system_prompt() -> None:
    """covers S1, G1, A4: Claude 4.6 gets the delivered text in an instruction in `system`
    (where no chat user writes), never a final assistant turn (which it rejects with HTTP
    400); the messages end in a user turn."""
    body = await sent_body("anthropic", continuation(), model="claude-opus-4-6")
    assert body["messages"][-1]["role"] == "user"
    assert DELIVERED in body["system"]


@pytest.mark.asyncio
async def test_gemini_25_continuation_ends_in_a_user_turn() -> None:
    """covers S1, G1, A4: newer Gemini models get no final model turn; the instruction
    travels in systemInstruction."""
    body = await sent_body("gemini", continuation(with_history=False), model="gemini-2.5-flash")
    assert body["contents"][-1]["role"] == "user"
    assert body["systemInstruction"]["parts"][0]["text"].endswith(
        continuation_instruction(DELIVERED))
    assert all(turn["role"] != "model" for turn in body["contents"])


@pytest.mark.asyncio
async def test_mistral_prefill_carries_the_prefix_flag_and_its_rules() -> None:
    """covers S1, T7: Mistral's prefix flag; tool-call ids of nine letters and digits, the same
    on the call and its result; an assistant turn between a tool result and a user turn."""
    body = await sent_body("openai", continuation(), model="mistral-large-latest",
                           dialect="mistral")
    messages = body["messages"]
    assert messages[-1] == {"role": "assistant", "content": DELIVERED, "prefix": True}
    call_id = messages[2]["tool_calls"][0]["id"]
    assert len(call_id) == 9 and call_id.isalnum() and messages[3]["tool_call_id"] == call_id
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant",
                                              "system", "assistant"]
    assert messages[4] == {"role": "assistant", "content": MISTRAL_BRIDGE}


def test_mistral_ids_keep_valid_ones_and_map_others_stably() -> None:
    """covers T7: an id Mistral itself minted goes back unchanged."""
    assert mistral_call_id("Ab3dE6gH9") == "Ab3dE6gH9"
    assert mistral_call_id("call_abc") == mistral_call_id("call_abc") != mistral_call_id("x")


@pytest.mark.asyncio
async def test_mistral_without_notices_needs_no_bridge() -> None:
    """covers T7: a tool result followed by the prefix-flag turn is already valid."""
    body = await sent_body("openai", continuation(notices=False), model="mistral-small-latest")
    assert [m["role"] for m in body["messages"]][-2:] == ["tool", "assistant"]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_prefill_off_sends_no_prefill(kind: str) -> None:
    """covers S1: `off` sends neither an assistant turn nor an instruction."""
    body = await sent_body(kind, continuation(with_history=False, notices=False),
                           prefill="off")
    assert DELIVERED not in json.dumps(body)


@pytest.mark.asyncio
async def test_native_prefill_is_the_last_assistant_turn() -> None:
    """covers S1: a local server continues a final assistant turn."""
    body = await sent_body("openai", continuation())
    assert body["messages"][-1] == {"role": "assistant", "content": DELIVERED}


@pytest.mark.asyncio
async def test_llamacpp_echo_of_the_prefill_is_dropped() -> None:
    """covers G1, S1: llama.cpp echoes a trailing assistant message in its first chunk; only
    the continuation reaches the channel (no text delivered twice)."""
    recording = (FIXTURES / "servers" / "llamacpp_prefill_echo.sse").read_bytes()
    request = PassRequest(context_items=[{"role": "user", "content": "go on"}],
                          function_history=[], prefill="The first attempt wrote this much")
    async with ReplayServer(recording) as server:
        _, summary = await collect(server, "openai", request=request)
    assert "".join(summary.text) == " and the fallback goes on."
    assert summary.finish_reason == "stop"


@pytest.mark.asyncio
async def test_instruction_mode_strips_nothing() -> None:
    """covers S1: only a native prefill can be echoed, so nothing else is ever dropped."""
    recording = (FIXTURES / "servers" / "llamacpp_prefill_echo.sse").read_bytes()
    request = PassRequest(context_items=[{"role": "user", "content": "go on"}],
                          function_history=[], prefill="The first attempt wrote this much")
    async with ReplayServer(recording) as server:
        _, summary = await collect(server, "openai", request=request, prefill="instruction")
    assert "".join(summary.text).startswith("The first attempt wrote this much")


def feed_all(strip: EchoStrip, pieces: list[str]) -> str:
    out = []
    for piece in pieces:
        out += strip.feed(TextDelta(piece))
    out += strip.feed(Finish("stop"))
    return "".join(e.text for e in out if isinstance(e, TextDelta))


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        (["Hello wor", "ld", " and more"], " and more"),  # echo split over chunks
        (["Hello world and more"], " and more"),  # echo and continuation in one chunk
        (["Hello world"], ""),  # only the echo
        (["Hello", " there"], "Hello there"),  # diverges: released unchanged
        (["Hello"], "Hello"),  # ends before the echo completed: released
        ([" and more"], " and more"),  # no echo at all
    ],
)
def test_echo_strip_drops_only_an_exact_complete_echo(pieces: list[str], expected: str) -> None:
    """covers S1, G1: compare, then drop only an exact echo of the prefill."""
    assert feed_all(EchoStrip("Hello world"), pieces) == expected


def test_echo_strip_releases_held_text_before_a_tool_call() -> None:
    """covers T7: a partial echo followed by a call is text the model wrote: kept, in order."""
    strip = EchoStrip("Hello world")
    call = ToolCallRequest("now", {})
    assert strip.feed(TextDelta("Hello")) == []
    assert strip.feed(call) == [TextDelta("Hello"), call]


# --- 10: the output limit's field ----------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "field"),
    [("o3-mini", "max_completion_tokens"), ("o4-mini", "max_completion_tokens"),
     ("gpt-5", "max_completion_tokens"), ("gpt-5.1-mini", "max_completion_tokens"),
     ("gpt-4.1-mini", "max_tokens"), ("llama3.2", "max_tokens"),
     ("openai/gpt-5", "max_tokens")],
)
def test_output_limit_field_by_model_family(model: str, field: str) -> None:
    """covers S1: OpenAI's reasoning models reject `max_tokens`."""
    assert default_max_tokens_field(model) == field


@pytest.mark.asyncio
async def test_reasoning_model_gets_max_completion_tokens() -> None:
    """covers S1: the body carries the field the model takes, and never both."""
    body = await sent_body("openai", continuation(with_history=False, notices=False),
                           model="gpt-5.1", max_output_tokens=256)
    assert body["max_completion_tokens"] == 256 and "max_tokens" not in body


@pytest.mark.asyncio
async def test_output_limit_field_is_configurable() -> None:
    """covers S1: a server of the family that wants the other field can say so."""
    body = await sent_body("openai", continuation(with_history=False), model="llama3.2",
                           max_output_tokens=64, max_tokens_field="max_completion_tokens")
    assert body["max_completion_tokens"] == 64 and "max_tokens" not in body


# --- 11: tools as a capability --------------------------------------------------------------


def tool_names(kind: str, body: dict[str, Any]) -> list[str] | None:
    if "tools" not in body:
        return None
    if kind == "openai":
        return [t["function"]["name"] for t in body["tools"]]
    if kind == "anthropic":
        return [t["name"] for t in body["tools"]]
    return [d["name"] for d in body["tools"][0]["functionDeclarations"]]


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize(
    ("setting", "expected"),
    [(True, ["get_weather", "peek_avatar"]), (False, None), (["get_weather"], ["get_weather"]),
     ([], None)],
)
async def test_tools_off_or_allowed_by_name(
    kind: str, setting: bool | list[str], expected: list[str] | None
) -> None:
    """covers T1: a provider that takes no tools gets none; an allow-list sends only those."""
    body = await sent_body(kind, continuation(with_history=False, notices=False), tools=setting)
    assert tool_names(kind, body) == expected


@pytest.mark.asyncio
async def test_ollama_with_tools_off_sends_a_body_without_tools() -> None:
    """covers T1: the whole body an Ollama model without tool support receives."""
    body = await sent_body("openai", continuation(with_history=False, notices=False),
                           model="gemma3:4b", tools=False)
    assert body == golden("ollama_tools_off")


# --- 12: Gemini function-response ids --------------------------------------------------------


@pytest.mark.asyncio
async def test_gemini_function_responses_carry_the_ids_the_model_sent() -> None:
    """covers T7, P3: parallel calls of one function, with ids from the model, built for
    Gemini's real host: they go back as Gemini sent them, one model turn with all three
    calls and one user turn with all three answers, each result with its call's id; a call
    without an id (minted here) gets none."""
    calls = sse({"candidates": [{"content": {"role": "model", "parts": [
        {"functionCall": {"id": "fc-FIXTURE-a", "name": "get_weather", "args": {"city": "Oslo"}}},
        {"functionCall": {"id": "fc-FIXTURE-b", "name": "get_weather", "args": {"city": "Rome"}}},
        {"functionCall": {"name": "now", "args": {}}}]}, "finishReason": "STOP", "index": 0}]})
    async with RealHosts({"generativelanguage.googleapis.com"}, calls, OK["gemini"]) as hosts:
        assert hosts.session is not None
        provider = build_provider(ProviderConfig(
            kind="gemini", model="gemini-2.5-flash",
            base_url="https://generativelanguage.googleapis.com/v1beta"), hosts.session)
        request = PassRequest(context_items=[{"role": "user", "content": "weather?"}],
                              function_history=[])
        made = [e async for e in provider.stream(request, AbortSignal())
                if isinstance(e, ToolCallRequest)]
        history = [HistoryEntry(c.name, c.arguments, {"ok": True}, call_id=c.id, batch="t:1")
                   for c in made]  # one pass's calls: one batch, as the engine records them
        follow = PassRequest(context_items=request.context_items, function_history=history)
        async for _ in provider.stream(follow, AbortSignal()):
            pass
    body = hosts.bodies()[1]
    assert body == golden("gemini_parallel_calls_with_ids")
    responses = [p["functionResponse"] for c in body["contents"] for p in c["parts"]
                 if "functionResponse" in p]
    assert [r.get("id") for r in responses] == ["fc-FIXTURE-a", "fc-FIXTURE-b", None]
