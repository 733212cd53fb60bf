"""The operator's settings for the bot they keep (docs/tools.md, docs/discord.md): tools from
MCP servers and Python hooks, the models and personas a server may choose between, who may
choose, where choices and usage are stored, usage prices and quotas, live reload.

They are groups of `AppSettings` (`settings.py`) like the others: `TURN_MCP_SERVERS`,
`TURN_MODELS`, `TURN_PERSONAS`, `TURN_MANAGE__ROLES`, `TURN_STORE__PATH`, `TURN_USAGE__*`,
`TURN_RELOAD__*`, or the same as tables of `turn.toml`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from fsm import LoopPolicy

T = TypeVar("T")

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
CHOICE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
"""Names an operator gives models and personas: what /model and /persona autocomplete."""


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid")


class McpServerSettings(_Group):
    """One MCP server whose tools the model may call: a command started over stdio, or a
    streamable-HTTP URL (exactly one of the two)."""

    command: str | None = None
    """The program to start (`uvx`, `npx`, a path); it speaks MCP on stdin/stdout."""
    args: list[str] = Field(default_factory=list)
    env: dict[str, SecretStr] = Field(default_factory=dict)
    """Variables for the command, on top of a minimal safe environment (PATH, HOME, ...)."""
    cwd: str | None = None
    url: str | None = None
    """A streamable-HTTP endpoint, e.g. `http://127.0.0.1:8000/mcp`."""
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    """HTTP headers for `url` (an `Authorization` bearer, say); treated as secrets."""
    allowed_tools: list[str] | None = None
    """Only these of the server's tools, by the server's names; unset means all."""
    prefix: str = Field(default="", pattern=r"^[A-Za-z0-9_-]{0,20}$")
    """Put before each tool's name (`prefix` + `_` + name) so two servers' tools never clash."""
    loop: dict[str, LoopPolicy] = Field(default_factory=dict)
    """The loop policy (docs/spec.md T9) of a tool, by the server's name for it."""
    start_timeout_s: float = Field(default=30.0, gt=0)
    """How long the server may take to start and list its tools."""
    max_result_chars: int = Field(default=16_000, ge=100)
    """A result longer than this is cut (and says so), like the built-in tools' byte caps."""
    enabled: bool = True

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSettings:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) or url (streamable HTTP)")
        if self.url is not None and not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"url must be an http:// or https:// URL (got {self.url[:40]!r})")
        return self


class ManageSettings(_Group):
    """Who may change the bot's settings in a server (/model, /persona, /reset) and see its
    usage (/usage): members with Manage Server, members of these roles, and these users
    (the only ones who may in DMs)."""

    roles: list[int] = Field(default_factory=list)
    users: list[int] = Field(default_factory=list)


class StoreSettings(_Group):
    """Where per-server choices, usage and history-reset markers are kept: a SQLite file
    (with `TURN_REDIS_URL`, Redis instead, shared by every process)."""

    path: Path | None = None
    """Default: `settings.sqlite3` in the data directory (`TURN_DATA_DIR`)."""
    busy_timeout_s: float = Field(default=5.0, ge=0)
    """How long a write waits for another process that holds the file's lock."""


class ModelPrice(_Group):
    """What a model costs, per million tokens."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)


class UsageSettings(_Group):
    """Tokens per user, channel and server per day (from the providers' reported usage)."""

    enabled: bool = True
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """By model label (`openai:gpt-4o-mini`) or model name (`gpt-4o-mini`); /usage shows
    the cost of the models priced."""
    currency: str = Field(default="USD", max_length=8)
    daily_user_tokens: int | None = Field(default=None, ge=1)
    """A user's tokens (in + out) per UTC day; past it they get one polite notice a day."""


class ReloadSettings(_Group):
    """turn.toml and the persona files are re-read on SIGHUP; with `watch` also when they
    change (checked every `interval_s`)."""

    watch: bool = False
    interval_s: float = Field(default=2.0, ge=0.1)


class OperatorFields(BaseModel):
    """The fields `AppSettings` takes from this module (a mixin: one place for them)."""

    data_dir: Path = Path("data")
    """Where the bot keeps its files (the settings database, MCP servers' logs)."""
    personas: dict[str, Path] = Field(default_factory=dict)
    """Named personas, each a file: a `.toml` with `system_prompt` and optionally `name` and
    `avatar` (an image file), or any other file whose text is the system prompt."""
    mcp_servers: dict[str, McpServerSettings] = Field(default_factory=dict)
    tool_hooks: list[str] = Field(default_factory=list)
    """Python tools: `module`, `module:attribute` or the name of an entry point in the group
    `turn_engine.tools`, each giving a tool, a list of tools or a function returning them."""
    manage: ManageSettings = Field(default_factory=ManageSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    usage: UsageSettings = Field(default_factory=UsageSettings)
    reload: ReloadSettings = Field(default_factory=ReloadSettings)

    def operator_secrets(self) -> list[str]:
        """Values of MCP servers' headers and environments: they carry tokens and keys (a
        short value is no secret worth redacting, and would redact ordinary words)."""
        values = [secret.get_secret_value() for server in self.mcp_servers.values()
                  for secret in (*server.headers.values(), *server.env.values())]
        return [value for value in values if len(value) >= 8]

    @field_validator("mcp_servers")
    @classmethod
    def _server_names(cls, value: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
        for name in value:
            if not SERVER_NAME.match(name):
                raise ValueError(f"server name {name[:40]!r}: use letters, digits, _ and - "
                                 "(at most 32)")
        return value

    @field_validator("personas")
    @classmethod
    def _persona_names(cls, value: dict[str, Path]) -> dict[str, Path]:
        return choice_names(value)


def choice_names(value: dict[str, T]) -> dict[str, T]:
    """Names of models and personas, as /model and /persona offer them."""
    for name in value:
        if not CHOICE_NAME.match(name) or name == "default":
            raise ValueError(f"name {name[:40]!r}: use letters, digits and _ . : - (at most "
                             "64), and not 'default' (that is the configured one)")
    return value


ScopeKind = Literal["guild", "channel"]
