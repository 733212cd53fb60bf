"""Anthropic Messages streaming.

The stream is a sequence of typed events: `message_start` (input usage), content blocks
(`text`, `thinking`, `tool_use` with `input_json_delta` fragments) between
`content_block_start` and `content_block_stop`, `message_delta` (stop reason, output usage)
and `message_stop`. `ping` is liveness. `event: error` is an in-band error after HTTP 200.
Anthropic adds event and block types over time, so unknown ones are ignored, not errors.

Tool calls are held until `message_delta` says why the message stopped: on `max_tokens` or
`model_context_window_exceeded` the last tool block may have been cut mid-JSON (even when
what arrived happens to parse, e.g. an empty input), so it is marked truncated and never
runs (T4). A proxy may drop the events' `index` (from all of them or from some kinds): the
blocks still come in order, one at a time, so a start without one opens the next block and
any other event without one is about the block started last. Every stop reason is sorted
by `endings.ANTHROPIC` (P6): `refusal` is a block, `max_tokens` and `pause_turn` a cut
reply, and the usage on the same `message_delta` is counted whatever the reason (P7).

Extended thinking (P2, P5): the `reasoning` setting becomes `thinking` with a budget, and
`max_tokens` is the output limit plus that budget, so thinking does not eat the reply. The
thinking blocks a tool-use message streamed (`thinking` text with the signature that
`signature_delta` delivers, `redacted_thinking` data) ride on its first call and go back
first in that assistant turn, unchanged and in order, as the API requires; another model's
blocks are never sent (their signatures are refused). When the last tool-use turn has no
thinking of this model's (a fallback after another model's calls), thinking is left off
for that request, which the API names as the way to avoid the requirement.

A prefill goes as the final assistant turn (`native`) or, for models that reject one
(Claude 4.6 and later, and any model with thinking on), as a closing user instruction
(`prefill.py`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from fsm import (
    Finish,
    KeepAlive,
    PassRequest,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    ReasoningState,
    TextDelta,
    ToolCallRequest,
    Usage,
)

from .context import (
    ImagePart,
    Message,
    Part,
    directives_text,
    history_turns,
    normalize_items,
    normalize_tools,
    turn_text,
)
from .endings import ANTHROPIC, ending_error
from .errors import ErrorDetails, error_details, incomplete_stream, stream_error
from .http import SSEProvider
from .prefill import PREFILL_INSTRUCTION, PrefillMode, prefill_message
from .reasoning import anthropic_thinking, made_here, own_state
from .sse import SSEEvent, json_payload
from .toolcalls import tool_call
from .usage import token_count

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
CUT_STOP_REASONS = frozenset({"max_tokens", "model_context_window_exceeded"})
THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
_TOOL_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


class AnthropicProvider(SSEProvider):
    """Anthropic Messages API."""

    def endpoint(self) -> str:
        return f"{self.config.endpoint_base}/messages"

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key}

    def headers(self, api_key: str | None = None) -> dict[str, str]:
        return {"anthropic-version": API_VERSION, **super().headers(api_key)}

    def build_body(self, request: PassRequest) -> dict[str, Any]:
        messages = normalize_items(request.context_items)
        system_parts = [request.system_prompt] if request.system_prompt else []
        system_parts += [m.text for m in messages if m.role == "system"]
        system_parts.append(directives_text(
            request, prefill_message(self.prefill_mode, request.prefill.rstrip())))
        system = "\n\n".join(part for part in system_parts if part)
        origin = self.config.reasoning_origin
        limit = self.config.max_output_tokens or DEFAULT_MAX_TOKENS
        body: dict[str, Any] = {
            "model": self.config.model,
            "max_tokens": limit,
            "stream": True,
            "messages": anthropic_messages(request, messages, self.prefill_mode, origin),
        }
        thinking = anthropic_thinking(self.config.reasoning)
        if thinking is not None and _last_turn_thought_here(request, origin):
            body["thinking"] = thinking
            body["max_tokens"] = limit + thinking["budget_tokens"]
        if system:
            body["system"] = system
        tools = self.allowed_tools(normalize_tools(request.tools))
        if tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in tools
            ]
        return body

    def new_decoder(self) -> MessagesDecoder:
        return MessagesDecoder(self.config.reasoning_origin)


def _last_turn_thought_here(request: PassRequest, origin: str) -> bool:
    """Whether the lastmost tool-use turn starts with this model's thinking, as a request
    with thinking on requires ("a final assistant message must start with a thinking
    block"); true when there is no tool turn at all."""
    turns = history_turns(request)
    return not turns or any(made_here(call.entry.reasoning, origin) for call in turns[-1])


def anthropic_messages(
    request: PassRequest, messages: list[Message], prefill_mode: PrefillMode = "native",
    origin: str = "",
) -> list[dict[str, Any]]:
    """Context, function history, then the prefill last (S1, T7).

    System items, notices and the continuation instruction were lifted into `system` (A4).
    The prefill loses trailing whitespace because the API rejects a final assistant turn
    that ends with it.
    """
    out: list[dict[str, Any]] = [
        {"role": m.role, "content": [_block(part) for part in m.parts]}
        for m in messages
        if m.role != "system"
    ]
    for turn in history_turns(request):
        content: list[dict[str, Any]] = [
            block for block in own_state((call.entry.reasoning for call in turn), origin)
            if block.get("type") in THINKING_BLOCKS
        ]
        text = turn_text(turn)
        if text:
            content.append({"type": "text", "text": text})
        content.extend(
            {
                "type": "tool_use",
                "id": _TOOL_ID_UNSAFE.sub("_", call.call_id),
                "name": call.entry.tool_name,
                "input": call.entry.arguments,
            }
            for call in turn
        )
        out.append({"role": "assistant", "content": content})
        results = [
            {
                "type": "tool_result",
                "tool_use_id": _TOOL_ID_UNSAFE.sub("_", call.call_id),
                "content": call.result_json,
                "is_error": not call.entry.success,
            }
            for call in turn
        ]
        out.append({"role": "user", "content": results})
    prefill = prefill_message(prefill_mode, request.prefill.rstrip())
    if prefill is not None and prefill.mode != PREFILL_INSTRUCTION:
        out.append({"role": "assistant", "content": [{"type": "text", "text": prefill.text}]})
    return out


def _block(part: Part) -> dict[str, Any]:
    if isinstance(part, ImagePart):
        if part.url:
            return {"type": "image", "source": {"type": "url", "url": part.url}}
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": part.mime_type, "data": part.data},
        }
    return {"type": "text", "text": part.text}


