"""Smoke test of benchmark 7 (`python -m bench --only full_bot`): the real bot process against
the emulated gateway and REST and the paced model, with two channels. It checks that the
harness measures what it says — every reply whole, the killed turn Stopped, lags computed
for the sends that waited out the bucket, the requests per reply counted — and asserts no
timing (real time, two processes:
BENCHMARKS.md is where the figures are judged). Covers D2, D3 and D58 end to end."""

from __future__ import annotations

import json
import math

import pytest

from bench import full_bot
from bench.report import render


def test_two_channels_through_the_whole_bot() -> None:
    # covers D2 (sends within Discord's buckets, nothing refused), D3 (/kill Stopped)
    section = full_bot.measure(sizes=(2,), profile_largest=False, compare_requests=True)
    [run] = section.details["runs"]
    # covers D50, D52: the whole reply cost its 7 sends and one typing post, no history read;
    # the side-by-side variant (before D50-D52) typed after messages and read over REST
    assert run["per_reply"] == {"sends": 7, "typing": 1, "history": 0, "all": 8, "refused": 0}
    [before] = section.details["requests_before"]  # every N again
    assert before["per_reply"]["typing"] > 1 and before["per_reply"]["history"] == 1
    assert run["replies_per_s"] > 0 and before["replies_per_s"] > 0
    # the raw loop streamed the same replies whole into the same channels, killing none
    [raw] = section.details["raw_loop"]
    assert raw["complete"] == raw["expected_complete"] == 2 and raw["kills"] == 0
    assert run["channels"] == 2 and run["kills"] == 1 and run["stopped"] == 1
    assert run["complete"] == run["expected_complete"] == 1
    assert run["rate_limited"] == 0
    assert run["refused"] == {} and before["refused"] == {}  # D58: no 429 of any scope
    # the surviving channel's 7 messages and the killed one's first; a lag for every send
    assert run["sends"] >= 8 and run["lag_samples"] == run["sends"]
    assert all(math.isfinite(run[k]) for k in ("first_send_p50_ms", "lag_p99_ms",
                                                "kill_p99_ms", "cpu_ms_per_turn"))
    json.dumps(section.as_dict(), default=float)
    assert "| N | first msg p50" in render([section], {"nproc": 1, "cpu": "", "memory_gib": 0,
                                                      "implementation": "", "python": "",
                                                      "platform": "", "packages": {}},
                                          "python -m bench", 0.0)


def test_the_floor_comparison_runs_every_variant_on_the_same_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # covers D54: the raw loop's CPU per turn is compared with the bot's only where both
    # delivered every reply (global limit lifted, no channel killed), in interleaved rounds
    asked: list[dict[str, object]] = []

    class Done:
        def __init__(self, kwargs: dict[str, object]) -> None:
            self.kwargs = kwargs
            self.profile = {"areas": [{"area": "aiohttp", "us_per": 1000.0 if kwargs.get(
                "raw") else 1500.0}]}

        def summary(self) -> dict[str, object]:
            raw = bool(self.kwargs.get("raw"))
            cpu = 4.0 if raw else (8.0 if "speedups" not in self.kwargs else 10.0)
            return {"channels": 3, "per_reply": {"all": 8.0}, "first_send_p50_ms": 1.0,
                    "first_send_p99_ms": 1.0, "lag_p99_ms": 1.0, "kill_p99_ms": 1.0,
                    "kib_per_channel": 1.0, "cpu_ms_per_turn": cpu, "complete": 3,
                    "expected_complete": 3}

    async def one_run(n: int, **kwargs: object) -> Done:
        asked.append({"n": n, **kwargs})
        return Done(kwargs)

    monkeypatch.setattr(full_bot, "_one_run", one_run)
    section = full_bot.measure(sizes=(3,), profile_largest=False, raw_loop=False,
                               compare_floor=True)
    floor_runs = [a for a in asked if "global_limit" in a]
    assert len(floor_runs) == 8  # three variants twice, then two profiled
    assert all(a["global_limit"] is False and a["kills"] is False and a["n"] == 3
               for a in floor_runs)
    order = [("raw" in a, "speedups" in a) for a in floor_runs[:6]]
    assert order[:3] == list(reversed(order[3:]))  # the second round in reverse order
    figures = {f.name: f.value for f in section.figures}
    assert figures["CPU per turn, the raw loop ÷ the bot, every reply whole (N=3)"] == 0.5
    assert figures["CPU per turn, the raw loop ÷ the bot on asyncio, stdlib json, every reply "
                   "whole (N=3)"] == 0.4
    lines = full_bot.floor_areas(section)
    assert lines[2] == "| aiohttp | 1,500 | 1,000 |"
