"""One neutral shape for the request, so each adapter only has to write its own format.

`PassRequest.context_items` are plain dicts built elsewhere in the bot. They are read as:

- `role`: `"user"`, `"assistant"` or `"system"` (`"model"` is accepted for assistant and
  `"developer"` for system); extra keys are ignored unless named below.
- the text: `annotated_text` when present (the message-metadata reveal, R6); otherwise, for a
  user `type: "dialogue"` item, `"author": content` followed by its reaction counts (R6:
  ordinary turns show counts only), the author a one-line quoted string, content of several
  lines quoted line by line below it and directive look-alikes neutralized, as the reveal
  does (`fsm.engine.user_text`); otherwise `content` (a string or a list of parts) or
  `parts` (a list of parts). The bot's own dialogue gets no name prefix, so the model does
  not learn to write one.
- a part: a string; `{"type": "text", "text": ...}` or `{"text": ...}`; an image as
  `{"type": "image", "url": ...}` or `{"type": "image", "data": <bytes or base64>,
  "mime" | "mime_type": ...}` (the enrichment tools' shape); OpenAI's `{"type": "image_url",
  "image_url": {"url": ...}}` (a `data:` URL becomes inline data); Gemini's
  `{"inline_data" | "inlineData": {"mime_type" | "mimeType", "data"}}`.

Items left without text or images are dropped (Anthropic rejects empty turns). A part this
module cannot read is skipped with a warning: items come from tools too (R7), and one odd
part must not fail the turn. A non-dict item or an unknown role is a bug in the engine, so it
raises `ValueError` naming the item.

Tools are `{"name", "description", "parameters": <JSON schema>}`; the OpenAI wrapper
`{"type": "function", "function": {...}}` and Anthropic's `input_schema` are accepted too.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from fsm import HistoryEntry, PassRequest, dialogue_text

from .prefill import PREFILL_INSTRUCTION, PrefillMessage

logger = logging.getLogger(__name__)

Role = Literal["system", "user", "assistant"]

_ROLES: dict[str, Role] = {
    "user": "user",
    "assistant": "assistant",
    "model": "assistant",
    "system": "system",
    "developer": "system",
}
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image by URL or inline base64 `data` (then `mime_type` says what it is)."""

    url: str | None = None
    data: str | None = None
    mime_type: str | None = None


Part = TextPart | ImagePart


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    parts: tuple[Part, ...]

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.parts if isinstance(part, TextPart))


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class HistoryCall:
    """A function-history entry with the call id every format needs to pair call and result."""

    entry: HistoryEntry
    call_id: str

    @property
    def result_json(self) -> str:
        return json.dumps(self.entry.result, ensure_ascii=False, default=str)

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.entry.arguments, ensure_ascii=False, default=str)


def normalize_items(items: Iterable[dict[str, Any]]) -> list[Message]:
    messages: list[Message] = []
    for index, item in enumerate(items):
        where = f"context_items[{index}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a dict, got {type(item).__name__}")
        role = _ROLES.get(str(item.get("role", "")))
        if role is None:
            raise ValueError(f"{where}: unknown role {item.get('role')!r}")
        parts = tuple(
            p
            for p in _item_parts(item, role, where)
            if not (isinstance(p, TextPart) and not p.text)
        )
        if parts:
            messages.append(Message(role, parts))
    return messages


def normalize_tools(tools: Iterable[dict[str, Any]]) -> list[ToolSpec]:
    specs: list[ToolSpec] = []
    for index, tool in enumerate(tools):
        body = tool.get("function", tool) if tool.get("type") == "function" else tool
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{index}]: a tool needs a non-empty 'name'")
        schema = body.get("parameters", body.get("input_schema")) or _EMPTY_SCHEMA
        specs.append(ToolSpec(name, str(body.get("description", "")), dict(schema)))
    return specs


def history_calls(request: PassRequest) -> list[HistoryCall]:
    """Function history with ids: entries without one get a stable id from their position."""
    return [
        HistoryCall(entry, entry.call_id or f"call_history_{index}")
        for index, entry in enumerate(request.function_history)
    ]


