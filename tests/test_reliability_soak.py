"""Soak in the test suite: two rounds of concurrent generated turns with random faults on one
virtual-time loop (scripts/soak.py runs the same with 1,000 turns a round and prints the
figures); afterwards tasks, machine entries, turn objects and memory are back to baseline."""

from __future__ import annotations

import logging

import pytest

from fsm.scenarios.runner import run_virtual

from reliability_support import soak


def test_soak_returns_to_baseline(caplog: pytest.LogCaptureFixture) -> None:
    # covers S14, D4 under load, and every SPEC id the oracle checks (see test_reliability_
    # model.py), for 200 turns in two rounds of 100 concurrent turns after a warm-up round
    caplog.set_level(logging.CRITICAL)
    report = run_virtual(lambda: soak(100, seed=20261130, warmup=100))
    assert report.problems == [], "\n".join(report.lines())
    assert sum(report.outcomes.values()) == 200 and report.peak_concurrent >= 80
    assert report.tasks_after == report.tasks_before and report.turns_alive_after == 0