@dataclass(slots=True)
class _ToolBlock:
    index: int
    id: str | None
    name: str
    fragments: list[str] = field(default_factory=list)
    closed: bool = False


class MessagesDecoder:
    """Decodes one Messages stream."""

    def __init__(self, origin: str = "") -> None:
        self._origin = origin
        self._tools: dict[int, _ToolBlock] = {}
        self._thinking: dict[int, dict[str, Any]] = {}
        self._last_index = -1
        self._open = -1
        self._usage: dict[str, int] = {}
        self._stop_reason: str | None = None
        self._ending: ProviderError | None = None
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, event: SSEEvent) -> list[ProviderEvent]:
        payload = json_payload(event)
        if isinstance(payload, ProviderError):
            return [payload]
        kind = payload.get("type") or event.event
        if kind == "content_block_delta":
            return self._delta(payload)
        if kind == "content_block_start":
            return self._start(payload)
        if kind == "content_block_stop":
            block = self._tools.get(self._index(payload))
            if block is not None:
                block.closed = True
            return []
        if kind == "message_start":
            message = payload.get("message")
            return self._update_usage(message.get("usage") if isinstance(message, dict) else None)
        if kind == "message_delta":
            return self._message_delta(payload)
        if kind == "message_stop":
            self._done = True
            return []
        if kind == "ping":
            return [KeepAlive("ping")]
        if kind == "error":
            details = error_details(payload) or ErrorDetails(event.data[:200])
            return [stream_error(details)]
        return []

    def finish(self) -> list[ProviderEvent]:
        if self._stop_reason is None:
            return [incomplete_stream("message_delta with a stop reason")]
        ending: list[ProviderEvent] = [self._ending] if self._ending is not None else []
        return [Finish(self._stop_reason), *ending]

    def _start(self, payload: dict[str, Any]) -> list[ProviderEvent]:
        block = payload.get("content_block")
        if not isinstance(block, dict):
            return []
        index = self._index(payload, starts=True)
        self._open, self._last_index = index, max(self._last_index, index)
        kind = block.get("type")
        if kind == "tool_use":
            call_id = block.get("id") if isinstance(block.get("id"), str) else None
            self._tools[index] = _ToolBlock(index, call_id, str(block.get("name", "")))
            return []
        if kind == "text":
            return _text(TextDelta, block.get("text"))
        if kind == "thinking":
            self._thinking[index] = {"type": "thinking", "thinking": "", "signature": ""}
            return self._thought(index, block.get("thinking"))
        if kind == "redacted_thinking":
            self._thinking[index] = {"type": "redacted_thinking", "data": block.get("data", "")}
        return []

    def _index(self, payload: dict[str, Any], *, starts: bool = False) -> int:
        """The block an event is about. A proxy that drops `index` (from every event, or
        only from some kinds) still sends the blocks in order, one at a time: a start without
        one opens the block after the highest so far, and any other event without one is
        about the block started last. An index that is not an integer (`"1"`, `true`) is none."""
        index = payload.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            return index
        return self._last_index + 1 if starts else self._open

    def _thought(self, index: int, value: Any) -> list[ProviderEvent]:
        block = self._thinking.get(index)
        if block is not None and isinstance(value, str):
            block["thinking"] += value
        return _text(ReasoningDelta, value)

    def _delta(self, payload: dict[str, Any]) -> list[ProviderEvent]:
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            return []
        kind = delta.get("type")
        if kind == "text_delta":
            return _text(TextDelta, delta.get("text"))
        if kind == "thinking_delta":
            return self._thought(self._index(payload), delta.get("thinking"))
        if kind == "signature_delta":
            thought = self._thinking.get(self._index(payload))
            if thought is not None and isinstance(delta.get("signature"), str):
                thought["signature"] = delta["signature"]
        if kind == "input_json_delta":
            block = self._tools.get(self._index(payload))
            fragment = delta.get("partial_json")
            if block is not None and isinstance(fragment, str):
                block.fragments.append(fragment)
        return []

    def _message_delta(self, payload: dict[str, Any]) -> list[ProviderEvent]:
        """The stop reason and the final usage: the usage counts whatever the reason (P7),
        and a reason that is not an answer is reported when the stream ends (P6)."""
        delta = payload.get("delta")
        out: list[ProviderEvent] = []
        if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str) and \
                self._stop_reason is None:
            self._stop_reason = delta["stop_reason"]
            details = delta.get("stop_details")
            explanation = details.get("explanation") if isinstance(details, dict) else None
            self._ending = ending_error(ANTHROPIC, self._stop_reason,
                                        explanation if isinstance(explanation, str) else None,
                                        making_calls=bool(self._tools))
            out.extend(self._tool_calls())
        out.extend(self._update_usage(payload.get("usage")))
        return out

    def _tool_calls(self) -> list[ToolCallRequest]:
        """The message's calls; the first carries its thinking blocks back (P5)."""
        cut_reason = self._stop_reason in CUT_STOP_REASONS
        calls = [
            tool_call(
                block.name,
                "".join(block.fragments),
                block.id,
                cut=not block.closed or (cut_reason and block.index == self._last_index),
            )
            for block in sorted(self._tools.values(), key=lambda b: b.index)
        ]
        self._tools = {}
        if calls and self._thinking:
            blocks = tuple(self._thinking[i] for i in sorted(self._thinking))
            calls[0] = dataclasses.replace(calls[0],
                                           reasoning=ReasoningState(self._origin, blocks))
        return calls

    def _update_usage(self, raw: Any) -> list[ProviderEvent]:
        if not isinstance(raw, dict):
            return []
        for key in (
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens",
        ):
            count = token_count(raw.get(key))
            if count is not None:
                self._usage[key] = count
        if not self._usage:
            return []
        input_keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        has_input = any(key in self._usage for key in input_keys)
        return [
            Usage(
                input_tokens=sum(self._usage.get(k, 0) for k in input_keys) if has_input else None,
                output_tokens=self._usage.get("output_tokens"),
            )
        ]


def _text(kind: type[TextDelta] | type[ReasoningDelta], value: Any) -> list[ProviderEvent]:
    return [kind(value)] if isinstance(value, str) and value else []
