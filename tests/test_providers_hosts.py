"""Request bodies built as for the real hosts (issue 25, items 1-3): each provider is
configured with its host's real `base_url`, which resolves to a TLS server on loopback
(`RealHosts`), so the capabilities the host decides (its request schema, `stream_options`,
the output-limit field, the prefill mode, how reasoning is asked for and sent back) are the
ones the real host would get. One golden body per real host lives in
tests/fixtures/requests/; each test also checks the rule it stands for field by field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fsm.engine.provider import AbortSignal, HistoryEntry, PassRequest, ReasoningState
from providers.config import ProviderConfig
from providers.factory import build_provider
from providers.gemini import SKIP_SIGNATURE
from providers.prefill import continuation_instruction
from providers.servers import MISTRAL_MESSAGE_FIELDS, MISTRAL_REQUEST_FIELDS, default_server

from providers_support import OK_STREAMS, TEST_KEY, RealHosts

pytestmark = pytest.mark.asyncio

REQUESTS = Path(__file__).resolve().parent / "fixtures" / "requests"
OK = OK_STREAMS
TOOLS = [{"name": "get_weather", "description": "Weather for a place",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
DELIVERED = "The forecast for Paris: sunny in the morning,"
QUESTION = [{"role": "user", "content": "alice: weather in Paris?"}]


def continuation(*, with_history: bool = True) -> PassRequest:
    """A fallback's request: a completed call, a notice, the delivered text to continue."""
    history = [HistoryEntry(tool_name="get_weather", arguments={"city": "Paris"},
                            result={"forecast": "sunny, then rain"},
                            call_id="call_FIXTURE_weather_0001")] if with_history else []
    return PassRequest(
        context_items=QUESTION, function_history=history, tools=TOOLS,
        system_prompt="You are a helpful bot.", prefill=DELIVERED,
        request_notices=["[System: an earlier attempt already completed these tool calls: "
                         "get_weather({\"city\": \"Paris\"}).]"],
    )


def tool_turn(origin: str, *items: dict[str, Any], call_id: str = "call_FIXTUREweather1",
              text: str = "Let me check.") -> PassRequest:
    """The pass after a tool call whose model turn left reasoning state `items`."""
    state = ReasoningState(origin, items) if items else None
    entry = HistoryEntry(tool_name="get_weather", arguments={"city": "Paris"},
                         result={"success": True, "data": {"forecast": "sunny"}},
                         call_id=call_id, pre_tool_text=text, reasoning=state)
    return PassRequest(context_items=QUESTION, function_history=[entry], tools=TOOLS,
                       system_prompt="You are a helpful bot.")


async def host_request(kind: str, base_url: str, request: PassRequest,
                       **config: Any) -> tuple[dict[str, Any], Any]:
    """The body (and the recorded request) a provider sends to the real `base_url`."""
    host = base_url.split("/")[2]
    async with RealHosts({host}, OK[kind]) as hosts:
        assert hosts.session is not None
        provider = build_provider(ProviderConfig.model_validate(
            {"kind": kind, "base_url": base_url, "api_key": TEST_KEY, **config}), hosts.session)
        events = [e async for e in provider.stream(request, AbortSignal())]
    assert not any(type(e).__name__ == "ProviderError" for e in events), events
    [recorded] = hosts.requests
    return recorded.json(), recorded


def assert_golden(name: str, body: dict[str, Any]) -> None:
    """The body equals the committed golden; a missing golden is written and fails, so a new
    one is always reviewed before it counts."""
    path = REQUESTS / f"{name}.json"
    if not path.exists():
        path.write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n")
        pytest.fail(f"golden {path.name} written: review it and commit")
    assert body == json.loads(path.read_text())


def assistant_turns(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "assistant"]


