"""Configuration of one provider attempt, and the factory that turns it into an adapter.

The API key is a `SecretStr` read from the environment variable named by `api_key_env`, so it
never shows in a repr, a validation error or a log line. Invalid values fail at load time
with pydantic's error, which names the field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from yarl import URL

from .capabilities import (
    Dialect,
    MaxTokensField,
    default_dialect,
    default_max_tokens_field,
    default_prefill,
)
from .errors import REDACTED, looks_like_key, scrub
from .prefill import PREFILL_INSTRUCTION, PrefillMode
from .reasoning import ANTHROPIC_MIN_BUDGET, ReasoningSetting
from .servers import PROFILES, ServerFamily, ServerProfile, default_server

ProviderKind = Literal["openai", "anthropic", "gemini"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SECRET_NAME = re.compile(r"key|token|secret|passw|auth|sig|cookie|credential", re.IGNORECASE)

DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
    "gemini": "https://generativelanguage.googleapis.com/v1beta",
}

DEFAULT_MAX_OUTPUT_TOKENS = 4096
"""The output limit a provider is given unless configured (issue 12: a reply is bounded)."""


class ProviderConfig(BaseModel):
    """One model attempt: which wire format, where, which model, and how to authenticate.

    `base_url` includes the API version (`.../v1`); OpenAI-compatible servers (vLLM,
    llama.cpp, Ollama, OpenRouter) use kind `openai` with their own base URL. Azure-style
    deployments set `api_key_header="api-key"` and `query_params={"api-version": ...}`.
    `extra_body` is merged into the request body last; a key set to null removes it (e.g.
    `{"stream_options": null}` for a server that rejects usage reporting).
    `read_timeout_s` is aiohttp's per-read limit, a safety net for callers without their own
    idle timer; the engine leaves it unset and times streams itself (S4, S5).

    Capabilities (defaults in `capabilities.py`, by kind, host and model):
    `prefill` — how a trailing assistant prefill is sent (`native`, `prefix-flag`,
    `instruction`, `off`; see `prefill.py`); `max_tokens_field` — the name of the output
    limit (`max_tokens` or `max_completion_tokens`, kind `openai`); `tools` — `false` sends
    no tools, a list sends only the tools it names (local models that reject any tool);
    `dialect` — `mistral` for Mistral's message rules on kind `openai`; `server` — the
    family of OpenAI-compatible host (`servers.py`: what its request schema takes, where it
    puts usage and reasoning), by host unless set; `think_tags` — a leading
    `<think>…</think>` in the reply is reasoning, not text (default on for kind `openai`).
    Reasoning (`reasoning.py`): `{"effort": "low"}` or `{"budget_tokens": 4096}` becomes
    Anthropic's `thinking`, Gemini's `thinkingConfig` or the host's `reasoning_effort`.
    Key rotation (G4): `api_keys` / `api_key_envs` add keys after `api_key`; an auth or
    rate-limit failure before any output tries the next key, and a key that failed auth is
    benched for `key_bench_s` seconds. Keys are named by index (`key #1`), never shown.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    kind: ProviderKind
    model: str = Field(min_length=1)
    base_url: str | None = None
    api_key_env: str | None = None
    api_key: SecretStr | None = None
    api_key_header: str | None = None
    connect_timeout_s: float = Field(default=30.0, gt=0)
    read_timeout_s: float | None = Field(default=None, gt=0)
    max_output_tokens: int | None = Field(default=DEFAULT_MAX_OUTPUT_TOKENS, gt=0)
    """Sent with every call, so a model that never stops is bounded at the source too (D5);
    null sends none (the provider's own limit)."""
    extra_headers: dict[str, str] = Field(default_factory=dict, repr=False)
    query_params: dict[str, str] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict, repr=False)
    prefill: PrefillMode | None = None
    max_tokens_field: MaxTokensField | None = None
    tools: bool | list[str] = True
    dialect: Dialect | None = None
    server: ServerFamily | None = None
    think_tags: bool | None = None
    reasoning: ReasoningSetting | None = None
    api_keys: list[SecretStr] = Field(default_factory=list, repr=False)
    api_key_envs: list[str] = Field(default_factory=list)
    key_bench_s: float = Field(default=300.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _key_from_environment(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("api_key") or not data.get("api_key_env"):
            return data
        return {**data, "api_key": _from_environment("api_key_env", data["api_key_env"])}

    @model_validator(mode="before")
    @classmethod
    def _more_keys_from_environment(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("api_key_envs"):
            return data
        names = data["api_key_envs"]
        if not isinstance(names, list):
            return data  # the field's own validation names the problem
        keys = [_from_environment("api_key_envs", name) for name in names]
        return {**data, "api_keys": [*data.get("api_keys", []), *keys]}

    @model_validator(mode="after")
    def _thinking_budget_fits(self) -> ProviderConfig:
        if self.kind == "anthropic" and self.reasoning is not None and \
                self.reasoning.budget_tokens is not None and self.reasoning.on and \
                self.reasoning.budget_tokens < ANTHROPIC_MIN_BUDGET:
            raise ValueError(f"reasoning.budget_tokens: Anthropic's thinking budget is at "
                             f"least {ANTHROPIC_MIN_BUDGET} tokens")
        return self

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        return value.rstrip("/")

    @property
    def endpoint_base(self) -> str:
        return self.base_url or DEFAULT_BASE_URLS[self.kind]

    @property
    def prefill_mode(self) -> PrefillMode:
        """Extended thinking cannot continue a trailing assistant turn (Anthropic:
        "Thinking isn't compatible with pre-filled responses"), so thinking on means an
        instruction unless the config names a mode."""
        if self.prefill is not None:
            return self.prefill
        if self.kind == "anthropic" and self.thinking_on:
            return PREFILL_INSTRUCTION
        return default_prefill(self.kind, self.model, self.base_url)

    @property
    def thinking_on(self) -> bool:
        return self.reasoning is not None and self.reasoning.on

    @property
    def server_profile(self) -> ServerProfile:
        return PROFILES[self.server or default_server(self.base_url)]

    @property
    def reads_think_tags(self) -> bool:
        return self.think_tags if self.think_tags is not None else self.kind == "openai"

    @property
    def reasoning_origin(self) -> str:
        """Whose reasoning state a pass produces: signatures are bound to the model that
        made them, so state goes back only to the same kind and model."""
        return f"{self.kind}:{self.model}"

    @property
    def output_limit_field(self) -> MaxTokensField:
        return self.max_tokens_field or default_max_tokens_field(self.model)

    @property
    def message_dialect(self) -> Dialect:
        return self.dialect or default_dialect(self.model, self.base_url)

    def keys(self) -> tuple[str, ...]:
        """Every API key, in rotation order: `api_key` first, then `api_keys`."""
        first = [self.api_key] if self.api_key else []
        values = (key.get_secret_value() for key in [*first, *self.api_keys])
        return tuple(value for value in values if value)

    def tool_allowed(self, name: str) -> bool:
        return self.tools if isinstance(self.tools, bool) else name in self.tools

    def secrets(self) -> tuple[str, ...]:
        """The values that must never be shown: the API key, key-like query parameters and
        headers (by name or by shape, with a `Bearer` token counted on its own), and any
        credentials in the base URL."""
        found: list[str] = list(self.keys())
        for name, value in (*self.query_params.items(), *self.extra_headers.items()):
            if _SECRET_NAME.search(name) or looks_like_key(value):
                found.append(value)
                found.extend(part for part in value.split()[1:] if part)
        if self.base_url:
            url = URL(self.base_url)
            found.extend(part for part in (url.password, url.user) if part)
            found.extend(v for k, v in url.query.items() if _SECRET_NAME.search(k) or
                         looks_like_key(v))
        return tuple(dict.fromkeys(secret for secret in found if secret))

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        """What repr() and str() show: every field with the secrets scrubbed out."""
        secrets = self.secrets()
        for name, value in super().__repr_args__():
            if isinstance(value, str):
                value = REDACTED if name == "api_key_env" and looks_like_key(value) \
                    else scrub(value, secrets)
            elif isinstance(value, dict):
                value = {k: scrub(v, secrets) if isinstance(v, str) else v
                         for k, v in value.items()}
            yield name, value


def _from_environment(field: str, name: Any) -> str:
    """The value of the environment variable `name`, which must look like a variable name."""
    if not isinstance(name, str) or not _ENV_NAME.match(name) or looks_like_key(name):
        raise ValueError(
            f"{field} must name an environment variable (like OPENAI_API_KEY); the "
            "value given is not a variable name and may be a key itself, so it is not shown"
        )
    value = os.environ.get(name, "")
    if not value:
        raise ValueError(f"{field}: environment variable {name!r} is not set or empty")
    return value
