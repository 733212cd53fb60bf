"""Gemini `streamGenerateContent?alt=sse`.

Each event is a whole `GenerateContentResponse`. There is no `[DONE]`: the stream ends when
the server closes it, after a chunk that carries `finishReason`. Function calls come whole
(never fragmented) and, on the Developer API, without ids, so ids are minted. `usageMetadata`
repeats on every chunk with running totals; the last one wins.

Endings that are not answers: a blocked prompt (`promptFeedback.blockReason`, no candidates)
and a safety-type `finishReason` become `ProviderError(kind="blocked")`; a malformed function
call becomes a retryable stream error.

Thinking models attach a `thoughtSignature` to function-call parts and expect it back with
that call in the history. `HistoryEntry` has no field for it, so the adapter remembers the
signature by the call id it minted and puts it back when that id reappears.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from fsm.engine.provider import (
    Finish,
    PassRequest,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    Usage,
)

from .context import (
    ImagePart,
    Message,
    Part,
    history_calls,
    normalize_items,
    normalize_tools,
    notices_text,
)
from .errors import error_details, incomplete_stream, stream_error
from .http import SSEProvider
from .sse import SSEEvent, json_payload
from .toolcalls import mint_call_id
from .usage import nonzero, token_count

if TYPE_CHECKING:
    from .config import ProviderConfig

BLOCKED_FINISH_REASONS = frozenset(
    {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"}
)
FAILED_FINISH_REASONS = frozenset(
    {"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS"}
)
_SIGNATURE_MEMORY = 512


class ThoughtSignatures:
    """Call id -> thoughtSignature, bounded: only the current turn's calls matter."""

    def __init__(self, capacity: int = _SIGNATURE_MEMORY) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, str] = OrderedDict()

    def remember(self, call_id: str, signature: str) -> None:
        self._items[call_id] = signature
        self._items.move_to_end(call_id)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def get(self, call_id: str) -> str | None:
        return self._items.get(call_id)


class GeminiProvider(SSEProvider):
    """Gemini Developer API; remembers thought signatures across the passes of a turn."""

    def __init__(
        self,
        config: ProviderConfig,
        session: aiohttp.ClientSession,
        *,
        on_bytes: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config, session, on_bytes=on_bytes)
        self._signatures = ThoughtSignatures()

    def endpoint(self) -> str:
        model = self.config.model.removeprefix("models/")
        return f"{self.config.endpoint_base}/models/{model}:streamGenerateContent"

    def query(self) -> dict[str, str]:
        return {**super().query(), "alt": "sse"}

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-goog-api-key": api_key}

    def build_body(self, request: PassRequest) -> dict[str, Any]:
        messages = normalize_items(request.context_items)
        system_parts = [request.system_prompt] if request.system_prompt else []
        system_parts += [m.text for m in messages if m.role == "system"]
        body: dict[str, Any] = {"contents": self.contents(request, messages)}
        if system_parts:
            body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system_parts)}]}
        tools = normalize_tools(request.tools)
        if tools:
            declarations = [
                {"name": t.name, "description": t.description, "parametersJsonSchema": t.parameters}
                for t in tools
            ]
            body["tools"] = [{"functionDeclarations": declarations}]
        if self.config.max_output_tokens is not None:
            body["generationConfig"] = {"maxOutputTokens": self.config.max_output_tokens}
        return body

    def contents(self, request: PassRequest, messages: list[Message]) -> list[dict[str, Any]]:
        """Context, function history, notices, then the prefill last (S1, T7)."""
        out: list[dict[str, Any]] = [
            {"role": _role(m), "parts": [_part(p) for p in m.parts]}
            for m in messages
            if m.role != "system"
        ]
        for call in history_calls(request):
            parts: list[dict[str, Any]] = []
            if call.entry.pre_tool_text:
                parts.append({"text": call.entry.pre_tool_text})
            function_call: dict[str, Any] = {
                "functionCall": {"name": call.entry.tool_name, "args": call.entry.arguments}
            }
            signature = self._signatures.get(call.call_id)
            if signature is not None:
                function_call["thoughtSignature"] = signature
            parts.append(function_call)
            out.append({"role": "model", "parts": parts})
            response = {"name": call.entry.tool_name, "response": call.entry.result}
            out.append({"role": "user", "parts": [{"functionResponse": response}]})
        notices = notices_text(request)
        if notices:
            out.append({"role": "user", "parts": [{"text": notices}]})
        if request.prefill:
            out.append({"role": "model", "parts": [{"text": request.prefill}]})
        return out

    def new_decoder(self) -> GenerateContentDecoder:
        return GenerateContentDecoder(self._signatures)


