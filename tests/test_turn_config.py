"""The engine's budgets as an operator sets them (SPEC O3, O11, S4, S5, S10, T8): the defaults
are the ones `.env.example` documents, each budget's smallest value is accepted and the one
below it refused, the idle and first-token floors are raised (with a warning only when a
value was really raised), and a config is complete, finite and fixed once built."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from fsm.engine.config import TurnConfig
from turn_engine.settings import load_settings

from engine_support import ROOT
from settings_support import environment

ENGINE_LINE = re.compile(r"^# (TURN_ENGINE__[A-Z_]+=.*)$", re.MULTILINE)


def test_uncommenting_the_documented_engine_block_changes_nothing(tmp_path: Path) -> None:
    # covers O3: `.env.example` shows every engine budget with its default; an operator who
    # uncomments the whole block gets exactly the engine they had without it
    lines = ENGINE_LINE.findall((ROOT / ".env.example").read_text(encoding="utf-8"))
    documented = {line.split("=", 1)[0].removeprefix("TURN_ENGINE__").lower()
                  for line in lines}
    assert documented == set(TurnConfig.model_fields)
    (tmp_path / ".env").write_text(
        "\n".join(line for line in lines if not line.endswith("=")) + "\n")
    with environment(tmp_path):
        loaded = load_settings().engine
    assert loaded == TurnConfig()
    assert loaded.model_dump() == {
        "first_token_timeout_s": 300.0, "idle_timeout_s": 120.0, "settle_timeout_s": 5.0,
        "tool_timeout_s": 300.0, "delivery_timeout_s": 300.0, "max_iterations": 100,
        "soft_warn_iteration": 20, "max_consecutive_tool_errors": 5, "stash_ttl_s": 300.0,
        "stash_max_items": 16, "stash_max_bytes": 64 * 1024 * 1024, "drafting": False,
        "surface_user_errors": True, "fallback_pending": False, "stale_lock_age_s": 180.0,
        "max_follow_up_interrupts": 3, "reactor_lookups_per_turn": 20,
        "reactor_lookups_per_message": 5, "reactors_per_reaction": 10,
        "metadata_recent_messages": 20, "max_delivered_chars": 20_000,
        "max_delivered_messages": 15, "thought_log": "none", "thought_log_channel": None,
        "superseded_output": "continue", "announce_fallback": False}


# (budget, the smallest value an operator may set, the largest one refused)
SMALLEST = [
    ("first_token_timeout_s", 0.5, 0.0),
    ("idle_timeout_s", 0.5, 0.0),
    ("tool_timeout_s", 0.5, 0.0),
    ("delivery_timeout_s", 0.5, 0.0),
    ("stash_ttl_s", 0.5, 0.0),
    ("stale_lock_age_s", 0.5, 0.0),
    ("settle_timeout_s", 0.0, -0.5),
    ("max_follow_up_interrupts", 0, -1),
    ("reactor_lookups_per_turn", 0, -1),
    ("reactor_lookups_per_message", 0, -1),
    ("max_iterations", 1, 0),
    ("soft_warn_iteration", 1, 0),
    ("max_consecutive_tool_errors", 1, 0),
    ("stash_max_items", 1, 0),
    ("stash_max_bytes", 1, 0),
    ("reactors_per_reaction", 1, 0),
    ("metadata_recent_messages", 1, 0),
    ("max_delivered_chars", 1, 0),
    ("max_delivered_messages", 1, 0),
]


@pytest.mark.parametrize(("name", "smallest", "refused"), SMALLEST,
                         ids=[name for name, _, _ in SMALLEST])
def test_each_budget_accepts_its_smallest_value_and_refuses_the_one_below(
        name: str, smallest: float, refused: float) -> None:
    # covers O11, S10: a timer may be as short as the operator likes but not zero (a
    # settle budget of 0 turns the settle wait off, no follow-up interrupts or reactor
    # look-ups are allowed at 0); a cap counts at least one; the mistake names its field
    TurnConfig.model_validate({name: smallest})
    with pytest.raises(ValidationError) as caught:
        TurnConfig.model_validate({name: refused})
    assert [error["loc"] for error in caught.value.errors()] == [(name,)]


def test_the_idle_budget_is_at_least_ten_seconds_and_the_first_token_budget_no_shorter(
        caplog: pytest.LogCaptureFixture) -> None:
    # covers S4, S5: an idle budget under 10 s is raised to 10 s, and a first-token budget
    # shorter than the idle budget is raised to it, each with one warning
    with caplog.at_level(logging.WARNING, logger="fsm.engine.config"):
        raised = TurnConfig(idle_timeout_s=2, first_token_timeout_s=1)
    assert (raised.idle_timeout_s, raised.first_token_timeout_s) == (10.0, 10.0)
    assert [r.getMessage() for r in caplog.records] == [
        "idle_timeout_s 2.0 raised to the 10.0 s minimum",
        "first_token_timeout_s 1.0 raised to the idle budget 10.0"]
    longer = TurnConfig(idle_timeout_s=30, first_token_timeout_s=20)
    assert (longer.idle_timeout_s, longer.first_token_timeout_s) == (30.0, 30.0)


def test_a_budget_already_at_its_floor_is_kept_without_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    # covers S4, S5, O7: the floors themselves are valid settings; an operator who sets
    # them is not warned that anything was raised
    with caplog.at_level(logging.WARNING, logger="fsm.engine.config"):
        config = TurnConfig(idle_timeout_s=10, first_token_timeout_s=10)
        wider = TurnConfig(idle_timeout_s=10.5, first_token_timeout_s=10.5)
    assert (config.idle_timeout_s, config.first_token_timeout_s) == (10.0, 10.0)
    assert (wider.idle_timeout_s, wider.first_token_timeout_s) == (10.5, 10.5)
    assert caplog.records == []


def test_a_thought_log_channel_must_be_named() -> None:
    # covers T8, O11: `channel` without the channel's id is refused; the other
    # destinations need none, and a named channel is kept
    with pytest.raises(ValidationError, match="thought_log 'channel' needs thought_log_channel"):
        TurnConfig(thought_log="channel")
    with pytest.raises(ValidationError, match="needs thought_log_channel"):
        TurnConfig(thought_log="channel", thought_log_channel="")
    assert TurnConfig(thought_log="log").thought_log_channel is None
    assert TurnConfig(thought_log="none", thought_log_channel="").thought_log == "none"
    assert TurnConfig(thought_log="channel", thought_log_channel="42").thought_log_channel \
        == "42"


def test_a_misspelt_budget_is_refused_not_ignored() -> None:
    # covers O11: a typo in an operator's budgets is an error naming it
    with pytest.raises(ValidationError) as caught:
        TurnConfig.model_validate({"idle_timeout": 30})
    assert [error["loc"] for error in caught.value.errors()] == [("idle_timeout",)]


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_budget_is_a_finite_number(value: float) -> None:
    # covers O11, S4: an infinite or undefined timer is refused rather than never firing
    with pytest.raises(ValidationError):
        TurnConfig(tool_timeout_s=value)


def test_a_config_is_fixed_once_built() -> None:
    # covers O3: turns share the engine's config; none can change it for the others
    config = TurnConfig()
    with pytest.raises(ValidationError):
        config.max_iterations = 1  # type: ignore[misc]
    assert config.max_iterations == 100 and hash(config) == hash(TurnConfig())
