"""Journals of real turns against a real llama.cpp server replay exactly (issue 18).

Recorded once with `scripts/record_llama_journals.py` — llama.cpp's `llama-server` serving a
tiny generated model, the real engine, the real OpenAI-compatible adapter over HTTP, the
terminal chat's channel — and committed under tests/fixtures/journals/. The suite needs no
server: each journal must replay from itself alone to the same transitions at the same
microsecond and the same result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fsm.journal import read_journal
from fsm.review.replay import replay_difference

from engine_support import ROOT

JOURNALS = ROOT / "tests" / "fixtures" / "journals"
CASES = {
    "llama_plain_reply.json": ("completed", "Done"),
    "llama_tool_call.json": ("timeout", "Done"),
    "llama_idle_timeout.json": ("timeout", "TimedOut"),
    "llama_kill.json": ("stopped_by_user", "Stopped"),
}


def _load(name: str) -> dict[str, Any]:
    data = read_journal(JOURNALS / name)
    assert isinstance(data, dict)
    return data


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_real_server_turn_replays_exactly(name: str) -> None:
    # covers docs/scenarios.md replay (exact) on real turns: S4, S5, S10, S13 (idle
    # timeout), S7 (kill), T5 (tool call), G2 (the provider's finish word and usage)
    document = _load(name)
    status, state = CASES[name]
    assert (document["result"]["status"], document["result"]["state"]) == (status, state)
    assert replay_difference(document, name) is None


def test_the_recordings_carry_what_the_server_said() -> None:
    # covers the journal rule: what the engine's result depends on came from the server
    # and is in the journal — its finish word and usage, the tool call it parsed
    plain = _load("llama_plain_reply.json")
    steps = plain["passes"][0]
    assert any("finish" in step for step in steps) and any("usage" in step for step in steps)
    assert plain["result"]["pass_results"][0]["usage"]["output_tokens"] > 0
    tool = _load("llama_tool_call.json")
    call = next(step["tool_call"] for step in tool["passes"][0] if "tool_call" in step)
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    assert tool["tools"]["get_weather"][0]["success"] is True


def test_a_tampered_recording_is_told_apart() -> None:
    # covers docs/scenarios.md `replay`: a real journal with one input moved a microsecond
    # no longer replays, and the difference names the transition
    document = _load("llama_idle_timeout.json")
    text_steps = [step for step in document["passes"][0] if "text" in step]
    text_steps[-1]["at"] = round(text_steps[-1]["at"] + 0.000001, 6)
    difference = replay_difference(document, "tampered")
    assert difference is not None and "idle_timeout" in difference


def test_every_recorded_journal_is_checked() -> None:
    # keeps the fixture folder and the cases above in step
    assert sorted(p.name for p in Path(JOURNALS).glob("*.json")) == sorted(CASES)
