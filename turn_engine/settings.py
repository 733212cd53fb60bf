"""The operator's configuration: a TOML file, the environment and a `.env` file.

Every variable starts with `TURN_`; nested fields use `__` (for example
`TURN_ENGINE__IDLE_TIMEOUT_S=90`), and a provider may be given whole as JSON
(`TURN_PROVIDER='{"kind": "openai", "base_url": "http://127.0.0.1:11434/v1", "model": "llama3"}'`).
The same settings can sit in a TOML file (`turn.toml` in the working directory, or the file
`TURN_CONFIG_FILE` names) with one table per group; a variable overrides the file. A provider's
key is read from the variable its `api_key_env` names, in the environment or in `.env`, so no
key needs to sit in this configuration. Settings are read once, at start-up; the persona file
is the one thing re-read (when it changes), see `persona.py`.

A mistake stops start-up with one line per problem, every problem at once, naming where it
was written (the variable, or the file, section and key) and what was expected: a value of
the wrong type, a misspelt name ("did you mean"), JSON that does not parse, a URL that cannot
be connected to, an API key written into a provider object (refused: keys live in their own
variables, see `_operator_provider`), an unreadable file. Values are never echoed.
"""

from __future__ import annotations

import contextvars
import copy
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, TypeVar

from dotenv import dotenv_values
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from fsm import TurnConfig
from fsm.telemetry.config import TelemetryConfig
from providers import ProviderConfig

from .event_loop import EventLoopChoice
from .gc_tuning import GcSettings
from .operator_settings import OperatorFields, choice_names
from .setting_names import PREFIX, unknown_keys, unknown_names
from .setting_problems import (
    Sources,
    json_problems,
    unknown_key_lines,
    validation_lines,
)
from .url_settings import http_url_problem, redis_url_problem

_T = TypeVar("_T")
DEFAULT_CONFIG_FILE = "turn.toml"
DEFAULT_ENV_FILE = ".env"
DEFAULT_SYSTEM_PROMPT = "You are a friendly, concise assistant in a Discord server."

_FILE_DATA: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "turn_settings_file_data", default=MappingProxyType({}))
_DOTENV: contextvars.ContextVar[Mapping[str, str | None]] = contextvars.ContextVar(
    "turn_settings_dotenv", default=MappingProxyType({}))
_SKIPPED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "turn_settings_skipped", default=frozenset())
"""Variables already reported (misspelt, or JSON that does not parse), left out of the read so
that the rest of the configuration is still checked."""


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AccessSettings(_Group):
    """Who the bot answers, where. Ids are Discord snowflakes; a deny list wins over an allow
    list, and an empty allow list allows everyone."""

    allowed_users: list[int] = Field(default_factory=list)
    blocked_users: list[int] = Field(default_factory=list)
    allowed_roles: list[int] = Field(default_factory=list)
    blocked_roles: list[int] = Field(default_factory=list)
    allowed_channels: list[int] = Field(default_factory=list)
    """A thread is allowed when its parent channel or category is listed."""
    blocked_channels: list[int] = Field(default_factory=list)
    allow_dms: bool = True
    kill_roles: list[int] = Field(default_factory=list)
    """Roles whose members may /kill any reply; the requester of the running reply and
    members with Manage Messages always may."""


class HistorySettings(_Group):
    """What the model sees of the channel: the last messages, or the reply chain of the
    message it answers, within a character budget (about 4 characters a token)."""

    mode: Literal["recent", "reply_chain"] = "recent"
    max_messages: int = Field(default=20, ge=1, le=100)
    max_chars: int = Field(default=24_000, ge=100)
    """All messages together; the oldest go first, the message answered always stays."""
    max_message_chars: int = Field(default=4000, ge=50)


class AttachmentSettings(_Group):
    """Uploads in the messages the model sees."""

    vision: bool = False
    """Images reach the model as image parts (set it for vision models); off, the model sees
    a placeholder naming the file."""
    max_images: int = Field(default=4, ge=0, le=16)
    max_image_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    inline_text: bool = True
    """Text files (`text/*`, JSON) are inlined, within `max_text_chars` each."""
    max_text_chars: int = Field(default=8000, ge=0)


class ToolSettings(_Group):
    """The enrichment tools the model may call (profile pictures, GIFs, YouTube links,
    message metadata). A local model without tool support needs `enabled = false`; a
    provider can also turn tools off for itself alone (see docs/discord.md)."""

    enabled: bool = True
    allowed: list[str] | None = None
    """Only these tools, by name; unset means all of them."""


class JournalSettings(_Group):
    """Every turn's journal (its inputs, the model's stream, its transitions). Journals hold
    what users wrote: keep them only as long as you need them."""

    enabled: bool = True
    dir: str = "journals"
    max_files: int | None = Field(default=1000, ge=1)
    max_age_days: float | None = Field(default=None, gt=0)
    max_bytes: int | None = Field(default=None, ge=1)


class LogSettings(_Group):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    library_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    """For discord.py, aiohttp and transitions, which are chatty at INFO."""


