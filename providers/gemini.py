"""Gemini `streamGenerateContent?alt=sse`.

Each event is a whole `GenerateContentResponse`. There is no `[DONE]`: the stream ends when
the server closes it, after a chunk that carries `finishReason`. On the Developer API function
calls come whole and usually without ids, so ids are minted; Vertex may stream a call's
arguments over several parts (`gemini_calls`). When the model did send ids (parallel calls of
one function), each result goes back with its call's id. Candidates are told apart by their
`index`, not their place in the list; only candidate 0 is read. `usageMetadata` repeats on
every chunk with running totals; the last one wins.

Endings that are not answers: a blocked prompt (`promptFeedback.blockReason`, no candidates)
is `ProviderError(kind="blocked")` at once; every `finishReason` of Gemini's enum is sorted
by `endings.GEMINI` (P6) and reported when the stream ends, after its usage (P7): the
safety family is a block, `MAX_TOKENS` a cut reply, `OTHER`, `LANGUAGE`,
`MISSING_THOUGHT_SIGNATURE` and the rest (and any unknown word) errors.

Thinking (P2, P5): the `reasoning` setting becomes `thinkingConfig`. Thinking models attach
a `thoughtSignature` to a step's first function-call part and want it back on that part;
it rides on the call (`ReasoningState`) into its history entry, so every later pass,
fallback and restart of the turn sends it, and only to the model that made it. Gemini 3
refuses a current-turn call without a signature (HTTP 400): a call another model made gets
the validator-skipping signature Google documents for that case.
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from fsm import (
    Finish,
    PassRequest,
    ProviderError,
    ProviderEvent,
    ReasoningDelta,
    ReasoningState,
    TextDelta,
    ToolCallRequest,
    Usage,
)

from .capabilities import model_version
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
from .endings import GEMINI, ending_error
from .errors import error_details, incomplete_stream, stream_error
from .gemini_calls import StreamedCall, is_partial
from .http import SSEProvider
from .prefill import PREFILL_INSTRUCTION, prefill_message
from .reasoning import gemini_thinking, own_state
from .sse import SSEEvent, json_payload
from .toolcalls import mint_call_id
from .usage import nonzero, token_count

if TYPE_CHECKING:
    from .config import ProviderConfig

SKIP_SIGNATURE = "skip_thought_signature_validator"
"""The signature Google documents for a function call no Gemini 3 model signed (one taken
from another model): ai.google.dev/gemini-api/docs/thought-signatures, "FAQs"."""
_ID_MEMORY = 512


class ProviderIds:
    """The call ids the model itself sent (as opposed to minted ones), bounded: a function
    response carries an id only when its call had one."""

    def __init__(self, capacity: int = _ID_MEMORY) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, None] = OrderedDict()

    def remember(self, call_id: str) -> None:
        self._items[call_id] = None
        self._items.move_to_end(call_id)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def __contains__(self, call_id: str) -> bool:
        return call_id in self._items


class GeminiProvider(SSEProvider):
    """Gemini Developer API."""

    def __init__(
        self,
        config: ProviderConfig,
        session: aiohttp.ClientSession,
        *,
        on_bytes: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config, session, on_bytes=on_bytes)
        self._provider_ids = ProviderIds()

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
        system_parts.append(directives_text(
            request, prefill_message(self.prefill_mode, request.prefill)))
        system_parts = [part for part in system_parts if part]
        body: dict[str, Any] = {"contents": self.contents(request, messages)}
        if system_parts:
            body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system_parts)}]}
        tools = self.allowed_tools(normalize_tools(request.tools))
        if tools:
            declarations = [
                {"name": t.name, "description": t.description, "parametersJsonSchema": t.parameters}
                for t in tools
            ]
            body["tools"] = [{"functionDeclarations": declarations}]
        generation: dict[str, Any] = {}
        thinking = gemini_thinking(self.config.reasoning, self.config.model)
        if self.config.max_output_tokens is not None:
            budget = thinking.get("thinkingBudget", 0) if thinking else 0
            generation["maxOutputTokens"] = self.config.max_output_tokens + max(budget, 0)
        if thinking is not None:
            generation["thinkingConfig"] = thinking
        if generation:
            body["generationConfig"] = generation
        return body

    def contents(self, request: PassRequest, messages: list[Message]) -> list[dict[str, Any]]:
        """Context, function history, then the prefill last (S1, T7); notices and the
        continuation instruction travel in systemInstruction (A4)."""
        out: list[dict[str, Any]] = [
            {"role": _role(m), "parts": [_part(p) for p in m.parts]}
            for m in messages
            if m.role != "system"
        ]
        origin = self.config.reasoning_origin
        strict = model_version(self.config.model) >= (3, 0)
        for turn in history_turns(request):
            # Parallel calls go back as Gemini sent them: one model turn with every call (only
            # the first carries the thought signature), then one user turn with every answer.
            parts: list[dict[str, Any]] = []
            text = turn_text(turn)
            if text:
                parts.append({"text": text})
            answers: list[dict[str, Any]] = []
            for position, call in enumerate(turn):
                call_body: dict[str, Any] = {"name": call.entry.tool_name,
                                             "args": call.entry.arguments}
                response: dict[str, Any] = {"name": call.entry.tool_name,
                                            "response": call.entry.result}
                if call.call_id in self._provider_ids:
                    call_body["id"] = response["id"] = call.call_id
                function_call: dict[str, Any] = {"functionCall": call_body}
                signature = next((item["thoughtSignature"] for item in
                                  own_state([call.entry.reasoning], origin)
                                  if isinstance(item.get("thoughtSignature"), str)), None)
                if signature is None and strict and position == 0:
                    signature = SKIP_SIGNATURE
                if signature is not None:
                    function_call["thoughtSignature"] = signature
                parts.append(function_call)
                answers.append({"functionResponse": response})
            out.append({"role": "model", "parts": parts})
            out.append({"role": "user", "parts": answers})
        prefill = prefill_message(self.prefill_mode, request.prefill)
        if prefill is not None and prefill.mode != PREFILL_INSTRUCTION:
            out.append({"role": "model", "parts": [{"text": prefill.text}]})
        return out

    def new_decoder(self) -> GenerateContentDecoder:
        return GenerateContentDecoder(self._provider_ids, self.config.reasoning_origin)


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

    def __init__(self, provider_ids: ProviderIds, origin: str = "") -> None:
        self._provider_ids = provider_ids
        self._origin = origin
        self._finish_reason: str | None = None
        self._ending: ProviderError | None = None
        self._made_calls = False
        self._streamed: StreamedCall | None = None
        self._streamed_signature: Any = None

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
        candidate = _first_candidate(payload.get("candidates"))
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
        out: list[ProviderEvent] = []
        if self._streamed is not None:
            out.append(self._close_streamed(cut=True))
        out.append(Finish(self._finish_reason))
        if self._ending is not None:
            out.append(self._ending)
        return out

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
                signature = part.get("thoughtSignature")
                if is_partial(call) or self._streamed is not None:
                    out.extend(self._partial(call, signature))
                else:
                    out.append(self._call(call, signature))
        return out

    def _partial(self, call: dict[str, Any], signature: Any) -> list[ProviderEvent]:
        """One part of a streamed call: a new name opens a call, `willContinue: false` or
        an empty `functionCall {}` closes it."""
        out: list[ProviderEvent] = []
        name = call.get("name")
        if isinstance(name, str) and name and self._streamed is not None:
            out.append(self._close_streamed(cut=True))
        if self._streamed is None:
            if not (isinstance(name, str) and name):
                return out  # a closing part with nothing open
            self._streamed = StreamedCall(name, _call_id(call))
        if signature:
            self._streamed_signature = signature
        self._streamed.add(call.get("partialArgs"))
        if isinstance(call.get("args"), dict):
            self._streamed.args.update(call["args"])
        if call.get("willContinue") is not True:
            out.append(self._close_streamed(cut=False))
        return out

    def _close_streamed(self, *, cut: bool) -> ToolCallRequest:
        streamed, self._streamed = self._streamed, None
        assert streamed is not None
        signature, self._streamed_signature = self._streamed_signature, None
        call = self._call(
            {"name": streamed.name, "id": streamed.call_id, "args": streamed.args}, signature
        )
        if cut or streamed.broken:
            return dataclasses.replace(call, truncated=True)
        return call

    def _call(self, call: dict[str, Any], signature: Any) -> ToolCallRequest:
        call_id = _call_id(call)
        if call_id is not None:
            self._provider_ids.remember(call_id)
        call_id = call_id or mint_call_id()
        self._made_calls = True
        state = ReasoningState(self._origin, ({"thoughtSignature": signature},)) \
            if isinstance(signature, str) and signature else None
        args = call.get("args")
        arguments = args if isinstance(args, dict) else {}
        return ToolCallRequest(
            name=str(call.get("name", "")),
            arguments=arguments,
            id=call_id,
            raw_arguments=json.dumps(arguments, ensure_ascii=False),
            reasoning=state,
        )

    def _finish(self, candidate: dict[str, Any]) -> list[ProviderEvent]:
        """Record the finish; a reason that is not an answer is reported at the end (P6)."""
        if self._finish_reason is not None:
            return []
        reason = str(candidate["finishReason"])
        message = candidate.get("finishMessage")
        self._finish_reason = reason
        making_calls = self._streamed is not None or self._made_calls
        self._ending = ending_error(GEMINI, reason, str(message) if message else None,
                                    making_calls=making_calls)
        if self._streamed is not None:
            return [self._close_streamed(cut=True)]
        return []


def _call_id(call: dict[str, Any]) -> str | None:
    value = call.get("id")
    return value if isinstance(value, str) and value else None


def _first_candidate(candidates: Any) -> dict[str, Any] | None:
    """Candidate 0 by its `index` (absent means 0): with several candidates a chunk may
    carry only another one, at list position 0."""
    if not isinstance(candidates, list):
        return None
    for candidate in candidates:
        if isinstance(candidate, dict) and candidate.get("index", 0) == 0:
            return candidate
    return None


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