# --- host families -------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "family"), [
    (None, "openai"), ("https://api.openai.com/v1", "openai"),
    ("https://myres.openai.azure.com/openai/v1", "azure"),
    ("https://api.mistral.ai/v1", "mistral"), ("https://api.deepseek.com", "deepseek"),
    ("https://api.moonshot.ai/v1", "moonshot"), ("https://api.moonshot.cn/v1", "moonshot"),
    ("https://api.groq.com/openai/v1", "groq"), ("https://api.x.ai/v1", "xai"),
    ("https://openrouter.ai/api/v1", "openrouter"), ("http://127.0.0.1:8080/v1", "generic"),
    ("https://notapi.mistral.ai.example.com/v1", "generic"),
])
async def test_server_family_by_host(url: str | None, family: str) -> None:
    """covers P1: what a host accepts is decided by its host name."""
    assert default_server(url) == family


# --- 1: Mistral's schema ------------------------------------------------------------------


def assert_within_mistral_schema(body: dict[str, Any]) -> None:
    assert set(body) <= MISTRAL_REQUEST_FIELDS, set(body) - MISTRAL_REQUEST_FIELDS
    for message in body["messages"]:
        allowed = MISTRAL_MESSAGE_FIELDS[message["role"]]
        assert set(message) <= allowed, (message, set(message) - allowed)


async def test_mistral_continuation_after_tool_is_within_its_schema() -> None:
    """covers P1, S1: api.mistral.ai gets no `stream_options` (its schema forbids it: 422
    extra_forbidden before a token streams), the prefix flag and its message rules."""
    body, recorded = await host_request("openai", "https://api.mistral.ai/v1", continuation(),
                                        model="mistral-large-latest")
    assert_golden("mistral_continuation_after_tool", body)
    assert_within_mistral_schema(body)
    assert "stream_options" not in body and body["max_tokens"] == 4096
    assert body["messages"][-1] == {"role": "assistant", "content": DELIVERED, "prefix": True}
    assert (recorded.path, recorded.headers["Authorization"]) == (
        "/v1/chat/completions", f"Bearer {TEST_KEY}")


async def test_mistral_takes_max_tokens_whatever_the_field_configured() -> None:
    """covers P1: a field Mistral does not name is never sent; the limit goes as max_tokens."""
    body, _ = await host_request("openai", "https://api.mistral.ai/v1",
                                 continuation(with_history=False), model="mistral-small-latest",
                                 max_tokens_field="max_completion_tokens", max_output_tokens=99)
    assert_within_mistral_schema(body)
    assert body["max_tokens"] == 99 and "max_completion_tokens" not in body


async def test_magistral_tool_turn_sends_its_thinking_back_as_chunks() -> None:
    """covers P1, P2, P5: magistral with reasoning on gets `reasoning_effort` (in Mistral's
    schema), and its thinking chunk goes back in the tool-call turn's list content, before
    the turn's text; nothing outside the schema."""
    chunk = {"type": "thinking", "thinking": [{"type": "text", "text": "Need the weather."}]}
    request = tool_turn("openai:magistral-medium-latest", {"thinking_chunks": [chunk]},
                        call_id="Ab3dE6gH9")
    body, _ = await host_request("openai", "https://api.mistral.ai/v1", request,
                                 model="magistral-medium-latest", reasoning={"effort": "high"})
    assert_golden("mistral_magistral_tool_turn", body)
    assert_within_mistral_schema(body)
    assert body["reasoning_effort"] == "high"
    [turn] = assistant_turns(body)
    assert turn["content"] == [chunk, {"type": "text", "text": "Let me check."}]
    assert turn["tool_calls"][0]["id"] == "Ab3dE6gH9"


# --- 3: OpenAI's own API ------------------------------------------------------------------


async def test_openai_reasoning_model_is_built_for_api_openai_com() -> None:
    """covers P3, P2, S1, A4: gpt-5.1 on api.openai.com gets no trailing assistant prefill
    (the real host answers after one instead of continuing it) but the instruction quoting
    it, in a system message, `max_completion_tokens` and its `reasoning_effort`."""
    body, _ = await host_request("openai", "https://api.openai.com/v1",
                                 continuation(with_history=False), model="gpt-5.1",
                                 max_output_tokens=256, reasoning={"effort": "low"})
    assert_golden("openai_reasoning_model", body)
    assert body["messages"][-1]["role"] == "system"
    assert body["messages"][-1]["content"].endswith(continuation_instruction(DELIVERED))
    assert all(m["role"] != "assistant" for m in body["messages"])
    assert body["max_completion_tokens"] == 256 and "max_tokens" not in body
    assert (body["reasoning_effort"], body["stream_options"]) == ("low", {"include_usage": True})


