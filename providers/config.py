"""Configuration of one provider attempt, and the factory that turns it into an adapter.

The API key is a `SecretStr` read from the environment variable named by `api_key_env`, so it
never shows in a repr, a validation error or a log line. Invalid values fail at load time
with pydantic's error, which names the field.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from yarl import URL

from .anthropic import AnthropicProvider
from .errors import REDACTED, looks_like_key, scrub
from .gemini import GeminiProvider
from .http import SSEProvider
from .openai import OpenAIProvider

ProviderKind = Literal["openai", "anthropic", "gemini"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SECRET_NAME = re.compile(r"key|token|secret|passw|auth|sig|cookie|credential", re.IGNORECASE)

DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
    "gemini": "https://generativelanguage.googleapis.com/v1beta",
}


class ProviderConfig(BaseModel):
    """One model attempt: which wire format, where, which model, and how to authenticate.

    `base_url` includes the API version (`.../v1`); OpenAI-compatible servers (vLLM,
    llama.cpp, Ollama, OpenRouter) use kind `openai` with their own base URL. Azure-style
    deployments set `api_key_header="api-key"` and `query_params={"api-version": ...}`.
    `extra_body` is merged into the request body last; a key set to null removes it (e.g.
    `{"stream_options": null}` for a server that rejects usage reporting).
    `read_timeout_s` is aiohttp's per-read limit, a safety net for callers without their own
    idle timer; the engine leaves it unset and times streams itself (S4, S5).
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
    max_output_tokens: int | None = Field(default=None, gt=0)
    extra_headers: dict[str, str] = Field(default_factory=dict, repr=False)
    query_params: dict[str, str] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _key_from_environment(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("api_key") or not data.get("api_key_env"):
            return data
        name = data["api_key_env"]
        if not isinstance(name, str) or not _ENV_NAME.match(name) or looks_like_key(name):
            raise ValueError(
                "api_key_env must name an environment variable (like OPENAI_API_KEY); the "
                "value given is not a variable name and may be a key itself, so it is not shown"
            )
        value = os.environ.get(name, "")
        if not value:
            raise ValueError(f"api_key_env: environment variable {name!r} is not set or empty")
        return {**data, "api_key": value}

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

    def secrets(self) -> tuple[str, ...]:
        """The values that must never be shown: the API key, key-like query parameters and
        headers (by name or by shape, with a `Bearer` token counted on its own), and any
        credentials in the base URL."""
        found: list[str] = []
        if self.api_key and self.api_key.get_secret_value():
            found.append(self.api_key.get_secret_value())
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


_ADAPTERS: dict[str, type[SSEProvider]] = {
    "openai": OpenAIProvider,
    "anthropic": AnthropicProvider,
    "gemini": GeminiProvider,
}


def build_provider(
    config: ProviderConfig,
    session: aiohttp.ClientSession,
    *,
    on_bytes: Callable[[], None] | None = None,
) -> SSEProvider:
    """The adapter for `config`. `on_bytes` is called whenever bytes arrive (stall watchdogs).

    The session belongs to the caller, which closes it; adapters never own one.
    """
    return _ADAPTERS[config.kind](config, session, on_bytes=on_bytes)