def history_turns(request: PassRequest) -> list[list[HistoryCall]]:
    """Function history as the model turns that made the calls: consecutive entries of one
    batch (parallel calls) are one turn, sent back together as each API documents it (one
    assistant turn with every call, then every result); an entry without a batch is alone."""
    turns: list[list[HistoryCall]] = []
    for call in history_calls(request):
        batch = call.entry.batch
        if turns and batch is not None and turns[-1][-1].entry.batch == batch:
            turns[-1].append(call)
        else:
            turns.append([call])
    return turns


def turn_text(turn: list[HistoryCall]) -> str:
    """The visible text the model streamed before the calls of `turn` (T7)."""
    return "".join(call.entry.pre_tool_text for call in turn)


def notices_text(request: PassRequest) -> str:
    """Request-only notices, joined; they go right before the prefill (S1)."""
    return "\n\n".join(notice for notice in request.request_notices if notice.strip())


def directives_text(request: PassRequest, prefill: PrefillMessage | None) -> str:
    """The engine's own words for this request — its request-only notices and, in the
    `instruction` prefill mode, the request to continue the reply — for the system role,
    where no chat user writes (A4): a user's look-alike of them is only ever user text."""
    parts = [notices_text(request)]
    if prefill is not None and prefill.mode == PREFILL_INSTRUCTION:
        parts.append(prefill.text)
    return "\n\n".join(part for part in parts if part)


def _item_parts(item: dict[str, Any], role: Role, where: str) -> list[Part]:
    annotated = item.get("annotated_text")
    if isinstance(annotated, str):
        return [TextPart(annotated)]
    if item.get("type") == "dialogue" and role == "user":
        return [TextPart(dialogue_text(item.get("author"), str(item.get("content") or ""),
                                       item.get("reactions") or ()))]
    raw = item["parts"] if "parts" in item else item.get("content")
    if raw is None:
        return []
    if isinstance(raw, str):
        return [TextPart(raw)]
    if not isinstance(raw, list):
        raise ValueError(f"{where}: content must be a string or a list of parts")
    parts: list[Part] = []
    for index, part in enumerate(raw):
        try:
            parts.append(_part(part))
        except ValueError as exc:
            logger.warning("%s.parts[%d] skipped: %s", where, index, exc)
    return parts


def _part(raw: Any) -> Part:
    if isinstance(raw, str):
        return TextPart(raw)
    if not isinstance(raw, dict):
        raise ValueError(f"a part must be a string or a dict, not {type(raw).__name__}")
    kind = raw.get("type")
    if kind == "text" or (kind is None and isinstance(raw.get("text"), str)):
        return TextPart(str(raw.get("text", "")))
    if kind == "image":
        if raw.get("data"):
            mime = _mime(raw.get("mime", raw.get("mime_type")))
            return ImagePart(data=_base64(raw["data"]), mime_type=mime)
        if raw.get("url"):
            return ImagePart(url=str(raw["url"]), mime_type=raw.get("mime", raw.get("mime_type")))
        raise ValueError("an image part needs 'url' or 'data'")
    if kind == "image_url" and isinstance(raw.get("image_url"), dict):
        return _image_from_url(str(raw["image_url"].get("url", "")))
    inline = raw.get("inline_data", raw.get("inlineData"))
    if isinstance(inline, dict) and inline.get("data"):
        mime = _mime(inline.get("mime_type", inline.get("mimeType")))
        return ImagePart(data=_base64(inline["data"]), mime_type=mime)
    raise ValueError(f"unsupported part with keys {sorted(raw)!r}")


def _mime(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("inline image data needs a 'mime' type")
    return value


def _base64(data: Any) -> str:
    """Tools hand over raw bytes; every wire format wants base64 text."""
    if isinstance(data, bytes | bytearray | memoryview):
        return base64.b64encode(data).decode("ascii")
    return str(data)


def _image_from_url(url: str) -> ImagePart:
    if url.startswith("data:") and ";base64," in url:
        header, _, data = url.partition(";base64,")
        return ImagePart(data=data, mime_type=header.removeprefix("data:"))
    return ImagePart(url=url)