async def test_openai_chat_model_gets_no_reasoning_effort() -> None:
    """covers P2: OpenAI refuses `reasoning_effort` for models that do not reason."""
    body, _ = await host_request("openai", "https://api.openai.com/v1",
                                 continuation(with_history=False), model="gpt-4.1-mini",
                                 reasoning={"effort": "low"})
    assert "reasoning_effort" not in body and body["max_tokens"] == 4096


async def test_azure_chat_model_gets_no_reasoning_effort() -> None:
    """covers P2: an Azure deployment of a model that does not reason refuses
    `reasoning_effort` as OpenAI's own API does."""
    body, _ = await host_request("openai", "https://myres.openai.azure.com/openai/v1",
                                 continuation(with_history=False), model="gpt-4o",
                                 reasoning={"effort": "low"})
    assert "reasoning_effort" not in body and "reasoning" not in body


async def test_openrouter_effort_goes_in_its_reasoning_object() -> None:
    """covers P2: on OpenRouter an effort (no token budget) is sent as
    `reasoning: {"effort": ...}`, the only form it documents besides `max_tokens`."""
    body, _ = await host_request("openai", "https://openrouter.ai/api/v1",
                                 continuation(with_history=False), model="openai/o4-mini",
                                 reasoning={"effort": "high"})
    assert body["reasoning"] == {"effort": "high"} and "reasoning_effort" not in body


async def test_azure_deployment_gets_its_key_header_and_api_version() -> None:
    """covers P1, G4, A4: an Azure deployment: the OpenAI schema with `stream_options`, the
    key in `api-key`, the API version as a query parameter, no prefill turn (the
    instruction a system message)."""
    body, recorded = await host_request(
        "openai", "https://myres.openai.azure.com/openai/deployments/gpt-4o", continuation(),
        model="gpt-4o", api_key_header="api-key",
        query_params={"api-version": "2024-10-21"})
    assert_golden("azure_gpt4o_continuation", body)
    assert recorded.path == "/openai/deployments/gpt-4o/chat/completions"
    assert recorded.query == {"api-version": "2024-10-21"}
    assert recorded.headers["api-key"] == TEST_KEY and "Authorization" not in recorded.headers
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"][-1]["role"] == "system"


# --- reasoning back on the hosts that want it ---------------------------------------------


async def test_deepseek_tool_turn_carries_reasoning_content() -> None:
    """covers P2, P5: DeepSeek's thinking switch and effort; the tool-call turn's
    reasoning_content goes back (DeepSeek answers 400 without it)."""
    request = tool_turn("openai:deepseek-v4-pro", {"reasoning_content": "Look it up first."})
    body, _ = await host_request("openai", "https://api.deepseek.com", request,
                                 model="deepseek-v4-pro", reasoning={"effort": "high"})
    assert_golden("deepseek_thinking_tool_turn", body)
    assert (body["thinking"], body["reasoning_effort"]) == ({"type": "enabled"}, "high")
    [turn] = assistant_turns(body)
    assert turn["reasoning_content"] == "Look it up first."
    assert (turn["content"], turn["tool_calls"][0]["id"]) == ("Let me check.",
                                                               "call_FIXTUREweather1")


async def test_deepseek_reasoning_off_is_the_disabled_switch() -> None:
    """covers P2: `effort: none` turns DeepSeek's thinking mode off."""
    body, _ = await host_request("openai", "https://api.deepseek.com", tool_turn("x"),
                                 model="deepseek-v4-flash", reasoning={"effort": "none"})
    assert body["thinking"] == {"type": "disabled"} and "reasoning_effort" not in body


