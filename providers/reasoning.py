"""Reasoning as a provider setting, and the opaque reasoning state each API wants back.

The setting is one shape for every provider (`{"effort": "low"}`, `{"budget_tokens":
4096}`, or both), turned into each API's own request field: Anthropic's `thinking` budget,
Gemini's `thinkingConfig` (a `thinkingLevel` on Gemini 3, a `thinkingBudget` on 2.5), a
Chat Completions host's `reasoning_effort` (OpenRouter's `reasoning` object, DeepSeek's
`thinking` switch). `effort: "none"` (or a zero budget) asks for no reasoning.

The state is what a model turn leaves that the next request must carry back unchanged
(`fsm.engine.provider.ReasoningState`); `own_state` keeps only the state this adapter and
model made, since a signature from another model is refused (Anthropic "Invalid signature
in thinking block", Gemini "Thought signature is not valid").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fsm import ReasoningState

from .capabilities import model_version

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]

EFFORT_BUDGETS: dict[str, int] = {
    "minimal": 1024, "low": 2048, "medium": 8192, "high": 16384, "xhigh": 32768,
}
"""Thinking tokens for an effort where the API takes a budget (Anthropic, Gemini 2.5)."""
ANTHROPIC_MIN_BUDGET = 1024
"""Anthropic: `budget_tokens` "Must be ≥1024 and less than `max_tokens`"."""
GEMINI_LEVELS: dict[str, str] = {
    "none": "MINIMAL", "minimal": "MINIMAL", "low": "LOW", "medium": "MEDIUM", "high": "HIGH",
    "xhigh": "HIGH",
}
"""Gemini 3's `ThinkingLevel` values (google-genai `types.ThinkingLevel`); Gemini 3 cannot
turn thinking off, so `none` is its least. Pro models take only LOW and HIGH
(ai.google.dev/gemini-api/docs/thinking, "Thinking levels")."""
GEMINI_PRO_LEVELS: dict[str, str] = {"MINIMAL": "LOW", "LOW": "LOW", "MEDIUM": "HIGH",
                                     "HIGH": "HIGH"}
OPENAI_EFFORTS: dict[str, str] = {"xhigh": "high"}
"""Chat Completions `reasoning_effort` is none, minimal, low, medium or high."""


class ReasoningSetting(BaseModel):
    """How much the model should reason before it answers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    effort: ReasoningEffort | None = None
    budget_tokens: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _something_set(self) -> ReasoningSetting:
        if self.effort is None and self.budget_tokens is None:
            raise ValueError("reasoning needs `effort` or `budget_tokens`")
        return self

    @property
    def on(self) -> bool:
        return self.effort != "none" and self.budget_tokens != 0

    def budget(self) -> int:
        """The thinking budget in tokens: the one given, else the effort's."""
        if self.budget_tokens is not None:
            return self.budget_tokens
        return EFFORT_BUDGETS.get(self.effort or "", 0) if self.on else 0


def anthropic_thinking(setting: ReasoningSetting | None) -> dict[str, Any] | None:
    """Messages API `thinking`, or None when thinking is off."""
    if setting is None or not setting.on:
        return None
    return {"type": "enabled", "budget_tokens": max(setting.budget(), ANTHROPIC_MIN_BUDGET)}


def gemini_thinking(setting: ReasoningSetting | None, model: str) -> dict[str, Any] | None:
    """`generationConfig.thinkingConfig`: Gemini 3 takes a level (or the legacy budget, but
    never both: HTTP 400), 2.5 a budget; older models have no thinking and get none."""
    version = model_version(model)
    if setting is None or version < (2, 5):
        return None
    config: dict[str, Any] = {}
    if version >= (3, 0) and setting.budget_tokens is None:
        level = GEMINI_LEVELS[setting.effort or "medium"]
        config["thinkingLevel"] = GEMINI_PRO_LEVELS[level] if "pro" in model else level
    else:
        config["thinkingBudget"] = setting.budget()
    if setting.on:
        config["includeThoughts"] = True
    return config


def chat_effort(setting: ReasoningSetting) -> str | None:
    return OPENAI_EFFORTS.get(setting.effort, setting.effort) if setting.effort else None


def own_state(states: Iterable[ReasoningState | None], origin: str) -> list[dict[str, Any]]:
    """The items of the states `origin` made, in order; everyone else's are dropped."""
    return [item for state in states if state is not None and state.origin == origin
            for item in state.items]


def made_here(state: ReasoningState | None, origin: str) -> bool:
    return state is not None and state.origin == origin
