"""Smoke test of the Redis benchmark (`python -m bench --only redis_scale`, SPEC D3, D4):
with tiny sizes it runs its worker processes against a real redis-server and returns
well-formed figures. No timing is asserted; BENCHMARKS.md is where the figures are judged."""

from __future__ import annotations

import json
import math

from bench import redis_scale
from bench.common import machine_info
from bench.report import render


def test_redis_scale_runs_and_reports_every_figure() -> None:
    # covers D3 (/kill across processes measured end to end) and D4 (turns through the queue)
    section = redis_scale.measure(kill_rounds=3, leases=20, renewals=2, turns=20, channels=4,
                                  repeats=1)
    names = [fig.name for fig in section.figures]
    assert len(names) == 10 and any("p99" in name for name in names)
    for fig in section.figures:
        assert math.isfinite(fig.value) and fig.value >= 0, fig
        assert (fig.goal is None) == (fig.met is None), fig
    assert len(section.details["kill_ms"]) == 3
    assert set(section.details["throughput_wall_s"]) == {"local", "redis_1", "redis_2"}
    json.dumps(section.as_dict(), default=float)
    assert section.title in render([section], machine_info(), "python -m bench", 0.0)