async def test_moonshot_tool_turn_carries_reasoning_content() -> None:
    """covers P5: Kimi's thinking models keep a tool-call turn's reasoning_content."""
    request = tool_turn("openai:kimi-k2-thinking", {"reasoning_content": "Weather tool."})
    body, _ = await host_request("openai", "https://api.moonshot.ai/v1", request,
                                 model="kimi-k2-thinking")
    assert_golden("moonshot_kimi_tool_turn", body)
    assert assistant_turns(body)[0]["reasoning_content"] == "Weather tool."


async def test_openrouter_tool_turn_carries_reasoning_details() -> None:
    """covers P2, P5: OpenRouter's `reasoning` object (a token budget) and its
    reasoning_details back exactly as streamed, signature included."""
    details = [{"type": "reasoning.text", "text": "Check weather.", "signature": "c2lnLTE=",
                "format": "anthropic-claude-v1", "index": 0}]
    request = tool_turn("openai:anthropic/claude-sonnet-4.5", {"reasoning": "Check weather."},
                        {"reasoning_details": details})
    body, _ = await host_request("openai", "https://openrouter.ai/api/v1", request,
                                 model="anthropic/claude-sonnet-4.5",
                                 reasoning={"budget_tokens": 2048})
    assert_golden("openrouter_reasoning_details_tool_turn", body)
    assert body["reasoning"] == {"max_tokens": 2048}
    [turn] = assistant_turns(body)
    assert turn["reasoning_details"] == details and "reasoning" not in turn


@pytest.mark.parametrize(("host", "url", "model", "field"), [
    ("groq", "https://api.groq.com/openai/v1", "openai/gpt-oss-120b", "reasoning"),
    ("xai", "https://api.x.ai/v1", "grok-3-mini", "reasoning_content"),
    ("openai", "https://api.openai.com/v1", "o4-mini", "reasoning_content"),
])
async def test_hosts_without_a_way_back_get_no_reasoning_fields(host: str, url: str,
                                                                 model: str,
                                                                 field: str) -> None:
    """covers P5: Groq, xAI (Chat Completions) and OpenAI document no reasoning to send
    back, so none is sent, whatever the pass streamed; the effort still goes."""
    request = tool_turn(f"openai:{model}", {field: "private"})
    body, _ = await host_request("openai", url, request, model=model,
                                 reasoning={"effort": "medium"})
    assert_golden(f"{host}_{field}_not_sent_back", body)
    [turn] = assistant_turns(body)
    assert set(turn) == {"role", "tool_calls", "content"}
    assert body["reasoning_effort"] == "medium"


async def test_another_models_reasoning_is_never_sent() -> None:
    """covers P5: state is bound to the model that made it (a fallback's history)."""
    request = tool_turn("openai:deepseek-v4-flash", {"reasoning_content": "not yours"})
    body, _ = await host_request("openai", "https://api.deepseek.com", request,
                                 model="deepseek-v4-pro")
    assert "reasoning_content" not in assistant_turns(body)[0]


# --- Anthropic and Gemini on their hosts ---------------------------------------------------

THINKING = {"type": "thinking", "thinking": "The user wants weather.",
            "signature": "RXFGSVhUVVJFc2lnbmF0dXJl"}
REDACTED = {"type": "redacted_thinking", "data": "RklYVFVSRXJlZGFjdGVk"}


async def test_claude_46_continuation_on_api_anthropic_com() -> None:
    """covers P3, S1: Claude 4.6 on its real host ends in a user instruction."""
    body, recorded = await host_request("anthropic", "https://api.anthropic.com/v1",
                                        continuation(), model="claude-opus-4-6")
    assert_golden("anthropic_claude46_continuation", body)
    assert body["messages"][-1]["role"] == "user"
    assert recorded.headers["x-api-key"] == TEST_KEY
    assert recorded.headers["anthropic-version"] == "2023-06-01"


