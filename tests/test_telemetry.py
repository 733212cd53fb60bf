"""Traces and metrics of turns (issue 18 item 3): the span tree of a real turn over HTTP with
its GenAI attributes (SDK in-memory exporter, and OTLP over HTTP to a loopback collector),
the Prometheus metrics scraped from the endpoint over loopback, and an engine that runs
without the telemetry packages. Turn times are virtual (looptime)."""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.tools import FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play, play_virtual
from fsm.scenarios.scripted import InMemoryChannel
from fsm.telemetry import ObserverFanout, TelemetryConfig, build_telemetry
from fsm.telemetry.follow import TurnFollower
from fsm.telemetry.metrics import TurnMetrics
from providers import build_provider

from engine_support import ROOT
from providers_support import config_for, sse

NS = 1_000_000_000


def _delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}}


TOOL_PASS = sse(
    _delta({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "get_weather",
                                         "arguments": '{"city": "Oslo"}'}}]}),
    _delta({}, "tool_calls"), _usage(40, 9)) + b"data: [DONE]\n\n"
ANSWER_PASS = sse(_delta({"content": "It is snowing"}), _delta({"content": " in Oslo."}),
                  _delta({}, "stop"), _usage(61, 7)) + b"data: [DONE]\n\n"


class SequenceServer:
    """A loopback chat-completions server answering each request with the next body, after
    `delay` seconds (virtual under looptime)."""

    def __init__(self, bodies: list[bytes], delay: float) -> None:
        self.bodies = list(bodies)
        self.delay = delay
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        await asyncio.sleep(self.delay)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(self.bodies.pop(0))
        await response.write_eof()
        return response

    async def __aenter__(self) -> SequenceServer:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._answer)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


class City(BaseModel):
    city: str


async def _weather(args: City, ctx: ToolContext) -> ToolResult:
    await asyncio.sleep(2.0)
    return ToolResult.ok({"city": args.city, "sky": "snow"})


def _tree(spans: tuple[ReadableSpan, ...]) -> list[tuple[str, list[str]]]:
    """Each span with the names of its children, depth first from the root; children in the
    order they began (a zero-length state before the span that starts as it ends)."""
    ordered = sorted(spans, key=lambda s: (s.start_time or 0, s.end_time or 0))

    def children(span: ReadableSpan) -> list[ReadableSpan]:
        return [c for c in ordered
                if c.parent is not None and c.parent.span_id == span.context.span_id]

    out: list[tuple[str, list[str]]] = []
    stack = [s for s in ordered if s.parent is None][::-1]
    while stack:
        span = stack.pop()
        out.append((span.name, [c.name for c in children(span)]))
        stack.extend(children(span)[::-1])
    return out


