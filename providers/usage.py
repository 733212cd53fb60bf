"""Reading providers' token counts, which arrive as loosely typed JSON."""

from __future__ import annotations


def token_count(value: object) -> int | None:
    """A provider's count field, or None when it is absent or not a count."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def nonzero(value: object) -> int | None:
    count = token_count(value)
    return count if count else None
