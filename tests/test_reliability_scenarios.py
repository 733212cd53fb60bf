"""Fault cells played from scenario files' format on the real runner (sync tests: each plays
on its own virtual-time loop and its journal is replayed): each timer in each state it guards,
with the exact time of every state entry, and the engine bugs found by the model-based tests,
as strict xfails (see RELIABILITY.md)."""

from __future__ import annotations

import json
import threading
from typing import Any

import looptime
import pytest

from fsm.review.replay import replay_difference
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play, play_virtual

from reliability_support import play_and_check

CONFIG = {"first_token_timeout_s": 20, "idle_timeout_s": 10, "settle_timeout_s": 5,
          "tool_timeout_s": 30}

TIMER_CELLS: dict[str, tuple[dict[str, Any], list[str], list[float]]] = {
    # first-token budget in AwaitingFirstToken (S4): keep-alives and empty chunks do not count
    "first_token/AwaitingFirstToken": (
        {"passes": [[{"at": 5, "keepalive": True}, {"at": 6, "text": ""},
                     {"at": 7, "stall": True}]]},
        ["Preparing", "AwaitingFirstToken", "Settling", "TimedOut"], [0, 0, 20, 20]),
    # idle budget in Streaming, re-armed by every chunk (S5)
    "idle/Streaming": (
        {"passes": [[{"at": 1, "text": "a"}, {"at": 9, "text": "b"}, {"at": 18, "text": "c"},
                     {"at": 18.5, "keepalive": True}, {"at": 19, "stall": True}]]},
        ["Preparing", "AwaitingFirstToken", "Streaming", "Settling", "TimedOut"],
        [0, 0, 1, 28, 28]),
    # settle budget in Settling: the stream outlives it (S10)
    "settle/Settling expires": (
        {"passes": [[{"at": 1, "text": "a"}, {"at": 2, "stall": True, "settles_after": 9,
                                              "lands": " lost"}]]},
        ["Preparing", "AwaitingFirstToken", "Streaming", "Settling", "TimedOut"],
        [0, 0, 1, 11, 16]),
    # the stream settles within the budget: the landed send is kept (S10, S13)
    "settle/Settling settles": (
        {"passes": [[{"at": 1, "text": "a"}, {"at": 2, "stall": True, "settles_after": 2,
                                              "lands": " landed"}]]},
        ["Preparing", "AwaitingFirstToken", "Streaming", "Settling", "TimedOut"],
        [0, 0, 1, 11, 13]),
    # a settle budget of 0 disables the wait (S10)
    "settle/disabled": (
        {"config": {"settle_timeout_s": 0},
         "passes": [[{"at": 1, "text": "a"}, {"at": 2, "stall": True, "settles_after": 2}]]},
        ["Preparing", "AwaitingFirstToken", "Streaming", "Settling", "TimedOut"],
        [0, 0, 1, 11, 11]),
    # the tool budget in ToolCall (T5): a failed result the model sees, then the next pass
    "tool/ToolCall": (
        {"passes": [[{"at": 1, "tool_call": {"name": "search"}}],
                    [{"at": 1, "text": "sorry"}, {"at": 2, "end": "completed"}]],
         "tools": {"search": [{"hang": True}]}},
        ["Preparing", "AwaitingFirstToken", "ToolCall", "Preparing", "AwaitingFirstToken",
         "Streaming", "Done"], [0, 0, 1, 31, 31, 32, 33]),
    # stream timers do not run while a tool runs, however long it takes (T5)
    "no stream timer in ToolCall": (
        {"passes": [[{"at": 1, "tool_call": {"name": "search"}}],
                    [{"at": 1, "text": "ok"}, {"at": 2, "end": "completed"}]],
         "tools": {"search": [{"after": 29.5, "success": True, "data": {"n": 1}}]}},
        ["Preparing", "AwaitingFirstToken", "ToolCall", "Preparing", "AwaitingFirstToken",
         "Streaming", "Done"], [0, 0, 1, 30.5, 30.5, 31.5, 32.5]),
    # each queued call gets a fresh budget (T5)
    "tool/fresh budget per call": (
        {"passes": [[{"at": 1, "tool_calls": [{"name": "search"}, {"name": "search"}]}],
                    [{"at": 1, "end": "completed"}]],
         "tools": {"search": [{"after": 20, "success": True, "data": {}}, {"hang": True}]}},
        ["Preparing", "AwaitingFirstToken", "ToolCall", "Preparing", "AwaitingFirstToken",
         "Done"], [0, 0, 1, 51, 51, 52]),
}


