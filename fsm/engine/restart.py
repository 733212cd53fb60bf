"""Enhanced context restart (R1-R7): recognising a restart request in a tool result,
resolving its item from either transport, and the message-metadata reveal."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from .flags import ENRICHMENT_KINDS, EnrichmentKind
from .stash import ContextStash

log = logging.getLogger(__name__)

RESTART_PREFIX = "context_restart_"
METADATA_TOOL = "reveal_message_metadata"
METADATA_TAIL_DIRECTIVE = (
    "[System: Message metadata for the recent dialogue has been revealed above (ref handles, "
    f"authors, sent times, reply references, reactors). Do not call {METADATA_TOOL} again "
    "this turn.]"
)


class ContextItem(BaseModel):
    """The minimum an injected context item must have: a role and either parts or content."""

    model_config = ConfigDict(extra="allow")

    role: str
    parts: list[dict[str, Any]] | None = None
    content: str | None = None


@dataclass(frozen=True, slots=True)
class RestartRequest:
    """A parsed `context_restart_*` result. `kind` is the suffix after the prefix."""

    kind: str
    data: Mapping[str, Any]
    inline_item: dict[str, Any] | None
    pending_key: str | None

    @property
    def enrichment(self) -> EnrichmentKind | None:
        for kind in ENRICHMENT_KINDS:
            if kind == self.kind:
                return kind
        return None


def parse_restart(tool_name: str, data: Any) -> RestartRequest | None:
    """The restart a successful result asks for, or None (R1).

    Garbage never restarts: a malformed payload is logged and treated as an ordinary
    result, so the turn goes on.
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
    kind = kind_value[len(RESTART_PREFIX):]
    inline: dict[str, Any] | None = None
    if "enhanced_context_item" in data:
        raw_item = data["enhanced_context_item"]
        try:
            inline = ContextItem.model_validate(raw_item).model_dump(exclude_none=True)
        except ValidationError:
            log.warning("%s: enhanced_context_item is not a valid context item; no restart",
                        tool_name)
            return None
    key: str | None = None
    if "pending_context_key" in data:
        raw_key = data["pending_context_key"]
        if not isinstance(raw_key, str):
            log.warning("%s: pending_context_key is %s, not a string; no restart",
                        tool_name, type(raw_key).__name__)
            return None
        key = raw_key
    return RestartRequest(kind=kind, data=data, inline_item=inline, pending_key=key)


def resolve_item(request: RestartRequest, stash: ContextStash) -> dict[str, Any] | None:
    """The item a media restart injects: inline (R2) or drained from the stash (R3, R4).

    An unresolvable key is a warning and the turn goes on without the item (R5).
    """
    if request.inline_item is not None:
        return request.inline_item
    if request.pending_key is None:
        if request.kind != "message_metadata":
            log.warning("context_restart_%s carries no item", request.kind)
        return None
    taken = stash.take(request.pending_key)
    if taken is None:
        log.warning("context_restart_%s: stash key %s… is expired, unknown or drained; "
                    "going on without it", request.kind, request.pending_key[:6])
        return None
    try:
        return ContextItem.model_validate(taken).model_dump(exclude_none=True)
    except ValidationError:
        log.warning("context_restart_%s: the stashed item is not a valid context item; "
                    "going on without it", request.kind)
        return None
