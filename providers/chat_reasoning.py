"""Reasoning in a Chat Completions stream: where each server puts it, and what goes back.

Servers stream reasoning in one of four places: `reasoning_content` (DeepSeek, vLLM,
llama.cpp, Moonshot, xAI), `reasoning` (OpenRouter, Ollama, Groq, newer vLLM),
OpenRouter's structured `reasoning_details` (text with a signature, summaries, encrypted
blocks; each entry streamed in pieces under its `index`), or Mistral's typed content chunks
(`{"type": "thinking", "thinking": [{"type": "text", "text": ...}]}` inside a list-shaped
`delta.content`). `ChatReasoning` collects a pass's reasoning in the shape it came in, so a
host that wants it back with the pass's tool calls (`servers.ServerProfile.replay`) gets it
exactly as it sent it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsm import ReasoningDelta, ReasoningState, TextDelta

_TEXT_KEYS = ("text", "summary")
_OPAQUE_KEYS = ("signature", "data", "id", "format", "type")


@dataclass(slots=True)
class ChatReasoning:
    """One pass's reasoning, by the field it arrived in."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    details: dict[int, dict[str, Any]] = field(default_factory=dict)
    thinking: list[str] = field(default_factory=list)
    thinking_signature: str | None = None

    def delta(self, delta: dict[str, Any]) -> list[ReasoningDelta]:
        """The reasoning text of one delta's own fields (not its content)."""
        out: list[ReasoningDelta] = []
        for key in ("reasoning_content", "reasoning"):
            text = delta.get(key)
            if isinstance(text, str) and text:
                self.fields.setdefault(key, []).append(text)
                out.append(ReasoningDelta(text))
                break  # servers that send both send the same text twice
        details = delta.get("reasoning_details")
        if isinstance(details, list):
            shown = self._details(details)
            if shown and not out:
                out.append(ReasoningDelta(shown))
        return out

    def content_chunks(self, chunks: list[Any]) -> list[TextDelta | ReasoningDelta]:
        """Mistral's list-shaped content: text chunks are the reply, thinking chunks (their
        nested text) reasoning; other chunk types (references) carry neither."""
        out: list[TextDelta | ReasoningDelta] = []
        for chunk in chunks:
            if isinstance(chunk, str) and chunk:
                out.append(TextDelta(chunk))
            if not isinstance(chunk, dict):
                continue
            kind = chunk.get("type")
            if kind == "text" and isinstance(chunk.get("text"), str) and chunk["text"]:
                out.append(TextDelta(chunk["text"]))
            elif kind == "thinking":
                text = "".join(_texts(chunk.get("thinking")))
                if text:
                    self.thinking.append(text)
                    out.append(ReasoningDelta(text))
                if isinstance(chunk.get("signature"), str) and chunk["signature"]:
                    self.thinking_signature = chunk["signature"]
        return out

    def state(self, origin: str) -> ReasoningState | None:
        """What the pass leaves for its tool-call turn, or None when it reasoned nothing."""
        items: list[dict[str, Any]] = [
            {key: "".join(parts)} for key, parts in self.fields.items() if parts
        ]
        if self.details:
            items.append({"reasoning_details": [self.details[i] for i in sorted(self.details)]})
        if self.thinking or self.thinking_signature:
            chunk: dict[str, Any] = {"type": "thinking", "thinking": [
                {"type": "text", "text": "".join(self.thinking)}]}
            if self.thinking_signature:
                chunk["signature"] = self.thinking_signature
            items.append({"thinking_chunks": [chunk]})
        return ReasoningState(origin, tuple(items)) if items else None

    def _details(self, details: list[Any]) -> str:
        """Merge streamed `reasoning_details` pieces by index: text and summaries join, the
        opaque fields (signature, encrypted data) keep their last value. Returns the
        readable text these pieces added."""
        shown: list[str] = []
        for position, piece in enumerate(details):
            if not isinstance(piece, dict):
                continue
            index = piece.get("index")
            key = index if isinstance(index, int) and not isinstance(index, bool) else position
            entry = self.details.setdefault(key, {})
            for name, value in piece.items():
                if name in _TEXT_KEYS and isinstance(value, str):
                    entry[name] = entry.get(name, "") + value
                    shown.append(value)
                elif (name in _OPAQUE_KEYS and value not in (None, "")) or name not in entry:
                    entry[name] = value
        return "".join(shown)


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        return []
    return [item["text"] for item in value
            if isinstance(item, dict) and isinstance(item.get("text"), str)]


def replay_fields(items: list[dict[str, Any]], allowed: frozenset[str],
                  text: str) -> dict[str, Any]:
    """The assistant-message fields that carry `items` back on a host taking `allowed`
    (servers.ReplayField); Mistral's thinking chunks become the message's list content,
    followed by the turn's visible text."""
    out: dict[str, Any] = {}
    for item in items:
        for key, value in item.items():
            if key == "thinking_chunks" and "thinking_chunks" in allowed:
                text_chunks = [{"type": "text", "text": text}] if text else []
                out["content"] = [*value, *text_chunks]
            elif key in allowed:
                out[key] = value
    return out
