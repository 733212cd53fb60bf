"""The turn's result as journals, `run-scenario` and the review page read it (SPEC T8,
S13, G2): each pass's record with what it carried, and the turn's failure, thought log and
review log under their names."""

from __future__ import annotations

import pytest

from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def test_each_pass_is_recorded_with_what_it_carried() -> None:
    # covers T8, S13: a pass's record names its index, status and visible text, and its
    # details, reasoning and tool calls when it had them
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "reasoning": "Look it up."}, {"at": 1, "text": "Checking."},
                    {"at": 2, "tool_call": {"name": "t"}}],
                   [{"at": 1, "text": "Sunny.<details>from the tool</details>"},
                    {"at": 2, "end": "completed"}]],
        "tools": {"t": [{"success": True, "data": {}}]}}))
    record = played.result.as_dict()
    first, second = record["pass_results"]
    assert {key: first[key] for key in ("index", "status", "text", "reasoning", "tool_calls")} \
        == {"index": 1, "status": "function_call", "text": "Checking.",
            "reasoning": "Look it up.", "tool_calls": ["t"]}
    assert {key: second[key] for key in ("index", "status", "text", "details")} == {
        "index": 2, "status": "completed", "text": "Sunny.", "details": "from the tool"}
    assert "details" not in first and "reasoning" not in second


async def test_the_turn_record_names_its_failure_thoughts_and_review_log() -> None:
    # covers G2, T8: a failed turn says which failure ended it; the thought log keeps the
    # passes' reasoning with its owner; the review log is there, empty when nothing was
    # reviewed
    played = await play(parse_scenario({"passes": [
        [{"at": 1, "reasoning": "Hmm."}, {"at": 2, "error": "overloaded"}]]}))
    record = played.result.as_dict()
    assert record["status"] == "error" and record["failure"] == "other"
    assert record["thoughts"] == {"owner": "assistant", "log": ["Hmm."]}
    assert record["review_log"] == []
