"""What the bot keeps between restarts: per-server and per-channel choices (/model, /persona),
history-reset markers (/reset) and token usage per user, channel and server per day.

Two stores implement the one contract: SQLite (a file under the data directory, the default)
and Redis (with `TURN_REDIS_URL`, shared by every bot process). A store that cannot be
opened, migrated or written raises `StoreError` with one line for the operator at start-up;
a write that fails later raises it too, so a command can say the choice was not saved
instead of pretending (docs/spec.md M7).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Literal, Protocol

from .operator_settings import ScopeKind

ChoiceKey = Literal["model", "persona"]
CHOICE_KEYS: tuple[ChoiceKey, ...] = ("model", "persona")


class StoreError(RuntimeError):
    """The store cannot do what was asked; the message is one line for the operator."""


@dataclass(frozen=True, slots=True)
class Choice:
    """A model or persona chosen for a whole server (`guild`) or one channel."""

    scope: ScopeKind
    scope_id: str
    key: ChoiceKey
    value: str
    guild_id: str | None = None
    """The server a channel choice belongs to (for /settings); None in a DM."""


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Tokens of one user in one channel with one model on one UTC day."""

    day: str
    user_id: str
    channel_id: str
    guild_id: str | None
    model: str
    input_tokens: int
    output_tokens: int
    replies: int = 1


def utc_day(now: datetime.datetime | None = None) -> str:
    """The UTC date usage is counted under (quotas reset at 00:00 UTC)."""
    moment = now if now is not None else datetime.datetime.now(datetime.UTC)
    return moment.astimezone(datetime.UTC).date().isoformat()


class SettingsStore(Protocol):
    """The contract both stores keep. Every method is a coroutine that never blocks the
    event loop."""

    description: str
    """Where the data lives, for the start-up log line (never a password)."""

    async def open(self) -> None:
        """Create or migrate the schema and prove the store can be written."""

    async def aclose(self) -> None: ...

    async def choices_for(self, guild_id: str | None, channel_id: str) -> list[Choice]:
        """The choices that apply in a channel: its server's and its own."""

    async def choices_in(self, guild_id: str) -> list[Choice]:
        """Every choice of a server and its channels (for /settings)."""

    async def set_choice(self, choice: Choice) -> None: ...

    async def clear_choice(self, scope: ScopeKind, scope_id: str, key: ChoiceKey) -> bool:
        """True when there was a choice to clear."""

    async def reset_marker(self, channel_id: str) -> int | None:
        """The id before which the channel's history is forgotten (/reset)."""

    async def set_reset_marker(self, channel_id: str, before_id: int) -> None: ...

    async def add_usage(self, row: UsageRow) -> None:
        """Add a reply's tokens to its day's counters."""

    async def usage(self, day: str, guild_id: str | None) -> list[UsageRow]:
        """A day's counters in a server (None: direct messages)."""

    async def user_tokens(self, day: str, user_id: str) -> int:
        """A user's tokens (in + out) on a day, everywhere (the quota's count)."""
