"""Every scenario file (ours and the examples in tests/scenarios/examples) produces the path,
transition times and result fields its `expect` block states. Each file's `covers` names its
SPEC ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fsm.scenarios.format import load_scenario
from fsm.scenarios.runner import play_virtual

from engine_support import check_invariants, load_raw, path_of, scenario_files


def _subset_mismatch(expected: Any, actual: Any, where: str = "result") -> str | None:
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{where}: expected an object, got {actual!r}"
        for key, value in expected.items():
            if key not in actual:
                return f"{where}.{key}: missing"
            problem = _subset_mismatch(value, actual[key], f"{where}.{key}")
            if problem:
                return problem
        return None
    if expected != actual:
        return f"{where}: expected {expected!r}, got {actual!r}"
    return None


@pytest.mark.parametrize("path", scenario_files(), ids=lambda p: p.stem)
def test_scenario_meets_its_expectations(path: Path) -> None:
    # covers: the SPEC ids listed in each file's "covers" (examples e01-e06: S4, S5, S7, S10,
    # S11, S12, S13, S16, T6, R1, R3, R4, R7, R8)
    raw = load_raw(path)
    expect = raw["expect"]
    played = play_virtual(load_scenario(path))
    states, times = path_of(played.transitions)
    assert states == expect["path"], f"{path.name}: path"
    for index, (want, got) in enumerate(zip(expect.get("times", []), times, strict=False)):
        if want is not None:
            assert abs(want - got) <= 0.01, f"{path.name}: time of {states[index]} #{index}"
    problem = _subset_mismatch(expect.get("result", {}), played.result.as_dict())
    assert problem is None, f"{path.name}: {problem}"
    assert played.result.state == states[-1]
    check_invariants(played)
