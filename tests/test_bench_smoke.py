"""Smoke test of the benchmarks (`python -m bench`): every benchmark function runs with tiny
sizes and returns well-formed figures. No timing is asserted: absolute times mean little on a
shared machine, and BENCHMARKS.md is where the figures are judged."""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path

import pytest

import fsm.engine.turn
from bench import concurrency, growth, over_http, peers, per_chunk, per_turn
from bench.__main__ import main
from bench.common import Section
from bench.report import render
from bench.workload import Engine, check_typical, typical_plan


def _well_formed(section: Section, nan_ok: bool = False) -> None:
    assert section.key and section.title
    assert section.figures, f"{section.key}: no figures"
    for fig in section.figures:
        assert fig.name and fig.unit, fig
        assert isinstance(fig.value, float), fig
        assert math.isfinite(fig.value) or (nan_ok and math.isnan(fig.value)), fig
        assert fig.met in (True, False, None), fig
        if fig.goal is None:
            assert fig.met is None, fig
    json.dumps(section.as_dict(), default=float)
    assert section.title in render([section], _info(), "python -m bench", 0.0)


def _info() -> dict[str, object]:
    from bench.common import machine_info

    return machine_info()


def test_typical_turn_does_the_declared_work() -> None:
    from bench.common import run_async

    result = run_async(lambda: Engine().typical_turn())
    check_typical(result, typical_plan())
    assert len(result.delivered_text.split()) == 100


def _patchable() -> tuple[object, ...]:
    """What a what-if may patch: it must be back as it was afterwards."""
    return fsm.engine.turn.shared_machine, gc.get_threshold()


def test_per_chunk() -> None:
    section = per_chunk.measure(chunks=200, repeats=1, profile=False)
    _well_formed(section)
    assert any(f.goal for f in section.figures)


def test_per_turn_restores_the_engine_after_what_ifs() -> None:
    before = _patchable()
    section = per_turn.measure(turns=3, repeats=1, profile_turns=2)
    _well_formed(section)
    assert section.details["profile"]["top"]
    assert _patchable() == before


def test_peers() -> None:
    section = peers.measure(turns=1, repeats=1)
    _well_formed(section, nan_ok=True)
    names = [f.name for f in section.figures]
    assert "ours: time per typical turn" in names


def test_peers_run_the_same_workload() -> None:
    pytest.importorskip("pydantic_ai")
    pytest.importorskip("langgraph.prebuilt")
    from bench.common import run_async

    plan = typical_plan()
    expected = "".join(t for p in plan for t in p.texts)
    for make in (peers.pydantic_ai, peers.langgraph):
        assert run_async(make(plan)) == expected


def test_concurrency_in_process() -> None:
    section = concurrency.measure(turns=20, sample=5, repeats=1, isolated=False,
                                  whatifs=("dict-dispatch machine",))
    _well_formed(section)
    assert section.details["traced"]["traced_top"]


def test_concurrency_isolated_child() -> None:
    from bench.common import run_isolated

    out = run_isolated("concurrency", "inflight", {"turns": 10, "sample": 2})
    assert out["turns"] == 10 and out["kill_all_stopped_s"] >= 0


def test_over_http() -> None:
    if not over_http.providers_available():
        pytest.skip("providers/ not importable")
    _well_formed(over_http.measure(chunks=50, repeats=1, min_sample_s=0.0))


def test_growth_in_process() -> None:
    section = growth.measure(sizes=(1, 5), repeats=1, min_turns=5, isolated=False)
    _well_formed(section)
    assert [r["n"] for r in section.details["rows"]] == [1, 5]


def test_command_line_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert main(["--quick", "--only", "per_chunk", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["machine"]["nproc"] >= 1
    assert data["sections"][0]["key"] == "per_chunk"


@pytest.mark.parametrize("name", sorted(__import__("bench.whatif").whatif.WHATIFS))
def test_every_what_if_runs_a_typical_turn_and_restores(name: str) -> None:
    from bench.common import run_async
    from bench.whatif import whatif

    before = _patchable()
    with whatif(name):
        result = run_async(lambda: Engine().typical_turn())
    check_typical(result, typical_plan())
    assert _patchable() == before
