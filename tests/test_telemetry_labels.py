"""Prometheus labels from closed sets and the metrics endpoint behind the local guard (issue 22
item 5; SPEC V1, V4): what a model writes (invented tool names, a name of 100,000 characters)
adds no series, every label of fsm/telemetry/metrics.py is a known name or `unknown`, and
`/metrics` answers only to this machine's names and never to another site's page. Turns run
in virtual time (looptime); the endpoint is scraped over loopback."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fsm.engine.result import PassResult
from fsm.engine.tools import ToolRegistry
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play
from fsm.telemetry import TelemetryConfig, build_telemetry
from fsm.telemetry.follow import PassFacts, StateVisit, ToolCallFacts, TurnEnd
from fsm.telemetry.metrics import (
    MAX_LABEL_CHARS,
    MAX_MODELS,
    PHASES,
    STATE_NAMES,
    STATUSES,
    TOKEN_TYPES,
    TOOL_OUTCOMES,
    TRIGGERS,
    UNKNOWN,
    TurnMetrics,
)

LONG_NAME = "x" * 100_000


def _labels(text: str) -> dict[str, set[str]]:
    """Every value each label takes in an exposition."""
    values: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, value in sample.labels.items():
                if name != "le":
                    values.setdefault(name, set()).add(value)
    return values


def _turn_calling(name: str, n: int) -> Any:
    return parse_scenario({
        "name": f"invents_{n}", "config": {"tool_timeout_s": 5},
        "passes": [[{"at": 0.1, "tool_calls": [{"name": name, "args": {}},
                                               {"name": "lookup", "args": {}}]}],
                   [{"at": 0.2, "text": "Done."}, {"at": 0.3, "end": "completed"}]],
        "tools": {"lookup": [{"after": 0.1, "success": True}]}}, f"invents_{n}")


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_tool_names_the_model_invents_add_no_series() -> None:
    # covers V1: 60 turns each calling a tool nobody registered (one named with 100,000
    # characters) are counted under `unknown`; the registered tool keeps its name
    telemetry = build_telemetry(TelemetryConfig(metrics=True, metrics_port=0))
    assert telemetry is not None
    url = await telemetry.start()
    assert url is not None
    try:
        for n in range(60):
            await play(_turn_calling(LONG_NAME if n == 0 else f"invented_{n}", n),
                       telemetry.observer)
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 200
            body = await response.text()
    finally:
        await telemetry.aclose()
    labels = _labels(body)
    assert labels["tool"] == {"lookup", UNKNOWN}
    assert all(len(v) <= MAX_LABEL_CHARS for values in labels.values() for v in values)
    assert len(body) < 20_000, len(body)
    calls = [s for f in text_string_to_metric_families(body) for s in f.samples
             if s.name == "turn_engine_tool_calls_total"]
    assert {(s.labels["tool"], s.labels["outcome"], s.value) for s in calls} == {
        ("lookup", "ok", 60.0), (UNKNOWN, "error", 60.0)}


def test_every_label_comes_from_a_closed_set() -> None:
    # covers V1: states, statuses, phases, outcomes, triggers and token types are the
    # engine's own names, else `unknown`; the model label keeps the first 32 it sees; no
    # value is longer than 64 characters
    metrics = TurnMetrics()
    registry = ToolRegistry()
    hostile = "Done\n# HELP evil" + "y" * 5000
    for n in range(MAX_MODELS + 8):
        turn: Any = SimpleNamespace(provider=SimpleNamespace(name=f"openai:model-{n}" + "m" * 90),
                                    tools=registry)
        metrics.turn_started(turn)
        metrics.state_left(turn, StateVisit("ToolCall", 0.0, 1.0, "tool_result", (
            ToolCallFacts(hostile, None, 0.0, 1.0, "ok"),
            ToolCallFacts("t", None, 0.0, 1.0, hostile),  # type: ignore[arg-type]
        )))
        metrics.pass_ended(turn, PassFacts(1, 0.0, 1.0, hostile, PassResult(
            index=1, usage={"input_tokens": 3, "output_tokens": True})))
        metrics.timed_out(turn, hostile, 1.0)
        metrics.turn_ended(turn, TurnEnd(hostile, hostile, 1.0, hostile, 1, None, None))
    labels = _labels(metrics.exposition().decode())
    closed = {"terminal_state": STATE_NAMES, "status": STATUSES, "phase": PHASES,
              "outcome": TOOL_OUTCOMES, "ended_by": TRIGGERS, "type": TOKEN_TYPES,
              "tool": frozenset()}
    for name, allowed in closed.items():
        assert labels[name] <= allowed | {UNKNOWN}, (name, labels[name])
    assert len(labels["model"]) == MAX_MODELS + 1 and UNKNOWN in labels["model"]
    assert set(labels) == {*closed, "model"}
    assert all(len(v) <= MAX_LABEL_CHARS for values in labels.values() for v in values)


@pytest.mark.asyncio
async def test_the_metrics_endpoint_answers_only_this_machine_and_no_other_site() -> None:
    # covers V4: the same guard as the review page; a DNS-rebound name or a request another
    # site's page fires is refused before anything is counted or read; Prometheus (no
    # browser headers) and names the operator lists are served
    telemetry = build_telemetry(TelemetryConfig(metrics=True, metrics_port=0,
                                                metrics_allowed_hosts=("bot",)))
    assert telemetry is not None
    url = await telemetry.start()
    assert url is not None
    port = url.split(":")[2].split("/")[0]
    try:
        async with aiohttp.ClientSession() as session:
            async def status(**headers: str) -> tuple[int, str]:
                async with session.get(url, headers=headers) as response:
                    return response.status, await response.text()

            assert (await status())[0] == 200
            assert (await status(Host=f"localhost:{port}"))[0] == 200
            assert (await status(Host=f"bot:{port}"))[0] == 200
            refused, body = await status(Host=f"rebound.attacker.example:{port}")
            assert refused == 421 and "answers only to" in body and body.count("\n") == 1
            assert (await status(Host=f"127.0.0.1.attacker.example:{port}"))[0] == 421
            for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                            {"Origin": "https://attacker.example"}, {"Origin": "null"}):
                refused, body = await status(**headers)
                assert refused == 403 and "other sites" in body, headers
            assert (await status(**{"Sec-Fetch-Site": "same-origin"}))[0] == 200
            assert (await status(Origin=f"http://127.0.0.1:{port}"))[0] == 200
    finally:
        await telemetry.aclose()
