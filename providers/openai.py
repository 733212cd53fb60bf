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
  finishing choice chunk (Ollama, older servers), inside the choice itself
  (`choices[0].usage`, Moonshot), under `x_groq.usage` (Groq), after a content-filter
  finish (Azure), or not at all (vLLM without `stream_options`): all are counted (P7);
- errors after HTTP 200 arrive as `data: {"error": ...}` (OpenRouter adds an integer
  `code`), as an SSE `event: error`, or as llama.cpp's legacy `error: {"code", "message",
  "type"}` line (read by the SSE parser as an `error` event);
- `reasoning_content` (vLLM, llama.cpp, DeepSeek), `reasoning` (OpenRouter, Ollama),
  `reasoning_details` (OpenRouter) and Mistral's `thinking` content chunks are thinking
  text, not the reply (`chat_reasoning.py`); `delta.content` may be a list of typed chunks
  (Mistral) as well as a string;
- `[DONE]` may be absent (Ollama): a clean close after a finish reason is a normal end;
- every finish reason is sorted by `endings.CHAT_COMPLETIONS` (P6): `content_filter` is a
  block, `length` a cut reply, an unknown word an error.

Requests follow the config's capabilities: the host's profile (`servers.py`: its request
schema, `stream_options`, how reasoning is asked for and sent back), the output limit's
field name (`max_completion_tokens` for OpenAI's reasoning models), the tools allowed, the
prefill mode (`prefix: true` for Mistral), and Mistral's message rules
(`dialect="mistral"`): tool-call ids of exactly nine letters and digits, and an assistant
turn between a tool result and a following user turn.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import string
from dataclasses import dataclass, field
from typing import Any

from fsm import (
    Finish,
    PassRequest,
    ProviderError,
    ProviderEvent,
    ReasoningState,
    TextDelta,
    ToolCallRequest,
    Usage,
)

from .capabilities import default_max_tokens_field
from .chat_reasoning import ChatReasoning, replay_fields
from .context import (
    ImagePart,
    Message,
    directives_text,
    history_turns,
    normalize_items,
    normalize_tools,
    turn_text,
)
from .endings import CHAT_COMPLETIONS, ending_error
from .errors import ErrorDetails, error_details, incomplete_stream, stream_error
from .http import SSEProvider
from .prefill import PREFILL_INSTRUCTION, PREFILL_PREFIX_FLAG, PrefillMode, prefill_message
from .reasoning import chat_effort, own_state
from .servers import ServerProfile
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
        profile = self.config.server_profile
        mistral = self.config.message_dialect == "mistral"
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": chat_messages(request, self.prefill_mode, mistral=mistral,
                                      profile=profile, origin=self.config.reasoning_origin),
            "stream": True,
        }
        if profile.stream_usage:
            body["stream_options"] = {"include_usage": True}
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
            limit = self.config.output_limit_field
            body[limit if profile.allows(limit) else "max_tokens"] = \
                self.config.max_output_tokens
        body.update(self.reasoning_fields(profile))
        return within_schema(body, profile)

    def reasoning_fields(self, profile: ServerProfile) -> dict[str, Any]:
        """The reasoning setting in the host's own words (P2); OpenAI's own API takes
        `reasoning_effort` only for its reasoning models and refuses it for the others."""
        setting = self.config.reasoning
        if setting is None:
            return {}
        effort = chat_effort(setting)
        if profile.reasoning_request == "openrouter":
            if setting.budget_tokens is not None:
                return {"reasoning": {"max_tokens": setting.budget_tokens}}
            return {"reasoning": {"effort": effort}}
        if profile.reasoning_request == "deepseek":
            switch = {"thinking": {"type": "enabled" if setting.on else "disabled"}}
            return {**switch, "reasoning_effort": effort} if setting.on and effort else switch
        if profile.family in ("openai", "azure") and \
                default_max_tokens_field(self.config.model) != "max_completion_tokens":
            return {}
        return {"reasoning_effort": effort} if effort else {}

    def new_decoder(self) -> ChatCompletionsDecoder:
        return ChatCompletionsDecoder(self.config.reasoning_origin)


def within_schema(body: dict[str, Any], profile: ServerProfile) -> dict[str, Any]:
    """The body less what a host with a closed schema (Mistral) does not name, in the
    request and in each message; other hosts get it as it is (P1)."""
    if profile.request_fields is None:
        return body
    out = {key: value for key, value in body.items() if profile.allows(key)}
    fields = profile.message_fields
    if fields is not None:
        out["messages"] = [
            {key: value for key, value in message.items()
             if key in fields.get(str(message.get("role")), frozenset())}
            for message in out.get("messages", [])
        ]
    return out


def chat_messages(
    request: PassRequest, prefill_mode: PrefillMode = "native", *, mistral: bool = False,
    profile: ServerProfile | None = None, origin: str = "",
) -> list[dict[str, Any]]:
    """System prompt, context, function history, notices (a system message, A4), then the
    prefill last (S1, T7).
    A tool-call turn carries back the reasoning this model left on it, in the fields the
    host takes (P5)."""
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
        if profile is not None and profile.replay:
            items = own_state((call.entry.reasoning for call in turn), origin)
            assistant.update(replay_fields(items, profile.replay, text))
        messages.append(assistant)
        messages.extend(
            {"role": "tool", "tool_call_id": call_id(call.call_id), "content": call.result_json}
            for call in turn
        )
    prefill = prefill_message(prefill_mode, request.prefill)
    directives = directives_text(request, prefill)
    if directives:
        messages.append({"role": "system", "content": directives})
    if prefill is not None and prefill.mode != PREFILL_INSTRUCTION:
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
    """Mistral rejects a user (or system) turn right after a tool result: put an assistant
    turn between."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] in ("user", "system") and out and out[-1]["role"] == "tool":
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
    """Decodes one Chat Completions stream (first choice only).

    A finish reason that is not an answer (P6) is held until the stream ends, so the usage
    chunk that follows it (Azure after a content-filter block, every host with
    `include_usage`) is still read and counted (P7)."""

    def __init__(self, origin: str = "") -> None:
        self._origin = origin
        self._calls: list[_PendingCall] = []
        self._finish_reason: str | None = None
        self._ending: ProviderError | None = None
        self._reasoning = ChatReasoning()
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
        usage: Usage | None = None
        for choice in choices or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                out.extend(self._choice(choice))
                usage = _usage(choice.get("usage")) or usage
        x_groq = payload.get("x_groq")
        for raw in (x_groq.get("usage") if isinstance(x_groq, dict) else None,
                    payload.get("usage")):
            usage = _usage(raw) or usage
        if usage is not None:
            out.append(usage)
        return out

    def finish(self) -> list[ProviderEvent]:
        if self._finish_reason is None:
            marker = "a finish reason ([DONE] came without one)" if self._done else \
                "a finish reason"
            return [incomplete_stream(marker)]
        out = self._flush_calls()
        out.append(Finish(self._finish_reason))
        if self._ending is not None:
            out.append(self._ending)
        return out

    def _choice(self, choice: dict[str, Any]) -> list[ProviderEvent]:
        out: list[ProviderEvent] = []
        delta = choice.get("delta")
        if isinstance(delta, dict):
            out.extend(self._reasoning.delta(delta))
            content = delta.get("content")
            if isinstance(content, list):
                out.extend(self._reasoning.content_chunks(content))
            for text in (content, delta.get("refusal")):
                if isinstance(text, str) and text:
                    out.append(TextDelta(text))
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    if isinstance(call, dict):
                        self._accumulate(call)
            legacy = delta.get("function_call")
            if isinstance(legacy, dict):
                self._accumulate({"index": 0, "function": legacy})
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason and self._finish_reason is None:
            self._finish_reason = reason
            self._ending = ending_error(CHAT_COMPLETIONS, reason, making_calls=bool(self._calls))
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
        """Emit the collected calls; on a cut ending the last one was cut mid-stream. The
        pass's reasoning rides on the first call, which carries it back (P5)."""
        last = len(self._calls) - 1
        cut = self._finish_reason is not None and \
            CHAT_COMPLETIONS.ending(self._finish_reason) in ("truncated", "context")
        calls: list[ProviderEvent] = []
        state = self._reasoning.state(self._origin) if self._calls else None
        for i, p in enumerate(self._calls):
            call = tool_call(p.name, "".join(p.fragments), p.id, cut=cut and i == last)
            calls.append(_with_reasoning(call, state) if i == 0 else call)
        self._calls = []
        return calls


def _with_reasoning(call: ToolCallRequest, state: ReasoningState | None) -> ToolCallRequest:
    return call if state is None else dataclasses.replace(call, reasoning=state)


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


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)
