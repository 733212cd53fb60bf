"""Enhanced context restart (R1-R7): recognising a restart request in a tool result,
resolving its item from either transport, and the message-metadata reveal."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .flags import ENRICHMENT_KINDS, EnrichmentKind
from .stash import ContextStash

log = logging.getLogger(__name__)

RESTART_PREFIX = "context_restart_"
WITH_PREFIX = "with_"
"""TomoriBot's tools name their restarts `context_restart_with_<kind>` (R1)."""
METADATA_TOOL = "reveal_message_metadata"
METADATA_TAIL_DIRECTIVE = (
    "[System: Message metadata for the recent dialogue has been revealed above (ref handles, "
    f"authors, sent times, reply references, reactors). Do not call {METADATA_TOOL} again "
    "this turn.]"
)
ITEM_ROLES = ("user", "assistant")
"""The roles an injected item may have: a tool's item never becomes a system message, and a
role no provider knows never reaches one (where it would fail the turn)."""


def _image_part_from_uri(part: dict[str, Any]) -> dict[str, Any] | None:
    """An image part written with `uri` (TomoriBot's shape) as the engine's own: a data URI
    becomes inline `data` with its `mime`, an https URI a `url`; anything else is dropped."""
    uri = part.get("uri")
    if not isinstance(uri, str):
        return None
    rest = {k: v for k, v in part.items() if k != "uri"}
    if uri.startswith("data:") and ";base64," in uri:
        header, _, data = uri.partition(";base64,")
        mime = header.removeprefix("data:") or rest.get("mime") or rest.get("mime_type")
        if not mime or not data:
            return None
        return {**rest, "type": "image", "data": data, "mime": mime}
    if uri.lower().startswith("https://"):
        return {**rest, "type": "image", "url": uri}
    return None


class ContextItem(BaseModel):
    """The minimum an injected context item must have: an allowed role and either parts or
    content."""

    model_config = ConfigDict(extra="allow")

    role: str
    parts: list[dict[str, Any]] | None = None
    content: str | None = None

    @field_validator("role")
    @classmethod
    def _allowed_role(cls, role: str) -> str:
        if role not in ITEM_ROLES:
            raise ValueError(f"role {role[:40]!r} is not one of {', '.join(ITEM_ROLES)}")
        return role

    @field_validator("parts")
    @classmethod
    def _uri_parts(cls, parts: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if parts is None:
            return None
        out: list[dict[str, Any]] = []
        for part in parts:
            if "uri" in part and "url" not in part and "data" not in part:
                image = _image_part_from_uri(part)
                if image is None:
                    log.warning("an image part's uri is neither a data URI nor https; dropped")
                    continue
                part = image
            out.append(part)
        return out


def restart_kind(type_value: str) -> EnrichmentKind | None:
    """The enrichment a restart type names, in either family (`context_restart_<kind>`,
    `context_restart_with_<kind>`), or None when it names none the engine knows."""
    name = type_value.removeprefix(RESTART_PREFIX)
    name = name.removeprefix(WITH_PREFIX)
    for kind in ENRICHMENT_KINDS:
        if kind == name:
            return kind
    return None


@dataclass(frozen=True, slots=True)
class RestartRequest:
    """A parsed restart result. `kind` is the enrichment it performs: the restarting tool's
    declared guard, else the kind its type names (R1, R8); `type` is the type as written."""

    kind: EnrichmentKind
    type: str
    data: Mapping[str, Any]
    inline_item: dict[str, Any] | None
    pending_key: str | None

    @property
    def enrichment(self) -> EnrichmentKind:
        """The enrichment whose disable flag this restart sets (R8)."""
        return self.kind


def parse_restart(tool_name: str, data: Any,
                  guard: EnrichmentKind | None = None) -> RestartRequest | None:
    """The restart a successful result of tool `tool_name` (declaring `guard`) asks for, or
    None (R1).

    The declared guard decides the kind; a type word the engine does not know (TomoriBot's
    `context_restart_with_video`) is resolved through the guard before it is given up on.
    Garbage never restarts: a malformed payload, an empty type word, or an unknown word from
    a tool without a guard is logged and treated as an ordinary result, so the turn goes on.
    """
    if not isinstance(data, Mapping):
        return None
    kind_value = data.get("type")
    if kind_value is None:
        return None
    if not isinstance(kind_value, str):
        log.warning("%s: result data.type is %s, not a string; no restart",
                    tool_name, type(kind_value).__name__)
        return None
    if not kind_value.startswith(RESTART_PREFIX):
        return None
    named = restart_kind(kind_value)
    word = kind_value.removeprefix(RESTART_PREFIX).removeprefix(WITH_PREFIX)
    if named is None and (guard is None or not word):
        log.warning("%s: %r names no enrichment the engine knows; an ordinary result",
                    tool_name, kind_value[:80])
        return None
    if guard is not None and named is not None and guard != named:
        log.warning("%s: %r under the tool's guard %s; the guard decides", tool_name,
                    kind_value, guard)
    inline: dict[str, Any] | None = None
    if "enhanced_context_item" in data:
        raw_item = data["enhanced_context_item"]
        try:
            inline = ContextItem.model_validate(raw_item).model_dump(exclude_none=True)
        except ValidationError as exc:
            log.warning("%s: enhanced_context_item is not a valid context item (%s); "
                        "no restart", tool_name, _first_error(exc))
            return None
    key: str | None = None
    if "pending_context_key" in data:
        raw_key = data["pending_context_key"]
        if not isinstance(raw_key, str):
            log.warning("%s: pending_context_key is %s, not a string; no restart",
                        tool_name, type(raw_key).__name__)
            return None
        key = raw_key
    kind = guard or named
    assert kind is not None
    return RestartRequest(kind=kind, type=kind_value, data=data,
                          inline_item=inline, pending_key=key)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "item"
    return f"{where}: {err['msg'].removeprefix('Value error, ')}"


def resolve_item(request: RestartRequest, stash: ContextStash) -> dict[str, Any] | None:
    """The item a media restart injects (R2-R5).

    A stash key is always drained, so the bulky item is freed at once, and its item is the
    one used; the inline item only stands in when the key cannot be resolved. An
    unresolvable key without an inline item is a warning and the turn goes on without it.
    """
    if request.pending_key is not None:
        stashed = _drain(request, request.pending_key, stash)
        if stashed is not None:
            return stashed
        return request.inline_item
    if request.inline_item is not None:
        return request.inline_item
    if request.kind != "message_metadata":
        log.warning("%s carries no item", request.type)
    return None


def _drain(request: RestartRequest, key: str, stash: ContextStash) -> dict[str, Any] | None:
    taken = stash.take(key)
    if taken is None:
        log.warning("%s: stash key %s… is expired, unknown or drained; going on without it",
                    request.type, key[:6])
        return None
    try:
        return ContextItem.model_validate(taken).model_dump(exclude_none=True)
    except ValidationError as exc:
        log.warning("%s: the stashed item is not a valid context item (%s); going on "
                    "without it", request.type, _first_error(exc))
        return None