def _operator_provider(value: Any) -> Any:
    """A provider object as an operator writes it, its keys then read from the environment
    or `.env`. An API key written into the object itself (`api_key`, `api_keys`) is refused
    rather than discouraged: the object is configuration, and configuration is committed
    (`turn.toml`), mounted into containers, shown by `docker inspect` and pasted into bug
    reports; a key in a variable of its own (`.env`, a secret store's environment), named by
    `api_key_env`, is none of those and costs one line."""
    if not isinstance(value, dict):
        return value
    for key, fix in (("api_key", "api_key_env"), ("api_keys", "api_key_envs")):
        if key in value:
            raise PydanticCustomError(
                "inline_api_key",
                "an API key written into the provider is refused; put the key in .env as a "
                "variable of its own and name that variable in {fix}", {"at": (key,), "fix": fix})
    return _with_dotenv_key(value)


def _provider_urls(config: ProviderConfig) -> ProviderConfig:
    if config.base_url is not None and (problem := http_url_problem(config.base_url)):
        raise PydanticCustomError("url_setting", problem, {"at": ("base_url",)})
    return config


def _telemetry_urls(config: TelemetryConfig) -> TelemetryConfig:
    if config.otlp_endpoint is not None and (problem := http_url_problem(config.otlp_endpoint)):
        raise PydanticCustomError("url_setting", problem, {"at": ("otlp_endpoint",)})
    return config


OperatorProvider = Annotated[ProviderConfig, BeforeValidator(_operator_provider),
                             AfterValidator(_provider_urls)]
"""A provider in the operator's settings: no inline keys, a base URL that can be reached."""


