"""Turn configuration: every budget and cap of docs/spec.md with its default, validated."""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger(__name__)

MIN_IDLE_TIMEOUT_S = 10.0


class TurnConfig(BaseModel):
    """Budgets and caps of one turn. Unknown keys are refused so a typo is not silently
    ignored in an operator's configuration (scenario files strip unknown keys themselves)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    first_token_timeout_s: float = Field(300.0, gt=0)
    idle_timeout_s: float = Field(120.0, gt=0)
    settle_timeout_s: float = Field(5.0, ge=0)
    tool_timeout_s: float = Field(300.0, gt=0)
    delivery_timeout_s: float = Field(300.0, gt=0)
    """How long the channel may take to send what a finished pass handed it (Discord's rate
    limits) before the turn ends Done/error. The model's idle timer stops when its stream
    ends: a model that finished is not inactive while the channel makes it wait (S15)."""
    max_iterations: int = Field(100, ge=1)
    soft_warn_iteration: int = Field(20, ge=1)
    max_consecutive_tool_errors: int = Field(5, ge=1)
    stash_ttl_s: float = Field(300.0, gt=0)
    stash_max_items: int = Field(16, ge=1)
    stash_max_bytes: int = Field(64 * 1024 * 1024, ge=1)
    drafting: bool = False
    surface_user_errors: bool = True
    fallback_pending: bool = False
    stale_lock_age_s: float = Field(180.0, gt=0)
    max_follow_up_interrupts: int = Field(3, ge=0)
    reactor_lookups_per_turn: int = Field(20, ge=0)
    reactor_lookups_per_message: int = Field(5, ge=0)
    reactors_per_reaction: int = Field(10, ge=1)
    metadata_recent_messages: int = Field(20, ge=1)
    max_delivered_chars: int = Field(20_000, ge=1)
    """What one reply may deliver, in characters (D5): ten full Discord messages. A model
    that never stops is cut here and the turn ends `delivery_cap` with a notice."""
    max_delivered_messages: int = Field(15, ge=1)
    """What one reply may deliver, in Discord messages (D5): short lines cut into many
    messages reach this before the character bound. The Discord channel enforces it."""
    thought_log: Literal["none", "log", "channel"] = "none"
    """Where a turn's reasoning goes, with its owner (T8): nowhere, the `fsm.thoughts`
    logger, or a channel (`thought_log_channel`)."""
    thought_log_channel: str | None = None
    """The channel the thought log is posted in when `thought_log` is `channel`."""
    superseded_output: Literal["continue", "delete"] = "continue"
    """What a fallback does with the messages a failed attempt delivered (G1): continue
    from them (the default), or delete them and answer in full, as TomoriBot does."""
    announce_fallback: bool = False
    """Post a short notice when a fallback model answered (G2)."""

    @model_validator(mode="after")
    def _clamp_budgets(self) -> TurnConfig:
        """The idle budget is at least 10 s (S5) and the first-token budget never shorter
        than the idle budget (S4): both are raised to their floor, as the seed does."""
        if self.idle_timeout_s < MIN_IDLE_TIMEOUT_S:
            log.warning("idle_timeout_s %s raised to the %s s minimum",
                        self.idle_timeout_s, MIN_IDLE_TIMEOUT_S)
            object.__setattr__(self, "idle_timeout_s", MIN_IDLE_TIMEOUT_S)
        if self.first_token_timeout_s < self.idle_timeout_s:
            log.warning("first_token_timeout_s %s raised to the idle budget %s",
                        self.first_token_timeout_s, self.idle_timeout_s)
            object.__setattr__(self, "first_token_timeout_s", self.idle_timeout_s)
        if self.thought_log == "channel" and not self.thought_log_channel:
            raise ValueError("thought_log 'channel' needs thought_log_channel")
        return self
