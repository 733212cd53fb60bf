"""The journal document: a recorded turn as the scenario fields that reproduce it, its
transitions and its result (docs/scenarios.md). Plain dictionaries, so the recorder that writes
it needs nothing from the scenario loader that reads it back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["journal_document"]


def journal_document(scenario: dict[str, Any], transitions: list[dict[str, Any]],
                     result: dict[str, Any],
                     origin: Mapping[str, str | int] | None = None) -> dict[str, Any]:
    """A recorded journal: the scenario fields that reproduce it, the transitions, the result.
    When the channel's own account of what it delivered differs from the passes' text, that
    account is an input of the result and is recorded too (`channel.delivered_text`).
    `origin` says where the turn ran (channel, message, and with Redis the worker and its
    fencing token); replay does not read it."""
    doc = {k: v for k, v in scenario.items() if k not in ("journal", "result", "expect")}
    if origin is not None:
        doc["origin"] = dict(origin)
    delivered = result.get("delivered_text")
    passes = result.get("pass_results")
    channel = doc.get("channel")
    channel = dict(channel) if isinstance(channel, dict) else {}
    if isinstance(delivered, str) and isinstance(passes, list) and \
            channel.get("delivered_text") is None:
        handed = "".join(p.get("text", "") for p in passes if isinstance(p, dict))
        if delivered != handed:
            doc["channel"] = {**channel, "delivered_text": delivered}
    doc["journal"] = [dict(t) for t in transitions]
    doc["result"] = result
    return doc