class AppSettings(OperatorFields, BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_file=DEFAULT_ENV_FILE, env_file_encoding="utf-8",
        env_nested_delimiter="__", extra="ignore", hide_input_in_errors=True,
    )

    discord_token: SecretStr | None = None
    provider: OperatorProvider | None = None
    fallbacks: list[OperatorProvider] = Field(default_factory=list)
    models: dict[str, OperatorProvider] = Field(default_factory=dict)
    """Models /model may choose, by name; the chosen one is tried first, then the
    fallbacks. `default` is the configured provider."""
    engine: TurnConfig = Field(default_factory=TurnConfig)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    system_prompt_file: Path | None = None
    """A persona file; `{date}` and `{time}` in it are filled in at each turn."""
    trigger_words: list[str] = Field(default_factory=list)
    queue_limit: int = Field(default=10, ge=1)
    link_previews: bool = False
    """Let Discord unfurl links in replies into previews the linked page writes (A6)."""
    access: AccessSettings = Field(default_factory=AccessSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)
    attachments: AttachmentSettings = Field(default_factory=AttachmentSettings)
    tools: ToolSettings = Field(default_factory=ToolSettings)
    journals: JournalSettings = Field(default_factory=JournalSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    gc: GcSettings = Field(default_factory=GcSettings)
    telemetry: Annotated[TelemetryConfig, AfterValidator(_telemetry_urls)] = Field(
        default_factory=TelemetryConfig)
    """Traces and metrics of turns (`TURN_TELEMETRY__TRACES`, `__METRICS`, ...), each off
    unless switched on; the packages are an optional extra (fsm/telemetry)."""
    shutdown_grace_s: float = Field(default=10.0, gt=0)
    """How long running replies get to end after SIGTERM or Ctrl-C."""
    event_loop: EventLoopChoice = "uvloop"
    """`TURN_EVENT_LOOP`: the bot's event loop, uvloop where it is installed (asyncio's own
    otherwise) or `asyncio` (turn_engine/event_loop.py)."""
    redis_url: SecretStr | None = None
    """`TURN_REDIS_URL`: run as one of many processes sharing channel locks, queues and /kill
    through this Redis (docs/redis.md); unset, everything stays in this process. A secret:
    the URL may carry a password."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment, then `.env`, then the TOML file."""
        skipped = {name.lower() for name in _SKIPPED.get()}
        for source in (env_settings, dotenv_settings):
            if skipped and isinstance(source, EnvSettingsSource):
                source.env_vars = {name: value for name, value in source.env_vars.items()
                                   if name.lower() not in skipped}
        file_settings = InitSettingsSource(settings_cls, init_kwargs=dict(_FILE_DATA.get()))
        return init_settings, env_settings, dotenv_settings, file_settings

    @field_validator("models")
    @classmethod
    def _model_names(cls, value: dict[str, ProviderConfig]) -> dict[str, ProviderConfig]:
        return choice_names(value)

    @field_validator("redis_url")
    @classmethod
    def _usable_redis_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and (problem := redis_url_problem(value.get_secret_value())):
            raise PydanticCustomError("url_setting", problem)
        return value

    @field_validator("system_prompt_file")
    @classmethod
    def _readable_persona(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        try:
            value.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the persona file {value} "
                             f"({type(exc).__name__})") from None
        return value

    def attempts(self) -> list[ProviderConfig]:
        """Primary first, then the fallbacks in order (G1)."""
        return ([self.provider] if self.provider is not None else []) + list(self.fallbacks)

    def secrets(self) -> tuple[str, ...]:
        """Every value that must never reach a log line: the token and the API keys."""
        found = [self.discord_token.get_secret_value()] if self.discord_token else []
        for config in [*self.attempts(), *self.models.values()]:
            found.extend(config.secrets())
        found.extend(self.operator_secrets())
        return tuple(secret for secret in found if secret)


def _with_dotenv_key(provider: dict[str, Any]) -> dict[str, Any]:
    """`api_key_env` and `api_key_envs` resolved from `.env` where the environment lacks
    them: pydantic-settings reads `.env` only for `TURN_*` names, and the provider's own
    validation looks in the process environment (it still reports a name found nowhere)."""
    dotenv = _DOTENV.get()
    out = dict(provider)
    name = out.get("api_key_env")
    if isinstance(name, str) and not os.environ.get(name) and dotenv.get(name):
        out["api_key"] = dotenv[name]
    names = out.get("api_key_envs")
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        values = [os.environ.get(n) or dotenv.get(n) for n in names]
        if all(values) and any(not os.environ.get(n) for n in names):
            out["api_keys"] = values
            del out["api_key_envs"]
    return out


class ConfigurationError(ValueError):
    """A refused configuration: one line per problem, naming the setting, never its value."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def load_settings(config_file: str | Path | None = None,
                  env_file: str | Path = DEFAULT_ENV_FILE) -> AppSettings:
    """The settings, or a `ConfigurationError` listing every problem found, all at once:
    misspelt names and JSON that does not parse are reported, then left out, and the rest is
    still read and checked."""
    problems: list[str] = []
    dotenv = _collect(problems, _read_dotenv, Path(env_file)) or {}
    path = _collect(problems, _config_path, config_file, dotenv)
    data = (_collect(problems, _read_config_file, path) or {}) if path is not None else {}
    sources = Sources(environ=os.environ, dotenv=dotenv, file=path, data=data)
    misspelt = unknown_names(AppSettings, [*os.environ, *dotenv])
    problems += misspelt
    unknown = unknown_keys(AppSettings, data)
    if path is not None:
        problems += unknown_key_lines(unknown, path)
    not_json, skipped = json_problems(AppSettings, sources)
    problems += not_json
    skipped |= {line.split(":", 1)[0].upper() for line in misspelt}
    tokens = (_FILE_DATA.set(_without(data, [p for p, _ in unknown])), _DOTENV.set(dotenv),
              _SKIPPED.set(frozenset(skipped)))
    settings: AppSettings | None = None
    try:
        settings = AppSettings(_env_file=env_file)
    except ValidationError as exc:
        problems += validation_lines(AppSettings, exc.errors(), sources)
    except SettingsError as exc:
        problems.append(f"settings: {' '.join(str(exc).split())} (see .env.example)")
    finally:
        _FILE_DATA.reset(tokens[0])
        _DOTENV.reset(tokens[1])
        _SKIPPED.reset(tokens[2])
    if problems or settings is None:
        raise ConfigurationError(list(dict.fromkeys(problems)))
    if settings.discord_token is not None and settings.provider is None:
        raise ConfigurationError([
            "TURN_PROVIDER: not set, and the bot needs a model to answer with "
            "(TURN_DISCORD_TOKEN is set); see .env.example"])
    return settings


def _collect(problems: list[str], read: Callable[..., _T], *args: Any) -> _T | None:
    """`read(*args)`, its problems added to `problems` instead of raised."""
    try:
        return read(*args)
    except ConfigurationError as exc:
        problems.extend(exc.problems)
        return None


def _without(data: Mapping[str, Any], paths: list[tuple[str | int, ...]]) -> dict[str, Any]:
    """`data` less the keys at `paths` (reported already as not settings)."""
    out: dict[str, Any] = copy.deepcopy(dict(data))
    for path in paths:
        parent: Any = out
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent, dict):
            del parent[path[-1]]
    return out


def _read_dotenv(path: Path) -> dict[str, str | None]:
    if not path.is_file():
        return {}
    try:
        return dict(dotenv_values(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError([f"{path}: cannot be read ({type(exc).__name__})"]) from None


def _config_path(explicit: str | Path | None,
                 dotenv: Mapping[str, str | None]) -> Path | None:
    named = explicit or os.environ.get("TURN_CONFIG_FILE") or dotenv.get("TURN_CONFIG_FILE")
    path = Path(named) if named else Path(DEFAULT_CONFIG_FILE)
    if path.is_dir():
        raise ConfigurationError([
            f"{path}: a directory, not a settings file (Docker makes one when it mounts a "
            "file that does not exist: create turn.toml first, or drop the mount)"])
    if named and not path.is_file():
        raise ConfigurationError([f"TURN_CONFIG_FILE: no file at {path}"])
    return path if path.is_file() else None


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError([f"{path}: not valid TOML ({exc})"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError([f"{path}: cannot be read ({type(exc).__name__})"]) from None
