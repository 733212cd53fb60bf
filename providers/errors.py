"""Turning provider failures into `ProviderError`s the engine can act on.

The three providers shape their error bodies differently but mean the same few things, and
the engine only needs to know three of them: may I retry (and after how long), is the
quota gone (a retry will not help today), and is the prompt too long (a retry with the same
context will fail again). Everything here is pure so the rules can be tested without HTTP.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from yarl import URL

from fsm import ErrorKind, ProviderError

REDACTED = "[redacted]"
CONTEXT_TOO_LONG = "context_length_exceeded"
QUOTA_EXHAUSTED = "insufficient_quota"
TOOLS_UNSUPPORTED = "tools_unsupported"
PREFILL_UNSUPPORTED = "prefill_unsupported"

_RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})
_RETRYABLE_TYPES = frozenset(
    {
        "overloaded_error",
        "api_error",
        "rate_limit_error",
        "server_error",
        "rate_limit_exceeded",
        "timeout_error",
        "UNAVAILABLE",
        "INTERNAL",
        "DEADLINE_EXCEEDED",
        "RESOURCE_EXHAUSTED",
    }
)
_QUOTA_WORDING = re.compile(
    r"exceeded your current quota|quota exceeded|insufficient[_ ]quota|billing|credit balance",
    re.IGNORECASE,
)
_CONTEXT_WORDING = re.compile(
    r"prompt is too long|context[_ ]length|context window|maximum context"
    r"|exceeds the maximum number of tokens|too many (input )?tokens"
    r"|exceeds the available context size",
    re.IGNORECASE,
)
_CONTEXT_TYPES = frozenset({CONTEXT_TOO_LONG, "exceed_context_size_error"})
_TOOLS_WORDING = re.compile(
    r"does not support tools|tools? (calling |use )?(is |are )?not supported"
    r"|does not support (function|tool) calling",
    re.IGNORECASE,
)
_PREFILL_WORDING = re.compile(
    r"does not support assistant message prefill|must end with a user"
    r"|final (assistant|model) (turn|message)|last message.*(role|assistant)",
    re.IGNORECASE,
)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")
MESSAGE_LIMIT = 500
"""Characters of a provider's message kept in an error; the adapter cuts, after scrubbing."""


_SHORTEST_PIECE = 4
_KEY_PREFIXES = (
    "sk-", "sk_", "pk_", "rk_", "AIza", "xai-", "gsk_", "ghp_", "gho_", "ghs_", "github_pat_",
    "glpat-", "xoxb-", "xoxp-", "xapp-", "hf_", "eyJ", "Bearer ", "Basic ",
)
_RANDOM_RUN = re.compile(r"[A-Za-z0-9]{16,}")


def looks_like_key(value: str) -> bool:
    """A token shaped like a credential: a vendor's key prefix, or a long random-looking run
    of letters and digits. Used to refuse echoing such a value back (S15)."""
    value = value.strip()
    if value.startswith(_KEY_PREFIXES) and len(value) >= 12:
        return True
    return any(
        any(c.isdigit() for c in run) and any(c.isalpha() for c in run)
        for run in _RANDOM_RUN.findall(value)
    )


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Remove every secret from `text`: error bodies sometimes echo the request back.

    Whole secrets go first (longest first, so an overlapping shorter one cannot leave a
    tail), then any piece of one that starts it and is at least four characters long: a
    body cut before it reached us may end a secret early.
    """
    ordered = sorted({secret for secret in secrets if secret}, key=len, reverse=True)
    for secret in ordered:
        text = text.replace(secret, REDACTED)
    for secret in ordered:
        text = _scrub_pieces(text, secret)
    return text


def cut_message(text: str, limit: int, secrets: Iterable[str]) -> str:
    """`text` scrubbed, then cut to `limit` characters; a cut that ends in the start of a
    secret (of any length) loses that start too. Always scrub before cutting: a secret
    straddling the cut would otherwise leak its first characters."""
    ordered = [secret for secret in secrets if secret]
    text = scrub(text, ordered)
    if len(text) <= limit:
        return text
    text = text[:limit]
    for secret in ordered:
        for length in range(min(len(secret), len(text)), 0, -1):
            if text.endswith(secret[:length]):
                text = text[: len(text) - length] + REDACTED
                break
    return text + "…"


def _scrub_pieces(text: str, secret: str) -> str:
    if len(secret) <= _SHORTEST_PIECE:
        return text
    head = secret[:_SHORTEST_PIECE]
    out: list[str] = []
    start = 0
    found = text.find(head)
    while found != -1:
        length = _SHORTEST_PIECE
        while (
            length < len(secret)
            and found + length < len(text)
            and text[found + length] == secret[length]
        ):
            length += 1
        out.append(text[start:found])
        out.append(REDACTED)
        start = found + length
        found = text.find(head, start)
    out.append(text[start:])
    return "".join(out)


@dataclass(frozen=True, slots=True)
class ErrorDetails:
    """What an error body says, lifted out of whichever provider's shape it came in."""

    message: str
    type: str | None = None
    code: int | None = None
    code_text: str | None = None
    retry_after_s: float | None = None
    quota_ids: tuple[str, ...] = ()


