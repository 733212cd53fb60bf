"""What kind of failure ended a turn, in the words the user's notice uses (G2, G3).

The provider adapters already classify their errors (HTTP status, the provider's own error
type, `blocked`); this maps that classification, or the exception that ended the turn, to
one of a few kinds a Discord user can act on.
"""

from __future__ import annotations

from typing import Any, Literal

from .channel import DestinationUnavailable, NoticeKind

FailureKind = Literal[
    "context_too_long", "unreachable", "rejected_key", "rate_limited", "blocked",
    "empty_reply", "destination_unavailable", "timeout", "other",
]

NOTICE_BY_FAILURE: dict[FailureKind, NoticeKind] = {
    "context_too_long": "failed_context_too_long",
    "unreachable": "failed_unreachable",
    "rejected_key": "failed_rejected_key",
    "rate_limited": "failed_rate_limited",
    "blocked": "failed_blocked",
    "empty_reply": "failed_empty_reply",
    "other": "failed_other",
}
"""The notice each failure posts; a timeout has its own (S12) and a dead destination none:
there is nowhere to post it (G3)."""

_AUTH_TYPES = frozenset({
    "authentication_error", "permission_error", "invalid_api_key", "unauthenticated",
    "permission_denied",
})
_RATE_TYPES = frozenset({
    "rate_limit_error", "rate_limit_exceeded", "insufficient_quota", "resource_exhausted",
    "tokens", "requests",
})
_UNREACHABLE_TYPES = frozenset({
    "connection_error", "read_timeout", "overloaded_error", "unavailable",
    "incomplete_stream", "not_a_stream", "redirect", "server_error", "api_error",
})
_BLOCKED_TYPES = frozenset({"safety", "content_filter", "blocked", "prohibited_content",
                            "recitation"})


def provider_failure(error: dict[str, Any]) -> FailureKind:
    """The kind of a provider error as a pass result records it (`ProviderError.as_dict`)."""
    kind = str(error.get("kind") or "")
    type_ = str(error.get("type") or "").lower()
    status = error.get("status")
    code = status if isinstance(status, int) and not isinstance(status, bool) else None
    if kind == "blocked" or type_ in _BLOCKED_TYPES:
        return "blocked"
    if type_ == "context_length_exceeded" or code == 413:
        return "context_too_long"
    if code in (401, 403) or type_ in _AUTH_TYPES:
        return "rejected_key"
    if code in (402, 429) or type_ in _RATE_TYPES:
        return "rate_limited"
    if kind == "stall_timeout" or type_ in _UNREACHABLE_TYPES or (code is not None
                                                                  and code >= 500):
        return "unreachable"
    return "other"


def turn_failure(status: str, pass_error: dict[str, Any] | None,
                 exc: BaseException | None) -> FailureKind | None:
    """The failure that ended a turn with `status`, or None when it did not fail."""
    if isinstance(exc, DestinationUnavailable):
        return "destination_unavailable"
    if status == "timeout":
        return "timeout"
    if status == "empty_response":
        return "empty_reply"
    if status != "error":
        return None
    if pass_error is not None:
        return provider_failure(pass_error)
    return "other"
