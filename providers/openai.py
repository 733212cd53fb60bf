"""OpenAI Chat Completions streaming, written for the whole OpenAI-compatible family.

Servers that speak this format disagree in small ways, and each one is tolerated here:

- tool-call fragments are joined by `index`; servers that omit it (or reuse index 0 for
  every call) are told apart by call id; missing ids are minted;
- `finish_reason: "stop"` with tool calls (llama.cpp, some vLLM parsers) still yields the
  calls: calls are emitted on any finish reason, and the provider's word is kept as is;
- usage may come in a final chunk with empty `choices` (OpenAI, OpenRouter), inside the
  finishing choice chunk (Ollama, older servers), or not at all (vLLM without
  `stream_options`);
- errors after HTTP 200 arrive as `data: {"error": ...}` (OpenRouter adds an integer
  `code`), or as an SSE `event: error`;
- `reasoning_content` (vLLM, llama.cpp, DeepSeek) and `reasoning` (OpenRouter, Ollama) are
  thinking text, not the reply;
- `[DONE]` may be absent (Ollama): a clean close after a finish reason is a normal end;
- Azure's `content_filter` finish is a block, like Gemini's SAFETY.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fsm.engine.provider import (
    Finish,
    PassRequest,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    Usage,
)

from .context import (
    ImagePart,
    Message,
    history_calls,
    normalize_items,
    normalize_tools,
    notices_text,
)
from .errors import ErrorDetails, error_details, incomplete_stream, stream_error
from .http import SSEProvider
from .sse import SSEEvent, json_payload
from .toolcalls import tool_call
from .usage import nonzero, token_count


class OpenAIProvider(SSEProvider):
    """Chat Completions: OpenAI itself and the servers that copy its API."""

    def endpoint(self) -> str:
        return f"{self.config.endpoint_base}/chat/completions"

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}

    def build_body(self, request: PassRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": chat_messages(request),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        tools = normalize_tools(request.tools)
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in tools
            ]
        if self.config.max_output_tokens is not None:
            body["max_tokens"] = self.config.max_output_tokens
        return body

    def new_decoder(self) -> ChatCompletionsDecoder:
        return ChatCompletionsDecoder()


def chat_messages(request: PassRequest) -> list[dict[str, Any]]:
    """System prompt, context, function history, notices, then the prefill last (S1, T7)."""
    messages: list[dict[str, Any]] = []
    if request.system_prompt:
        messages.append({"role": "system", "content": request.system_prompt})
    messages.extend(_message(message) for message in normalize_items(request.context_items))
    for call in history_calls(request):
        assistant: dict[str, Any] = {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.entry.tool_name, "arguments": call.arguments_json},
                }
            ],
        }
        if call.entry.pre_tool_text:
            assistant["content"] = call.entry.pre_tool_text
        messages.append(assistant)
        messages.append({"role": "tool", "tool_call_id": call.call_id, "content": call.result_json})
    notices = notices_text(request)
    if notices:
        messages.append({"role": "user", "content": notices})
    if request.prefill:
        messages.append({"role": "assistant", "content": request.prefill})
    return messages


def _message(message: Message) -> dict[str, Any]:
    if message.role != "user" or all(not isinstance(p, ImagePart) for p in message.parts):
        return {"role": message.role, "content": message.text}
    content: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ImagePart):
            url = part.url or f"data:{part.mime_type};base64,{part.data}"
            content.append({"type": "image_url", "image_url": {"url": url}})
        else:
            content.append({"type": "text", "text": part.text})
    return {"role": message.role, "content": content}


@dataclass(slots=True)
class _PendingCall:
    index: int | None
    id: str | None = None
    name: str = ""
    fragments: list[str] = field(default_factory=list)


class ChatCompletionsDecoder:
    """Decodes one Chat Completions stream (first choice only)."""

    def __init__(self) -> None:
        self._calls: list[_PendingCall] = []
        self._finish_reason: str | None = None
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, event: SSEEvent) -> list[ProviderEvent]:
        if event.data.strip() == "[DONE]":
            self._done = True
            return []
        payload = json_payload(event)
        if isinstance(payload, ProviderError):
            return [payload]
        if payload.get("error") or event.event == "error":
            details = error_details(payload) or ErrorDetails(
                str(payload.get("message", event.data))
            )
            return [stream_error(details)]
        out: list[ProviderEvent] = []
        choices = payload.get("choices")
        if choices is not None and not isinstance(choices, list):
            return [ProviderError(kind="provider_stream_error", type="malformed_event",
                                  message=f"chunk `choices` is {type(choices).__name__}, "
                                          "not a list")]
        for choice in choices or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out.extend(self._choice(choice))
        usage = _usage(payload.get("usage"))
        if usage is not None:
            out.append(usage)
        return out

    def finish(self) -> list[ProviderEvent]:
        if self._finish_reason is None and not self._done:
            return [incomplete_stream("a finish reason or [DONE]")]
        out = self._flush_calls()
        if self._finish_reason is not None:
            out.append(Finish(self._finish_reason))
        return out

    def _choice(self, choice: dict[str, Any]) -> list[ProviderEvent]:
        out: list[ProviderEvent] = []
        delta = choice.get("delta")
        if isinstance(delta, dict):
            reasoning = _first_text(delta.get("reasoning_content"), delta.get("reasoning"))
            if reasoning:
                out.append(ReasoningDelta(reasoning))
            for key in ("content", "refusal"):
                text = delta.get(key)
                if isinstance(text, str) and text:
                    out.append(TextDelta(text))
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    if isinstance(call, dict):
                        self._accumulate(call)
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self._finish_reason = reason
            if reason == "content_filter":
                out.append(
                    ProviderError(
                        kind="blocked",
                        type="content_filter",
                        message="the provider's content filter stopped the reply",
                    )
                )
            else:
                out.extend(self._flush_calls())
        return out

    def _accumulate(self, call: dict[str, Any]) -> None:
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        pending = self._pending_for(call, function)
        call_id = call.get("id")
        if isinstance(call_id, str) and call_id and pending.id is None:
            pending.id = call_id
        name = function.get("name")
        if isinstance(name, str) and name and not pending.name:
            pending.name = name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            pending.fragments.append(arguments)
        elif isinstance(arguments, dict):
            pending.fragments = [_json(arguments)]

    def _pending_for(self, call: dict[str, Any], function: dict[str, Any]) -> _PendingCall:
        index = call.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else None
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
        for pending in reversed(self._calls):
            same_index = index is not None and pending.index == index
            same_id = call_id is not None and pending.id == call_id
            if same_id or (same_index and (call_id is None or pending.id is None)):
                return pending
        if index is None and call_id is None and not function.get("name") and self._calls:
            return self._calls[-1]
        pending = _PendingCall(index)
        self._calls.append(pending)
        return pending

    def _flush_calls(self) -> list[ProviderEvent]:
        """Emit the collected calls; on a `length` stop the last one was cut mid-stream."""
        last = len(self._calls) - 1
        cut = self._finish_reason == "length"
        calls: list[ProviderEvent] = [
            tool_call(p.name, "".join(p.fragments), p.id, cut=cut and i == last)
            for i, p in enumerate(self._calls)
        ]
        self._calls = []
        return calls


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    usage = Usage(
        input_tokens=token_count(raw.get("prompt_tokens")),
        output_tokens=token_count(raw.get("completion_tokens")),
        total_tokens=token_count(raw.get("total_tokens")),
        thoughts_tokens=nonzero(reasoning),
    )
    return usage if usage.as_dict() else None


def _first_text(*values: Any) -> str:
    for value in values:
        if isinstance(value, str) and value:
            return value
    return ""


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)