def error_details(body: Any) -> ErrorDetails | None:
    """Read an OpenAI, Anthropic, Gemini or OpenRouter error body; None if it is not one.

    OpenAI: `{"error": {"message", "type", "code"}}` (`code` may be a string or, on
    OpenRouter, an HTTP-like integer). Anthropic: `{"type": "error", "error": {"type",
    "message"}}`. Gemini: `{"error": {"code", "message", "status", "details"}}`, sometimes
    wrapped in a one-element list.
    """
    if isinstance(body, list) and body:
        body = body[0]
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, str):
        return ErrorDetails(message=error)
    if not isinstance(error, dict):
        return None
    raw_code = error.get("code")
    code = raw_code if isinstance(raw_code, int) and not isinstance(raw_code, bool) else None
    code_text = raw_code if isinstance(raw_code, str) else None
    type_ = _first_str(error.get("type"), error.get("status"), raw_code)
    message = _first_str(error.get("message")) or "provider reported an error without a message"
    retry_after, quota_ids = _google_details(error.get("details"))
    return ErrorDetails(message, type_, code, code_text, retry_after, quota_ids)


def http_error(
    status: int, details: ErrorDetails | None, headers: Mapping[str, str], fallback: str
) -> ProviderError:
    """An error response (HTTP status >= 400), classified."""
    if details is None:
        details = ErrorDetails(message=fallback.strip() or f"HTTP {status}")
    return _classify("http", status, details, retry_after_header(headers))


def redirect_error(status: int, location: str | None, requested: URL) -> ProviderError:
    """A 3xx from a model API: never followed, and named by its target host only.

    The path and query of a `Location` may carry anything (a key echoed back, a token), so
    only the host is shown; a relative `Location` points at the requested host.
    """
    try:
        target = requested.join(URL(location)) if location else None
    except ValueError:
        target = None
    host = target.host if target is not None and target.host else "an unreadable location"
    return ProviderError(
        kind="http",
        type="redirect",
        message=f"HTTP {status} redirect to {host} not followed (provider calls never follow "
        "redirects)",
        status=status,
        retryable=False,
    )


def stream_error(details: ErrorDetails) -> ProviderError:
    """An error that arrived inside a stream that had started with HTTP 200."""
    return _classify("provider_stream_error", details.code, details, None)


def retry_after_header(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms` (OpenAI) or `retry-after` (seconds or a date)."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        seconds = _float(millis)
        if seconds is not None:
            return max(0.0, seconds / 1000)
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _float(value)
    if seconds is not None:
        return max(0.0, seconds)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _classify(
    kind: ErrorKind, status: int | None, details: ErrorDetails, header_delay: float | None
) -> ProviderError:
    message = details.message
    type_ = details.type if details.type is not None else _status_word(status)
    words = {type_, details.code_text}
    if _is_quota(status, words, message, details):
        type_, retryable = QUOTA_EXHAUSTED, False
    elif _is_context_too_long(status, words, message):
        type_, retryable = CONTEXT_TOO_LONG, False
    elif _is_refused_request(status) and _TOOLS_WORDING.search(message):
        type_, retryable = TOOLS_UNSUPPORTED, False
        message = f"the model does not support tools (turn them off in its config): {message}"
    elif _is_refused_request(status) and _PREFILL_WORDING.search(message):
        type_, retryable = PREFILL_UNSUPPORTED, False
        message = f"the model rejects a trailing assistant prefill: {message}"
    else:
        retryable = _is_retryable(status, type_)
    delay = header_delay if header_delay is not None else details.retry_after_s
    return ProviderError(
        kind=kind,
        message=message,
        type=type_,
        status=status,
        retryable=retryable,
        retry_after_s=delay,
    )


def _is_quota(
    status: int | None, words: set[str | None], message: str, details: ErrorDetails
) -> bool:
    """Exhausted quota (a retry today will not help) versus a rate limit (wait and retry).

    Structured details decide before wording: Gemini answers a per-minute limit with "You
    exceeded your current quota" too, but names a `PerMinute` quota and a retry delay."""
    if QUOTA_EXHAUSTED in words or status == 402:
        return True
    if any("PerDay" in quota_id for quota_id in details.quota_ids):
        return True
    if details.quota_ids or details.retry_after_s is not None:
        return False
    if status is not None and status >= 500:
        return False
    return bool(_QUOTA_WORDING.search(message))


def _is_refused_request(status: int | None) -> bool:
    return status in {None, 400, 422}


def _is_context_too_long(status: int | None, words: set[str | None], message: str) -> bool:
    if words & _CONTEXT_TYPES:
        return True
    return status in {None, 400, 413} and bool(_CONTEXT_WORDING.search(message))


def _is_retryable(status: int | None, type_: str | None) -> bool:
    if status is not None and (status in _RETRYABLE_STATUSES or status >= 500):
        return True
    return type_ in _RETRYABLE_TYPES


def _status_word(status: int | None) -> str | None:
    return None if status is None else str(status)


def _google_details(details: Any) -> tuple[float | None, tuple[str, ...]]:
    """Gemini's `google.rpc` details: a RetryInfo delay and the QuotaFailure quota ids."""
    delay: float | None = None
    quota_ids: list[str] = []
    if not isinstance(details, list):
        return None, ()
    for item in details:
        if not isinstance(item, dict):
            continue
        kind = str(item.get("@type", ""))
        if kind.endswith("RetryInfo"):
            match = _DURATION.match(str(item.get("retryDelay", "")))
            if match:
                delay = float(match.group(1))
        elif kind.endswith("QuotaFailure"):
            for violation in item.get("violations") or []:
                if isinstance(violation, dict) and isinstance(violation.get("quotaId"), str):
                    quota_ids.append(violation["quotaId"])
    return delay, tuple(quota_ids)


def _first_str(*values: Any) -> str | None:
    for value in values:
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def incomplete_stream(expected: str) -> ProviderError:
    """The connection closed cleanly, but before the provider's own end marker."""
    return ProviderError(
        kind="provider_stream_error",
        type="incomplete_stream",
        message=f"stream ended before {expected}",
        retryable=True,
    )
