"""The benchmarks' verdicts (D54): a goal is met or missed only where the samples can say
so; an impossible result (an engine cheaper than what it wraps) is flagged, never met, and
the report shows every judged figure's spread. Pure logic, no timing."""

from __future__ import annotations

import pytest

from bench.common import Section
from bench.report import figures_table, goals
from bench.verdict import judge


def test_negative_overhead_is_flagged_never_met() -> None:
    # covers D54 (the over-HTTP run that measured the engine 9.7 % cheaper than its client)
    verdict = judge([-9.7, -12.0, -4.1, -9.9, -8.0], at_most=10.0, floor=0.0)
    assert verdict.met is None
    assert verdict.flag.startswith("impossible")
    assert verdict.value == -9.7 and (verdict.low, verdict.high) == (-12.0, -4.1)


def test_a_ratio_under_one_to_the_work_it_wraps_is_impossible() -> None:
    # covers D54
    assert judge([0.93, 0.97, 0.95], at_most=1.5, floor=1.0).flag.startswith("impossible")
    assert judge([1.02, 0.99, 1.05], at_most=1.5, floor=1.0).met is True


def test_a_spread_across_the_goal_is_unresolved() -> None:
    # covers D54 (some repeats meet it, some do not: neither word is true)
    verdict = judge([6.0, 9.0, 12.0], at_most=10.0, floor=0.0)
    assert verdict.met is None and verdict.flag.startswith("unresolved")
    assert judge([1900.0, 2100.0, 2300.0], at_least=2000.0).flag.startswith("unresolved")


def test_clear_samples_meet_or_miss() -> None:
    # covers D54
    assert judge([5.7, 6.2, 7.8], at_most=10.0, floor=0.0).met is True
    assert judge([12.0, 14.0, 11.0], at_most=10.0, floor=0.0).met is False
    assert judge([2273.0, 2392.0], at_least=2000.0).met is True
    assert judge([3.0, 3.0], at_most=3.0).met is True  # no spread: the value decides
    assert judge([-1.0, 2.0, 3.0], at_most=10.0, floor=0.0).met is True  # median 2.0


def test_bad_calls_are_refused() -> None:
    # covers D54
    with pytest.raises(ValueError, match="exactly one"):
        judge([1.0], at_most=1.0, at_least=0.5)
    with pytest.raises(ValueError, match="no samples"):
        judge([], at_most=1.0)


def test_the_report_shows_the_flag_and_the_spread() -> None:
    # covers D54 (a flagged figure reads as not judged in both tables, with its spread)
    section = Section("over_http", "5. Over real HTTP")
    section.judged("engine overhead (client CPU)", [-9.7, -12.0, -4.1], "%",
                   goal="≤ 10 %", at_most=10.0, floor=0.0)
    section.judged("engine overhead (wall)", [5.7, 6.2, 7.8], "%", goal="≤ 10 %",
                   at_most=10.0, floor=0.0)
    flagged, judged = section.figures
    assert flagged.met is None and flagged.flag.startswith("impossible")
    assert judged.met is True and judged.spread == (5.7, 7.8)
    rows = "\n".join(figures_table(section) + goals([section]))
    assert "met" not in rows.split("engine overhead (client CPU)")[1].split("\n")[0]
    assert "**not judged: impossible" in rows
    assert "spread 5.70–7.80 % over 3" in rows
