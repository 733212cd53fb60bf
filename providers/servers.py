"""The OpenAI-compatible server families, and what each one accepts and returns.

"OpenAI-compatible" is a family of dialects: hosts differ in the request fields they take
(Mistral forbids any field its schema does not name and answers 422 `extra_forbidden`), in
how reasoning is asked for (`reasoning_effort`, OpenRouter's `reasoning` object, DeepSeek's
`thinking` switch) and in which reasoning they want back with a tool call (DeepSeek and
Moonshot refuse a tool-call turn without its `reasoning_content`; OpenRouter wants
`reasoning_details` back exactly as sent; Mistral takes its thinking chunks back in the
assistant's content). Each profile below follows its host's public documentation, named
in `source`; a host not listed is `generic` (llama.cpp, vLLM, Ollama, TGI, LM Studio), which
tolerate unknown fields and are sent the reasoning field they themselves streamed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

ServerFamily = Literal[
    "generic", "openai", "azure", "mistral", "deepseek", "moonshot", "groq", "xai", "openrouter"
]
ReasoningRequest = Literal["reasoning_effort", "openrouter", "deepseek"]
ReplayField = Literal["reasoning_content", "reasoning", "reasoning_details", "thinking_chunks"]
"""Where reasoning state goes back on an assistant tool-call message: the OpenAI-style
fields of that name, or (`thinking_chunks`) Mistral's typed chunks in `content`."""

MISTRAL_REQUEST_FIELDS = frozenset({
    "model", "messages", "temperature", "top_p", "max_tokens", "stream", "stop",
    "random_seed", "metadata", "response_format", "tools", "tool_choice", "presence_penalty",
    "frequency_penalty", "n", "prediction", "parallel_tool_calls", "reasoning_effort",
    "prompt_mode", "guardrails", "prompt_cache_key", "safe_prompt",
})
"""Mistral's `ChatCompletionStreamRequest`, every field it names (mistralai/client-python,
`src/mistralai/client/models/chatcompletionstreamrequest.py`, generated from Mistral's
OpenAPI document; docs.mistral.ai/api, "Chat Completion"). Anything else is a 422."""

MISTRAL_MESSAGE_FIELDS: dict[str, frozenset[str]] = {
    "system": frozenset({"role", "content"}),
    "user": frozenset({"role", "content"}),
    "assistant": frozenset({"role", "content", "tool_calls", "prefix"}),
    "tool": frozenset({"role", "content", "tool_call_id", "name"}),
}
"""Mistral's `SystemMessage`, `UserMessage`, `AssistantMessage` and `ToolMessage` fields
(the same client's `models/*message.py`)."""


@dataclass(frozen=True, slots=True)
class ServerProfile:
    """What one family of Chat Completions servers accepts, by its documentation.

    `stream_usage`: the host takes `stream_options: {"include_usage": true}` (Mistral's
    schema has no such field and sends usage on its last chunk anyway).
    `request_fields` / `message_fields`: the host's whole request schema when it refuses
    unknown fields; None where extra fields are tolerated.
    `reasoning_request`: how the reasoning setting is sent.
    `replay`: the reasoning-state fields the host takes back on a tool-call turn."""

    family: ServerFamily
    source: str
    stream_usage: bool = True
    request_fields: frozenset[str] | None = None
    message_fields: dict[str, frozenset[str]] | None = None
    reasoning_request: ReasoningRequest = "reasoning_effort"
    replay: frozenset[ReplayField] = frozenset()

    def allows(self, field: str) -> bool:
        return self.request_fields is None or field in self.request_fields


PROFILES: dict[ServerFamily, ServerProfile] = {
    "generic": ServerProfile(
        "generic",
        "llama.cpp tools/server/README.md (`reasoning_content` in and out), vLLM "
        "'OpenAI-Compatible Server' (extra fields are ignored), Ollama docs/openai.md",
        replay=frozenset({"reasoning_content", "reasoning"}),
    ),
    "openai": ServerProfile(
        "openai", "https://platform.openai.com/docs/api-reference/chat/create (Chat "
        "Completions returns no reasoning to send back; `reasoning_effort` for o-series and "
        "gpt-5 models only)",
    ),
    "azure": ServerProfile(
        "azure", "https://learn.microsoft.com/azure/ai-foundry/openai/reference (the OpenAI "
        "schema; `stream_options` from API version 2024-09-01-preview)",
    ),
    "mistral": ServerProfile(
        "mistral", "https://docs.mistral.ai/api/ (ChatCompletionStreamRequest; "
        "mistralai/client-python models), https://docs.mistral.ai/capabilities/reasoning/",
        stream_usage=False,
        request_fields=MISTRAL_REQUEST_FIELDS,
        message_fields=MISTRAL_MESSAGE_FIELDS,
        replay=frozenset({"thinking_chunks"}),
    ),
    "deepseek": ServerProfile(
        "deepseek", "https://api-docs.deepseek.com/guides/thinking_mode (a tool-call turn's "
        "reasoning_content must come back, or HTTP 400)",
        reasoning_request="deepseek",
        replay=frozenset({"reasoning_content"}),
    ),
    "moonshot": ServerProfile(
        "moonshot", "https://platform.moonshot.ai/docs/api/chat (usage in choices[0].usage; "
        "kimi thinking models keep reasoning_content across tool calls; MoonshotAI/kosong "
        "chat_provider/kimi.py)",
        replay=frozenset({"reasoning_content"}),
    ),
    "groq": ServerProfile(
        "groq", "https://console.groq.com/docs/reasoning (usage in x_groq.usage; no way to "
        "send reasoning back is documented)",
    ),
    "xai": ServerProfile(
        "xai", "https://docs.x.ai/docs/guides/reasoning (reasoning_content out; encrypted "
        "reasoning only through the Responses API)",
    ),
    "openrouter": ServerProfile(
        "openrouter", "https://openrouter.ai/docs/use-cases/reasoning-tokens (the `reasoning` "
        "request object; reasoning_details preserved across tool calls)",
        reasoning_request="openrouter",
        replay=frozenset({"reasoning_details"}),
    ),
}

_HOSTS: tuple[tuple[str, ServerFamily], ...] = (
    ("api.openai.com", "openai"),
    (".openai.azure.com", "azure"),
    (".cognitiveservices.azure.com", "azure"),
    (".services.ai.azure.com", "azure"),
    ("api.mistral.ai", "mistral"),
    ("api.deepseek.com", "deepseek"),
    ("api.moonshot.ai", "moonshot"),
    ("api.moonshot.cn", "moonshot"),
    ("api.groq.com", "groq"),
    ("api.x.ai", "xai"),
    ("openrouter.ai", "openrouter"),
)


def default_server(base_url: str | None) -> ServerFamily:
    """The family a base URL's host belongs to (no URL: OpenAI's own API)."""
    if base_url is None:
        return "openai"
    host = (urlsplit(base_url).hostname or "").lower()
    for name, family in _HOSTS:
        if host == name.lstrip(".") or (name.startswith(".") and host.endswith(name)):
            return family
    return "generic"
