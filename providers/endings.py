"""What a provider's finish reason means: a complete answer, a truncated one, a block, or an
error (P6).

Each API documents its own words; every word is sorted here, and a word no table knows is an
error, never a success. Only `complete` ends a pass cleanly. The others become one
`ProviderError` after the stream's last event (so usage that follows the finish is still
counted, P7), which the engine turns into a fallback or the notice of its kind (G2): a block
is `failed_blocked`, a context window filled mid-reply `failed_context_too_long`, a cut or
broken reply `failed_other`. A truncated reply that was making a tool call is not an error:
the cut call is marked truncated and never runs (T4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fsm import ProviderError

from .errors import CONTEXT_TOO_LONG

Ending = Literal["complete", "truncated", "context", "blocked", "error"]
TRUNCATED = "truncated"


@dataclass(frozen=True, slots=True)
class FinishReasons:
    """One API's documented finish reasons, by what they mean; `source` names the document."""

    source: str
    complete: frozenset[str]
    truncated: frozenset[str] = frozenset()
    context: frozenset[str] = frozenset()
    """Truncated because the model's context window filled."""
    blocked: frozenset[str] = frozenset()
    error: frozenset[str] = frozenset()
    """Documented words that are not an answer (an unknown word is treated the same)."""

    def ending(self, reason: str) -> Ending:
        for ending, words in (("complete", self.complete), ("truncated", self.truncated),
                              ("context", self.context), ("blocked", self.blocked)):
            if reason in words:
                return ending  # type: ignore[return-value]
        return "error"

    def known(self, reason: str) -> bool:
        return any(reason in words for words in (self.complete, self.truncated, self.context,
                                                  self.blocked, self.error))


CHAT_COMPLETIONS = FinishReasons(
    source="OpenAI Chat Completions `finish_reason` (stop, length, tool_calls, content_filter, "
    "function_call); Mistral's CompletionResponseStreamChoiceFinishReason and "
    "ChatCompletionChoiceFinishReason (model_length, error); TGI's FinishReason (eos_token, "
    "stop_sequence); OpenRouter's normalized finish_reason (error); DeepSeek's "
    "insufficient_system_resource; vLLM's FINISH_REASON_STRINGS (vllm/v1/engine/__init__.py: "
    "stop, length, abort, error, repetition)",
    complete=frozenset({"stop", "tool_calls", "function_call", "eos_token", "stop_sequence"}),
    truncated=frozenset({"length"}),
    context=frozenset({"model_length"}),
    blocked=frozenset({"content_filter"}),
    error=frozenset({"error", "insufficient_system_resource", "abort", "repetition"}),
)
ANTHROPIC = FinishReasons(
    source="Anthropic Messages `stop_reason` (anthropic-sdk-python types/stop_reason.py)",
    complete=frozenset({"end_turn", "stop_sequence", "tool_use"}),
    truncated=frozenset({"max_tokens", "pause_turn"}),
    context=frozenset({"model_context_window_exceeded"}),
    blocked=frozenset({"refusal"}),
)
GEMINI = FinishReasons(
    source="Gemini `Candidate.FinishReason` (ai.google.dev/api/generate-content#FinishReason; "
    "google-genai types.FinishReason)",
    complete=frozenset({"STOP"}),
    truncated=frozenset({"MAX_TOKENS"}),
    blocked=frozenset({"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII",
                       "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION"}),
    error=frozenset({"FINISH_REASON_UNSPECIFIED", "LANGUAGE", "OTHER",
                     "MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS",
                     "MISSING_THOUGHT_SIGNATURE", "MALFORMED_RESPONSE", "IMAGE_OTHER",
                     "NO_IMAGE"}),
)


def ending_error(reasons: FinishReasons, reason: str, detail: str | None = None,
                 *, making_calls: bool = False) -> ProviderError | None:
    """The error a finish reason stands for, or None for an answer (or a cut tool call)."""
    ending = reasons.ending(reason)
    if ending == "complete" or (making_calls and ending in ("truncated", "context")):
        return None
    said = f" ({detail})" if detail else ""
    if ending == "blocked":
        return ProviderError(kind="blocked", type=reason,
                             message=f"the provider stopped the reply ({reason}){said}")
    if ending == "context":
        return ProviderError(kind="provider_stream_error", type=CONTEXT_TOO_LONG,
                             message=f"the model's context window filled mid-reply ({reason})"
                                     f"{said}")
    if ending == "truncated":
        return ProviderError(kind="provider_stream_error", type=TRUNCATED, retryable=True,
                             message=f"the reply was cut off before it ended ({reason}){said}")
    word = "an undocumented finish reason" if not reasons.known(reason) else "a finish reason"
    return ProviderError(kind="provider_stream_error", type=reason, retryable=True,
                         message=f"the model stopped with {word} that is not an answer "
                                 f"({reason}){said}")