async def test_anthropic_tool_turn_starts_with_its_thinking_blocks() -> None:
    """covers P2, P5: `thinking` with its budget (max_tokens is the output limit plus the
    budget); the tool-use turn starts with its thinking and redacted_thinking blocks,
    unchanged and in order, then its text, then the call."""
    request = tool_turn("anthropic:claude-sonnet-4-5", THINKING, REDACTED,
                        call_id="toolu_FIXTUREweather1")
    body, _ = await host_request("anthropic", "https://api.anthropic.com/v1", request,
                                 model="claude-sonnet-4-5", reasoning={"budget_tokens": 2048})
    assert_golden("anthropic_thinking_tool_turn", body)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["max_tokens"] == 4096 + 2048
    [turn] = [m for m in body["messages"] if m["role"] == "assistant"]
    assert turn["content"] == [THINKING, REDACTED, {"type": "text", "text": "Let me check."},
                               {"type": "tool_use", "id": "toolu_FIXTUREweather1",
                                "name": "get_weather", "input": {"city": "Paris"}}]


async def test_anthropic_thinking_off_for_another_models_tool_turn() -> None:
    """covers P5: the last tool-use turn has no thinking of this model's (another model made
    the call): thinking is left off for this request, as the API's error message advises,
    and no foreign block is sent."""
    request = tool_turn("anthropic:claude-opus-4-1", THINKING)
    body, _ = await host_request("anthropic", "https://api.anthropic.com/v1", request,
                                 model="claude-sonnet-4-5", reasoning={"effort": "low"})
    assert "thinking" not in body and body["max_tokens"] == 4096
    assert all(block["type"] != "thinking" for m in body["messages"] for block in m["content"])


async def test_anthropic_thinking_continuation_is_an_instruction() -> None:
    """covers P2, S1: thinking cannot continue a trailing assistant turn, so even a model
    that takes a native prefill gets the instruction when thinking is on."""
    request = PassRequest(context_items=QUESTION, function_history=[], prefill=DELIVERED)
    body, _ = await host_request("anthropic", "https://api.anthropic.com/v1", request,
                                 model="claude-sonnet-4-5", reasoning={"effort": "medium"})
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 8192}
    assert body["messages"][-1]["role"] == "user"


async def test_gemini_3_tool_turns_carry_signatures() -> None:
    """covers P2, P5: Gemini 3 with reasoning gets a `thinkingLevel` (Pro: LOW or HIGH) and
    thought summaries; its own call goes back with its signature, and a call another model
    made gets the validator-skipping signature Gemini 3 requires."""
    mine = HistoryEntry("get_weather", {"city": "Paris"}, {"forecast": "sunny"},
                        call_id="call_a", reasoning=ReasoningState(
                            "gemini:gemini-3-pro-preview", ({"thoughtSignature": "U0lHLUE="},)))
    foreign = HistoryEntry("get_weather", {"city": "Rome"}, {"forecast": "rain"},
                           call_id="call_b", reasoning=ReasoningState(
                               "gemini:gemini-2.5-flash", ({"thoughtSignature": "U0lHLUI="},)))
    request = PassRequest(context_items=QUESTION, function_history=[mine, foreign],
                          tools=TOOLS)
    body, recorded = await host_request(
        "gemini", "https://generativelanguage.googleapis.com/v1beta", request,
        model="gemini-3-pro-preview", reasoning={"effort": "medium"})
    assert_golden("gemini_3_thinking_tool_turns", body)
    assert recorded.path == "/v1beta/models/gemini-3-pro-preview:streamGenerateContent"
    assert recorded.query == {"alt": "sse"} and recorded.headers["x-goog-api-key"] == TEST_KEY
    assert body["generationConfig"]["thinkingConfig"] == {"thinkingLevel": "HIGH",
                                                          "includeThoughts": True}
    calls = [p for c in body["contents"] for p in c["parts"] if "functionCall" in p]
    assert [c["thoughtSignature"] for c in calls] == ["U0lHLUE=", SKIP_SIGNATURE]


async def test_gemini_25_budget_is_added_to_the_output_limit() -> None:
    """covers P2: Gemini 2.5 takes a budget, and the visible reply keeps its own limit."""
    body, _ = await host_request("gemini", "https://generativelanguage.googleapis.com/v1beta",
                                 tool_turn("x"), model="gemini-2.5-flash",
                                 reasoning={"effort": "low"})
    assert body["generationConfig"] == {
        "maxOutputTokens": 4096 + 2048,
        "thinkingConfig": {"thinkingBudget": 2048, "includeThoughts": True}}
