"""The bot process's garbage-collector settings.

A bot holds thousands of parked turns, each a few dozen container objects. With CPython's
default thresholds (700, 10, 10) young collections run every few hundred allocations and
full collections rescan every live turn and everything start-up created (modules, pydantic
schemas, discord.py); at 10,000 turns in flight that was 60 % of the wall time and most of
killing them all (BENCHMARKS.md F4). Raising the thresholds and freezing what start-up left
behind takes that off every later collection. This is the process's business, not the
engine's: the `fsm` package never touches the collector.
"""

from __future__ import annotations

import gc

from pydantic import BaseModel, ConfigDict, PositiveInt


class GcSettings(BaseModel):
    """`TURN_GC__ENABLED=false` keeps CPython's defaults."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    thresholds: tuple[PositiveInt, PositiveInt, PositiveInt] = (10_000, 50, 100)
    """Young, middle and old generation thresholds (0 would turn collection off)."""
    freeze_start_up: bool = True


def tune_gc(settings: GcSettings) -> None:
    """Apply `settings` once, after start-up and before the first turn."""
    if not settings.enabled:
        return
    gc.collect()
    if settings.freeze_start_up:
        gc.freeze()
    gc.set_threshold(*settings.thresholds)
