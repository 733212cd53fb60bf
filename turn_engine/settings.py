"""The operator's configuration, from the environment or a `.env` file.

Every variable starts with `TURN_`; nested fields use `__` (for example
`TURN_ENGINE__IDLE_TIMEOUT_S=90`), and a provider may be given whole as JSON
(`TURN_PROVIDER='{"kind": "openai", "base_url": "http://127.0.0.1:11434/v1", "model": "llama3"}'`).
A provider's key is read from the variable its `api_key_env` names, so no key needs to sit in
this configuration. An invalid value stops start-up with a message naming the field; secrets
are never echoed.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from fsm.engine.config import TurnConfig
from providers import ProviderConfig

from .gc_tuning import GcSettings


class AppSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TURN_", env_file=".env", env_file_encoding="utf-8",
        env_nested_delimiter="__", extra="ignore", hide_input_in_errors=True,
    )

    discord_token: SecretStr | None = None
    provider: ProviderConfig | None = None
    fallbacks: list[ProviderConfig] = Field(default_factory=list)
    engine: TurnConfig = Field(default_factory=TurnConfig)
    system_prompt: str = "You are a friendly, concise assistant in a Discord server."
    trigger_words: list[str] = Field(default_factory=list)
    queue_limit: int = Field(default=10, ge=1)
    history_limit: int = Field(default=20, ge=1, le=100)
    journal_dir: str = "journals"
    gc: GcSettings = Field(default_factory=GcSettings)

    def attempts(self) -> list[ProviderConfig]:
        """Primary first, then the fallbacks in order (G1)."""
        return ([self.provider] if self.provider is not None else []) + list(self.fallbacks)


class ConfigurationError(ValueError):
    """A refused configuration; the message names each bad field and never its value."""


def load_settings() -> AppSettings:
    try:
        return AppSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigurationError(f"invalid configuration: {problems}") from None