def _role(message: Message) -> str:
    return "model" if message.role == "assistant" else "user"


def _part(part: Part) -> dict[str, Any]:
    if isinstance(part, ImagePart):
        if part.data:
            return {"inlineData": {"mimeType": part.mime_type, "data": part.data}}
        if part.mime_type:
            return {"fileData": {"mimeType": part.mime_type, "fileUri": part.url}}
        return {"text": f"[image: {part.url}]"}
    return {"text": part.text}


class GenerateContentDecoder:
    """Decodes one Gemini stream (first candidate only)."""

    def __init__(self, signatures: ThoughtSignatures) -> None:
        self._signatures = signatures
        self._finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return False

    def feed(self, event: SSEEvent) -> list[ProviderEvent]:
        payload = json_payload(event)
        if isinstance(payload, ProviderError):
            return [payload]
        details = error_details(payload)
        if details is not None:
            return [stream_error(details)]
        out: list[ProviderEvent] = []
        candidates = payload.get("candidates")
        candidate = candidates[0] if isinstance(candidates, list) and candidates else None
        if isinstance(candidate, dict):
            out.extend(self._parts(candidate.get("content")))
        usage = _usage(payload.get("usageMetadata"))
        if usage is not None:
            out.append(usage)
        blocked = _prompt_blocked(payload.get("promptFeedback"))
        if blocked is not None:
            out.append(blocked)
        elif isinstance(candidate, dict) and isinstance(candidate.get("finishReason"), str):
            out.extend(self._finish(candidate))
        return out

    def finish(self) -> list[ProviderEvent]:
        if self._finish_reason is None:
            return [incomplete_stream("a chunk with a finishReason")]
        return [Finish(self._finish_reason)]

    def _parts(self, content: Any) -> list[ProviderEvent]:
        parts = content.get("parts") if isinstance(content, dict) else None
        out: list[ProviderEvent] = []
        for part in parts if isinstance(parts, list) else []:
            if not isinstance(part, dict):
                continue
            text = part.get("text")
            if isinstance(text, str) and text:
                out.append(ReasoningDelta(text) if part.get("thought") else TextDelta(text))
            call = part.get("functionCall")
            if isinstance(call, dict):
                out.append(self._call(call, part.get("thoughtSignature")))
        return out

    def _call(self, call: dict[str, Any], signature: Any) -> ToolCallRequest:
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
        call_id = call_id or mint_call_id()
        if isinstance(signature, str) and signature:
            self._signatures.remember(call_id, signature)
        args = call.get("args")
        arguments = args if isinstance(args, dict) else {}
        return ToolCallRequest(
            name=str(call.get("name", "")),
            arguments=arguments,
            id=call_id,
            raw_arguments=json.dumps(arguments, ensure_ascii=False),
        )

    def _finish(self, candidate: dict[str, Any]) -> list[ProviderEvent]:
        reason = str(candidate["finishReason"])
        message = candidate.get("finishMessage")
        if reason in BLOCKED_FINISH_REASONS:
            return [
                ProviderError(
                    kind="blocked",
                    type=reason,
                    message=str(message or f"the provider stopped the reply ({reason})"),
                )
            ]
        if reason in FAILED_FINISH_REASONS:
            return [
                ProviderError(
                    kind="provider_stream_error",
                    type=reason,
                    message=str(message or f"the model produced an unusable reply ({reason})"),
                    retryable=True,
                )
            ]
        self._finish_reason = reason
        return []


def _prompt_blocked(feedback: Any) -> ProviderError | None:
    if not isinstance(feedback, dict) or not feedback.get("blockReason"):
        return None
    reason = str(feedback["blockReason"])
    detail = feedback.get("blockReasonMessage")
    return ProviderError(
        kind="blocked",
        type=reason,
        message=str(detail or f"the provider blocked the prompt ({reason})"),
    )


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    usage = Usage(
        input_tokens=token_count(raw.get("promptTokenCount")),
        output_tokens=token_count(raw.get("candidatesTokenCount")),
        total_tokens=token_count(raw.get("totalTokenCount")),
        thoughts_tokens=nonzero(raw.get("thoughtsTokenCount")),
    )
    return usage if usage.as_dict() else None