def _seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / NS


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_turns_trace_over_http_has_the_genai_attributes() -> None:
    # covers T5-T7 (a tool call, then the next pass) and S4/S5 passes, traced: one span per
    # turn, a child per state visited, per provider call and per tool call
    exporter = InMemorySpanExporter()
    telemetry = build_telemetry(TelemetryConfig(traces=True), span_exporter=exporter)
    assert telemetry is not None
    tools = ToolRegistry([FunctionTool("get_weather", "the weather in a city", City, _weather)])
    async with SequenceServer([TOOL_PASS, ANSWER_PASS], delay=0.5) as server, \
            aiohttp.ClientSession() as session:
        locks = ChannelLockRegistry()
        lock = locks.try_acquire("c-7", "trace")
        assert lock is not None
        turn = Turn(provider=build_provider(config_for(server.url, "openai"), session),
                    channel=InMemoryChannel(), locks=locks, lock=lock, tools=tools,
                    observer=telemetry.observer, turn_id="t-1")
        result = await turn.run()
    await telemetry.aclose()
    assert result.status == "completed" and result.text == "It is snowing in Oslo."
    spans = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in spans}) == 1
    named = {s.name: s for s in spans}
    assert _tree(spans) == [
        ("turn t-1", ["state Preparing", "chat test-model", "state ToolCall", "state Preparing",
                      "chat test-model"]),
        ("state Preparing", []),
        ("chat test-model", ["state AwaitingFirstToken"]),
        ("state AwaitingFirstToken", []),
        ("state ToolCall", ["execute_tool get_weather"]),
        ("execute_tool get_weather", []),
        ("state Preparing", []),
        ("chat test-model", ["state AwaitingFirstToken", "state Streaming"]),
        ("state AwaitingFirstToken", []),
        ("state Streaming", []),
    ]
    root = named["turn t-1"]
    assert root.parent is None
    assert dict(root.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "test-model", "turn.id": "t-1", "turn.channel_id": "c-7",
        "turn.terminal_state": "Done", "turn.status": "completed", "turn.passes": 2}
    calls = sorted((s for s in spans if s.name == "chat test-model"),
                   key=lambda s: s.start_time or 0)
    first, second = (dict(s.attributes or {}) for s in calls)
    assert first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == "test-model"
    assert first["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (40, 9)
    assert first["turn.pass.ended_by"] == "tool_call"
    assert second["gen_ai.response.finish_reasons"] == ("stop",)
    assert (second["gen_ai.usage.input_tokens"], second["gen_ai.usage.output_tokens"]) == (61, 7)
    tool = named["execute_tool get_weather"]
    assert dict(tool.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.call.id": "call_1", "turn.tool.outcome": "ok"}
    assert _seconds(tool) == pytest.approx(2.0, abs=1e-6)
    assert _seconds(calls[0]) == pytest.approx(0.5, abs=0.01)
    assert _seconds(root) == pytest.approx(
        turn.transitions[-1]["t"], abs=1e-6)
    assert all(s.end_time is not None for s in spans)


def _scenario(name: str, **fields: Any) -> Any:
    return parse_scenario({"name": name, **fields}, name)


SCENARIOS = [
    _scenario("plain", passes=[[{"at": 0.5, "text": "Hi."}, {"at": 0.7, "end": "completed"}]]),
    _scenario("stall", config={"idle_timeout_s": 10, "settle_timeout_s": 2},
              passes=[[{"at": 1.0, "text": "The reasons are"},
                       {"at": 1.5, "stall": True, "settles_after": 30}]]),
    _scenario("kill", passes=[[{"at": 1.0, "text": "Once upon"}, {"at": 2.0, "stall": True}]],
              events=[{"at": 6.0, "kill": True}]),
    _scenario("tool_errors", config={"tool_timeout_s": 5},
              passes=[[{"at": 0.2, "tool_calls": [{"name": "lookup", "args": {}},
                                                  {"name": "lookup", "args": {}}]}],
                      [{"at": 0.3, "text": "Sorry."}, {"at": 0.4, "end": "completed"}]],
              tools={"lookup": [{"after": 0.5, "raise": "backend down"}, {"hang": True}]}),
    _scenario("tool_timeout_then_ok", config={"tool_timeout_s": 5},
              passes=[[{"at": 0.2, "tool_calls": [{"name": "slow", "args": {}},
                                                  {"name": "fast", "args": {}}]}],
                      [{"at": 0.3, "text": "Done."}, {"at": 0.4, "end": "completed"}]],
              tools={"slow": [{"hang": True}], "fast": [{"after": 0.1, "success": True}]}),
    _scenario("kill_in_tool", passes=[[{"at": 0.2, "tool_call": {"name": "slow", "args": {}}}]],
              tools={"slow": [{"hang": True}]}, events=[{"at": 3.0, "kill": True}]),
]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_metrics_of_turns_scraped_over_loopback() -> None:
    # covers S11 (timeout phases), S16 (kill), T5/T6 (tool errors and timeouts) as metrics
    telemetry = build_telemetry(TelemetryConfig(metrics=True, metrics_port=0))
    assert telemetry is not None and telemetry.metrics is not None
    registry = telemetry.metrics.registry
    waiting = [3]
    telemetry.metrics.track_queue_depth(lambda: waiting[0])
    url = await telemetry.start()
    assert url is not None and url.startswith("http://127.0.0.1:")
    try:
        seen_active: list[float] = []

        class Probe:
            def on_transition(self, turn: Turn, t: float, event: str, source: str,
                              dest: str) -> None:
                seen_active.append(registry.get_sample_value("turn_engine_active_turns") or 0)

        for scenario in SCENARIOS:
            await play(scenario, ObserverFanout(telemetry.observer, Probe()))
        waiting[0] = 1
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            samples = _samples(await response.text())
    finally:
        await telemetry.aclose()
    assert max(seen_active) == 1.0
    p = "turn_engine_"
    assert samples[(p + "turns_total", (("status", "completed"), ("terminal_state", "Done")))] \
        == 3
    assert samples[(p + "turns_total", (("status", "timeout"),
                                        ("terminal_state", "TimedOut")))] == 1
    assert samples[(p + "turns_total", (("status", "stopped_by_user"),
                                        ("terminal_state", "Stopped")))] == 2
    assert samples[(p + "timeouts_total", (("phase", "idle"),))] == 1
    assert samples[(p + "timeouts_total", (("phase", "settle"),))] == 1
    assert samples[(p + "timeouts_total", (("phase", "tool"),))] == 2
    assert (p + "timeouts_total", (("phase", "first_token"),)) not in samples
    assert samples[(p + "kill_latency_seconds_count", ())] == 2
    assert samples[(p + "kill_latency_seconds_sum", ())] == 0.0
    assert samples[(p + "tool_errors_total", (("outcome", "error"), ("tool", "lookup")))] == 1
    assert samples[(p + "tool_errors_total", (("outcome", "timeout"), ("tool", "lookup")))] \
        == 1
    assert samples[(p + "tool_calls_total", (("outcome", "error"), ("tool", "lookup")))] == 1
    assert samples[(p + "tool_errors_total", (("outcome", "timeout"), ("tool", "slow")))] == 1
    assert samples[(p + "tool_errors_total", (("outcome", "killed"), ("tool", "slow")))] == 1
    assert samples[(p + "tool_calls_total", (("outcome", "ok"), ("tool", "fast")))] == 1
    assert (p + "tool_errors_total", (("outcome", "ok"), ("tool", "fast"))) not in samples
    assert samples[(p + "active_turns", ())] == 0
    assert samples[(p + "queue_depth", ())] == 1
    assert samples[(p + "turn_duration_seconds_count", (("terminal_state", "Done"),))] == 3
    assert samples[(p + "provider_calls_total", (("ended_by", "tool_call"),
                                                 ("model", "scripted")))] == 3


def test_a_turn_not_sampled_writes_no_span() -> None:
    # covers issue 18 item 3: trace_sample_ratio traces whole turns or none of them
    for ratio, expected in ((0.0, 0), (1.0, 5)):
        exporter = InMemorySpanExporter()
        telemetry = build_telemetry(TelemetryConfig(traces=True, trace_sample_ratio=ratio),
                                    span_exporter=exporter)
        assert telemetry is not None
        assert play_virtual(SCENARIOS[0], telemetry.observer).result.status == "completed"
        assert len(exporter.get_finished_spans()) == expected


def test_kill_latency_counts_from_the_stop_request() -> None:
    # covers S7/S16: kill latency is the time from the request to Stopped, not the turn's age
    metrics = TurnMetrics()
    follower = TurnFollower(metrics)
    turn: Any = SimpleNamespace(
        provider=SimpleNamespace(name="scripted"), turn_id="t", elapsed=0.0,
        lock=SimpleNamespace(channel_id="c"), function_history=[], internal_transitions=[],
        pass_results=(), stop_requested_at=None, status=None, error=None)
    follower.on_transition(turn, 0.0, "begin", "Preparing", "AwaitingFirstToken")
    turn.stop_requested_at, turn.status = 4.5, "stopped_by_user"
    turn.elapsed = 6.0  # the driver reached the kill 1.5 s after it was asked for
    follower.on_transition(turn, 4.5, "kill", "AwaitingFirstToken", "Stopped")
    samples = _samples(metrics.exposition().decode())
    assert samples[("turn_engine_kill_latency_seconds_sum", ())] == 1.5
    assert samples[("turn_engine_kill_latency_seconds_count", ())] == 1


def test_a_failing_listener_never_ends_a_turn(caplog: pytest.LogCaptureFixture) -> None:
    # covers S15: an exception outside the machine's work (here telemetry) is no turn crash
    class Broken:
        def __getattr__(self, name: str) -> Any:
            def fail(*_args: Any) -> None:
                raise RuntimeError(f"{name} broke")
            return fail

    metrics = TurnMetrics()
    played = play_virtual(SCENARIOS[0], TurnFollower(Broken(), metrics))  # type: ignore[arg-type]
    assert played.result.status == "completed"
    assert "telemetry listener Broken failed" in caplog.text
    samples = _samples(metrics.exposition().decode())
    assert samples[("turn_engine_turns_total", (("status", "completed"),
                                                ("terminal_state", "Done")))] == 1


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        return None


@pytest.fixture
def collector() -> Iterator[str]:
    """An OTLP/HTTP trace collector on loopback: it keeps what it is sent."""
    _Collector.bodies = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


def test_traces_are_exported_over_otlp_http(collector: str) -> None:
    # covers S16 (a killed turn) exported as OTLP protobuf to a configured endpoint
    telemetry = build_telemetry(TelemetryConfig(traces=True, otlp_endpoint=collector,
                                                service_name="bot-under-test"))
    assert telemetry is not None and telemetry.tracer_provider is not None
    played = play_virtual(SCENARIOS[2], telemetry.observer)
    assert played.result.status == "stopped_by_user"
    assert telemetry.tracer_provider.force_flush(10_000)
    telemetry.tracer_provider.shutdown()
    assert _Collector.bodies, "nothing reached the collector"
    path, kind, body = _Collector.bodies[0]
    assert path == "/v1/traces" and kind == "application/x-protobuf"
    request = ExportTraceServiceRequest.FromString(body)
    resource = request.resource_spans[0].resource
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == \
        "bot-under-test"
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    names = sorted(s.name for s in spans)
    assert names == ["chat scripted", "state AwaitingFirstToken", "state Preparing",
                     "state Streaming", "turn kill"]
    root = next(s for s in spans if s.name == "turn kill")
    attributes = {a.key: a.value for a in root.attributes}
    assert attributes["turn.terminal_state"].string_value == "Stopped"
    assert attributes["turn.kill_latency_s"].double_value == 0.0
    assert (root.end_time_unix_nano - root.start_time_unix_nano) / NS == pytest.approx(6.0)


BLOCK_TELEMETRY = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("opentelemetry", "prometheus_client"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, Block())
"""


def test_the_engine_runs_without_the_telemetry_packages(tmp_path: Any) -> None:
    # covers issue 18 item 3: telemetry is optional; switched on without its packages it
    # says which to install, in one line
    code = BLOCK_TELEMETRY + """
import io, pathlib, sys
from fsm.scenarios.demo import main
from fsm.telemetry import TelemetryConfig, TelemetryUnavailable, build_telemetry
assert main(pathlib.Path(sys.argv[1]), out=io.StringIO()) == 0
assert build_telemetry(TelemetryConfig()) is None
for config in (TelemetryConfig(traces=True), TelemetryConfig(metrics=True)):
    try:
        build_telemetry(config)
    except TelemetryUnavailable as exc:
        print(exc)
assert "opentelemetry" not in sys.modules and "prometheus_client" not in sys.modules
"""
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "telemetry.traces is on but opentelemetry-sdk is not installed: "
        "pip install 'turn-engine[telemetry]'",
        "telemetry.metrics is on but prometheus-client is not installed: "
        "pip install 'turn-engine[telemetry]'"]
    assert len(list(tmp_path.glob("*.json"))) == 5
    assert json.loads((tmp_path / "05_kill.json").read_text())["result"]["state"] == "Stopped"
