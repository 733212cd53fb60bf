"""OpenAI Chat Completions streaming, written for the whole OpenAI-compatible family.

Servers that speak this format disagree in small ways, and each one is tolerated here:

- tool-call fragments are joined by `index`; at one index a new call starts only when a
  delta names a different function, or names one again after the previous call's arguments
  already formed a whole object (servers that reuse index 0 for every call). A changed id
  alone is not a new call (some servers mint one per delta), and ids and names repeated on
  every delta are kept once, not concatenated; missing ids are minted;
- a stream that ends — by `[DONE]` or by closing — without a finish reason is incomplete,
  an error the engine falls back on, whatever text came before it;
- `finish_reason: "stop"` with tool calls (llama.cpp, some vLLM parsers) still yields the
  calls: calls are emitted on any finish reason, and the provider's word is kept as is;
- usage may come in a final chunk with empty `choices` (OpenAI, OpenRouter), inside the
  finishing choice chunk (Ollama, older servers), or not at all (vLLM without
  `stream_options`);
- errors after HTTP 200 arrive as `data: {"error": ...}` (OpenRouter adds an integer
  `code`), as an SSE `event: error`, or as llama.cpp's legacy `error: {"code", "message",
  "type"}` line (read by the SSE parser as an `error` event);
- `reasoning_content` (vLLM, llama.cpp, DeepSeek) and `reasoning` (OpenRouter, Ollama) are
  thinking text, not the reply;
- `[DONE]` may be absent (Ollama): a clean close after a finish reason is a normal end;
- Azure's `content_filter` finish is a block, like Gemini's SAFETY.

Requests follow the config's capabilities: the output limit's field name
(`max_completion_tokens` for OpenAI's reasoning models), the tools allowed, the prefill mode
(`prefix: true` for Mistral), and Mistral's message rules (`dialect="mistral"`): tool-call
ids of exactly nine letters and digits, and an assistant turn between a tool result and a
following user turn.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
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
    history_turns,
    normalize_items,
    normalize_tools,
    notices_text,
    turn_text,
)
from .errors import ErrorDetails, error_details, incomplete_stream, stream_error
from .http import SSEProvider
from .prefill import PREFILL_INSTRUCTION, PREFILL_PREFIX_FLAG, PrefillMode, prefill_message
from .sse import SSEEvent, json_payload
from .toolcalls import tool_call
from .usage import nonzero, token_count

_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")
_ALPHANUMERIC = string.ascii_letters + string.digits
MISTRAL_BRIDGE = "(Tool results received.)"
"""The assistant turn Mistral requires between a tool result and the next user turn."""


class OpenAIProvider(SSEProvider):
    """Chat Completions: OpenAI itself and the servers that copy its API."""

    def endpoint(self) -> str:
        return f"{self.config.endpoint_base}/chat/completions"

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}

    def build_body(self, request: PassRequest) -> dict[str, Any]:
        mistral = self.config.message_dialect == "mistral"
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": chat_messages(request, self.prefill_mode, mistral=mistral),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        tools = self.allowed_tools(normalize_tools(request.tools))
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
            body[self.config.output_limit_field] = self.config.max_output_tokens
        return body

    def new_decoder(self) -> ChatCompletionsDecoder:
        return ChatCompletionsDecoder()


def chat_messages(
    request: PassRequest, prefill_mode: PrefillMode = "native", *, mistral: bool = False
) -> list[dict[str, Any]]:
    """System prompt, context, function history, notices, then the prefill last (S1, T7)."""
    call_id = mistral_call_id if mistral else _same
    messages: list[dict[str, Any]] = []
    if request.system_prompt:
        messages.append({"role": "system", "content": request.system_prompt})
    messages.extend(_message(message) for message in normalize_items(request.context_items))
    for turn in history_turns(request):
        assistant: dict[str, Any] = {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call_id(call.call_id),
                    "type": "function",
                    "function": {"name": call.entry.tool_name, "arguments": call.arguments_json},
                }
                for call in turn
            ],
        }
        text = turn_text(turn)
        if text:
            assistant["content"] = text
        messages.append(assistant)
        messages.extend(
            {"role": "tool", "tool_call_id": call_id(call.call_id), "content": call.result_json}
            for call in turn
        )
    notices = notices_text(request)
    if notices:
        messages.append({"role": "user", "content": notices})
    prefill = prefill_message(prefill_mode, request.prefill)
    if prefill is not None and prefill.mode == PREFILL_INSTRUCTION:
        messages.append({"role": "user", "content": prefill.text})
    elif prefill is not None:
        final: dict[str, Any] = {"role": "assistant", "content": prefill.text}
        if prefill.mode == PREFILL_PREFIX_FLAG:
            final["prefix"] = True
        messages.append(final)
    return _bridge_tool_results(messages) if mistral else messages


def mistral_call_id(call_id: str) -> str:
    """Mistral accepts only ids of nine letters and digits: others are mapped, the same
    way for a call and its result, by a hash of the original id."""
    if _MISTRAL_ID.fullmatch(call_id):
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    out = []
    for _ in range(9):
        number, digit = divmod(number, len(_ALPHANUMERIC))
        out.append(_ALPHANUMERIC[digit])
    return "".join(out)


def _bridge_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mistral rejects a user turn right after a tool result: put an assistant turn between."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "user" and out and out[-1]["role"] == "tool":
            out.append({"role": "assistant", "content": MISTRAL_BRIDGE})
        out.append(message)
    return out


def _same(call_id: str) -> str:
    return call_id


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
            bare = {"error": payload} if "error" not in payload else payload
            details = error_details(bare) or ErrorDetails(
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
        if self._finish_reason is None:
            marker = "a finish reason ([DONE] came without one)" if self._done else \
                "a finish reason"
            return [incomplete_stream(marker)]
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
        name = function.get("name")
        name = name if isinstance(name, str) and name else None
        call_id = call.get("id")
        call_id = call_id if isinstance(call_id, str) and call_id else None
        pending = self._pending_for(call, name, call_id)
        if call_id is not None and pending.id is None:
            pending.id = call_id
        if name is not None and not pending.name:
            pending.name = name
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            pending.fragments.append(arguments)
        elif isinstance(arguments, dict):
            pending.fragments = [_json(arguments)]

    def _pending_for(
        self, call: dict[str, Any], name: str | None, call_id: str | None
    ) -> _PendingCall:
        index = call.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else None
        current = next((p for p in reversed(self._calls) if p.index == index), None)
        if current is not None and not _starts_new_call(current, name, call_id):
            return current
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


def _starts_new_call(current: _PendingCall, name: str | None, call_id: str | None) -> bool:
    """At one index, a delta begins another call only when it names a function and that is
    either a different one, or the same one under a different id after the current call's
    arguments already form a whole object (parallel calls of one function at index 0)."""
    if name is None or not current.name:
        return False
    if name != current.name:
        return True
    if call_id is None or current.id is None or call_id == current.id:
        return False
    return _whole_object("".join(current.fragments))


def _whole_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


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