@pytest.mark.parametrize("cell", list(TIMER_CELLS))
def test_each_timer_in_each_state_it_guards(cell: str) -> None:
    # covers S4, S5, S10, S11, S13, T5: the path and the exact time of every entry
    script, want_path, want_times = TIMER_CELLS[cell]
    raw = {"name": cell, **script, "config": {**CONFIG, **script.get("config", {})}}
    played = play_and_check(raw)
    states = ["Preparing"] + [line["to"] for line in played.transitions]
    assert states == want_path
    assert [0.0] + [line["t"] for line in played.transitions] == want_times
    if cell == "settle/Settling settles":
        assert played.result.text == "a landed"
    if cell == "settle/Settling expires":
        assert played.result.text == "a"


def test_first_token_timeout_of_a_later_pass_reports_first_token() -> None:
    # covers S11, S12: the phase is the phase of the pass that timed out
    raw = {"config": CONFIG,
           "passes": [[{"at": 1, "text": "Checking. "}, {"at": 2, "tool_call": {"name": "s"}}],
                      [{"at": 0, "stall": True}]],
           "tools": {"s": [{"after": 1, "success": True, "data": {}}]}}
    played = play_virtual(parse_scenario(raw))
    assert played.transitions[-2]["event"] == "first_token_timeout"
    assert played.result.metrics == [{"name": "stream_sdk_timeout", "phase": "first_token"}]
    assert played.result.notices == ["timeout_first_token"]


def test_stream_ending_at_the_timeout_instant_settles_at_once() -> None:
    # covers S10: the abandoned call has settled; no reason to wait the settle budget
    raw = {"config": {"settle_timeout_s": 5},
           "passes": [[{"at": 299.5, "keepalive": True}, {"at": 300, "end": "completed"}]]}
    played = play_virtual(parse_scenario(raw))
    assert played.transitions[-1]["t"] == 300.0
    assert played.transitions[-1]["event"] in ("settled", "empty")


def test_drafting_journal_with_a_stashed_restart_replays() -> None:
    # covers R10 and the journal contract of docs/scenarios.md
    raw = {"name": "drafting stash restart", "config": {"drafting": True},
           "passes": [[{"at": 1, "tool_call": {"name": "peek_profile_picture"}}],
                      [{"at": 1, "text": "Nice"}, {"at": 2, "end": "completed"}]],
           "tools": {"peek_profile_picture": [{"after": 0.5, "success": True, "data": {
               "type": "context_restart_image", "pending_context_key": "$stash:avatar"}}]},
           "stash": {"avatar": {"role": "user", "parts": [{"type": "text", "text": "<a>"}]}}}
    played = play_virtual(parse_scenario(raw))
    assert replay_difference(json.loads(json.dumps(played.journal(raw))), "drafting") is None


def test_deadline_off_the_virtual_clock_grid_fires() -> None:
    # covers S5 and the replay contract: journals record times like 5.660298
    raw = {"config": {"idle_timeout_s": 10, "first_token_timeout_s": 20},
           "passes": [[{"at": 5.660298, "text": "a"}, {"at": 6.660298, "stall": True}]]}
    loop = looptime.new_event_loop(start=0.0)
    task = loop.create_task(play(parse_scenario(raw)))
    # a hang detector in real time (the livelock stops the virtual clock); never reached
    # when the engine is right, the scenario takes milliseconds
    watchdog = threading.Timer(3.0, lambda: loop.call_soon_threadsafe(task.cancel))
    watchdog.start()
    try:
        played = loop.run_until_complete(task)
    except BaseException:
        played = None
    finally:
        watchdog.cancel()
        loop.close()
    assert played is not None, "the turn livelocked at its idle deadline"
    assert played.transitions[-2]["event"] == "idle_timeout"
    assert abs(played.transitions[-2]["t"] - 15.660298) <= 1e-6
