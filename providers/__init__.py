"""Streaming clients for OpenAI-compatible, Anthropic and Gemini APIs (no vendor SDKs).

Each adapter implements `fsm.engine.provider.Provider`: it turns one pass into a stream of
normalized events and closes its connection the moment the pass's abort fires (S3).
Build one with `build_provider(ProviderConfig(...), session)`.
"""

from .config import ProviderConfig
from .factory import build_provider

__all__ = ["ProviderConfig", "build_provider"]
