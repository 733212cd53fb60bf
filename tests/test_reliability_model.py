"""Model-based tests: Hypothesis generates whole scenarios (every step, outcome, event and
config kind of docs/scenarios.md, at times chosen to land before, on and after each budget) and
the oracle of `reliability_support` checks every played turn, including that its journal
replays to the same transitions and result."""

from __future__ import annotations

from typing import Any

from hypothesis import given

from reliability_support import play_and_check, reliability_settings, scenarios


@reliability_settings(ci_examples=1500)
@given(raw=scenarios())
def test_generated_turns_keep_every_invariant(raw: dict[str, Any]) -> None:
    # covers S4, S5, S7, S9, S10, S11, S12, S13, S14, S15, S16, S17, T1, T2, T3, T4, T5, T6,
    # R1, R3, R4, R5, R8, R9, D4: one terminal state, declared edges, exact timers, replay
    play_and_check(raw)
