"""What a provider accepts, by kind, host and model, when its config does not say.

Each default follows the provider's documented behaviour; every one can be overridden in
`ProviderConfig` (`prefill`, `max_tokens_field`, `dialect`), since model names outlive any
table like this one.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from .prefill import PREFILL_INSTRUCTION, PREFILL_NATIVE, PREFILL_PREFIX_FLAG, PrefillMode

MaxTokensField = Literal["max_tokens", "max_completion_tokens"]
Dialect = Literal["standard", "mistral"]

_SMALL_NUMBER = re.compile(r"(?<!\d)(\d{1,2})(?!\d)")
_MISTRAL_MODELS = re.compile(
    r"^(mistral|magistral|ministral|codestral|devstral|pixtral|open-mistral|open-mixtral)",
    re.IGNORECASE,
)
_OPENAI_REASONING = re.compile(r"^(o\d|gpt-5)", re.IGNORECASE)


def host_of(base_url: str | None) -> str:
    return (urlsplit(base_url).hostname or "") if base_url else ""


def model_version(model: str) -> tuple[int, int]:
    """(major, minor) from the first small numbers of a model name: `claude-opus-4-6` ->
    (4, 6), `claude-3-5-sonnet-20241022` -> (3, 5), `gemini-2.5-flash` -> (2, 5); dates
    are ignored. A name without numbers is (99, 0) when it says `latest` (the newest model)
    and (0, 0) otherwise (an alias the table cannot date: the older, permissive default)."""
    numbers = [int(n) for n in _SMALL_NUMBER.findall(model.rsplit("/", 1)[-1])]
    if not numbers:
        return (99, 0) if "latest" in model else (0, 0)
    return (numbers[0], numbers[1] if len(numbers) > 1 else 0)


def is_openai_host(base_url: str | None) -> bool:
    host = host_of(base_url)
    return base_url is None or host == "api.openai.com" or host.endswith(".openai.azure.com")


def default_dialect(model: str, base_url: str | None) -> Dialect:
    """Mistral's API (by host, or a Mistral model name) has its own message rules."""
    host = host_of(base_url)
    if host == "api.mistral.ai" or host.endswith(".mistral.ai"):
        return "mistral"
    return "mistral" if _MISTRAL_MODELS.match(model.rsplit("/", 1)[-1]) else "standard"


def default_prefill(kind: str, model: str, base_url: str | None) -> PrefillMode:
    """Claude 4.6 and later and Gemini 2.5 and later reject a request ending in an
    assistant turn; OpenAI's own models answer after one instead of continuing it; Mistral
    needs the prefix flag; local and other OpenAI-compatible servers continue it."""
    if kind == "anthropic":
        return PREFILL_INSTRUCTION if model_version(model) >= (4, 6) else PREFILL_NATIVE
    if kind == "gemini":
        return PREFILL_INSTRUCTION if model_version(model) >= (2, 5) else PREFILL_NATIVE
    if default_dialect(model, base_url) == "mistral":
        return PREFILL_PREFIX_FLAG
    return PREFILL_INSTRUCTION if is_openai_host(base_url) else PREFILL_NATIVE


def default_max_tokens_field(model: str) -> MaxTokensField:
    """OpenAI's reasoning models (o-series, gpt-5.x) reject `max_tokens`. A routed name
    (`openai/gpt-5` on a gateway) keeps `max_tokens`, which gateways translate."""
    if "/" not in model and _OPENAI_REASONING.match(model):
        return "max_completion_tokens"
    return "max_tokens"
