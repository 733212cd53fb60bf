"""Turning a provider configuration into its adapter. Adapters join the registry here, so
the configuration module depends on none of them (no config <-> adapter import cycle)."""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from .anthropic import AnthropicProvider
from .config import ProviderConfig, ProviderKind
from .gemini import GeminiProvider
from .http import SSEProvider
from .openai import OpenAIProvider

ADAPTERS: dict[ProviderKind, type[SSEProvider]] = {
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
    return ADAPTERS[config.kind](config, session, on_bytes=on_bytes)
