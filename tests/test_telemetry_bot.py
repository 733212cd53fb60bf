"""Telemetry in the bot an operator runs (issue 18 item 3): `TURN_TELEMETRY__*` settings, the
metrics endpoint opened and closed with `serve()` and scraped over loopback while real
discord.py answers the Discord emulator from a loopback model server (turns by terminal state
and status, the queue depth, active turns), one turn span per reply in the SDK's in-memory
exporter beside the bot's own observer (the bot started through the emulated gateway, mentions
as MESSAGE_CREATE dispatches), a port that cannot be listened on as one line, and a
bot that never imports the telemetry packages when they are off. Virtual time (looptime)."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gateway_support import Harness, bot_on_gateway
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from test_operator_chat import _env
from test_operator_startup import _ready, _settings, emulator
from test_telemetry import BLOCK_TELEMETRY, _Collector, collector

from fsm.engine.generation import Attempt
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import ScriptedProvider
from fsm.telemetry import TelemetryConfig
from fsm.telemetry import build_telemetry as build_with_exporter
from providers.replay_server import Pause, ReplayServer, Send
from turn_engine.bot import build_client, serve
from turn_engine.settings import AppSettings, ConfigurationError, load_settings
from turn_engine.shutdown import StopRequest
from turn_engine.startup import StartupError
from turn_engine.telemetry import build_telemetry

from engine_support import ROOT
from providers_support import sse

__all__ = ["collector"]  # the loopback OTLP collector fixture, shared with test_telemetry
SEND = "POST /channels/{channel_id}/messages"
SCRAPED = re.compile(r"metrics for Prometheus at (http://127\.0\.0\.1:\d+/metrics)")
P = "turn_engine_"


def virtual_time(test: Any) -> Any:
    return pytest.mark.asyncio(pytest.mark.looptime(test))


def _chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text} if text else {},
                         "finish_reason": finish}]}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        return _samples(await response.text())


async def _until(url: str, name: str, labels: tuple[tuple[str, str], ...],
                 value: float) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Scrape until `name{labels}` reads `value` (the gateway and the turns run as tasks of
    their own); the caller bounds the wait."""
    while True:
        samples = await _scrape(url)
        if samples.get((name, labels)) == value:
            return samples
        await asyncio.sleep(0.05)


@virtual_time
async def test_the_running_bot_serves_its_turns_and_queue_depth_as_metrics(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # covers D4 (one turn per channel, the next waits: queue depth) and S2 (turns end Done)
    # as metrics of the bot `serve()` runs, scraped over loopback
    caplog.set_level(logging.INFO)
    script: list[Send | Pause] = [Send(sse(_chunk("Thinking it over.\n\n"))), Pause(20),
                                  Send(sse(_chunk("", "stop")) + b"data: [DONE]\n\n")]
    async with ReplayServer(script) as model, emulator() as emu:
        bob = int(emu.add_user("bob")["id"])
        emu.guilds[emu.guild_id]["members"].append(bob)
        settings = _settings(emu.token, model.url, tmp_path,
                             telemetry={"metrics": True, "metrics_port": 0})
        stop = StopRequest()
        client = build_client()
        serving = asyncio.create_task(serve(settings, stop=stop, client=client))
        await asyncio.wait_for(_ready(client), 60)
        [url] = [m.group(1) for r in caplog.records if (m := SCRAPED.search(r.getMessage()))]
        idle = await _scrape(url)
        assert idle[(P + "queue_depth", ())] == 0 and idle[(P + "active_turns", ())] == 0
        assert not any(name == P + "turns_total" for name, _ in idle)
        await emu.gateway.message_create(emu.channel_id, emu.alice_id,
                                         f"<@{emu.bot_id}> first", mentions=[emu.bot_id])
        await emu.wait_for(lambda r: r.route == SEND, timeout=60)  # streaming, mid-pause
        await emu.gateway.message_create(emu.channel_id, bob, f"<@{emu.bot_id}> second",
                                         mentions=[emu.bot_id])
        waiting = await asyncio.wait_for(_until(url, P + "queue_depth", (), 1), 10)
        assert waiting[(P + "active_turns", ())] == 1
        done = (("status", "completed"), ("terminal_state", "Done"))
        ended = await asyncio.wait_for(_until(url, P + "turns_total", done, 2), 120)
        assert ended[(P + "queue_depth", ())] == 0
        assert ended[(P + "active_turns", ())] == 0
        assert ended[(P + "turn_duration_seconds_count", (("terminal_state", "Done"),))] == 2
        assert ended[(P + "provider_calls_total", (("ended_by", "completed"),
                                                   ("model", "local")))] == 2

        assert [k for k in ended if k[0] == P + "turns_total"] == [(P + "turns_total", done)]
        stop.request("SIGTERM")
        assert await asyncio.wait_for(serving, 60) == 0
    assert len(model.requests) == 2
    with pytest.raises(aiohttp.ClientConnectionError):
        await _scrape(url)  # the endpoint closed with the bot


def _scripted(passes: list[list[dict[str, Any]]]) -> ScriptedProvider:
    return ScriptedProvider(parse_scenario({"passes": passes}).passes)


@asynccontextmanager
async def _traced_bot(passes: list[list[dict[str, Any]]], exporter: InMemorySpanExporter,
                      observer: Any = None, fallback: list[list[dict[str, Any]]] | None = None,
                      ) -> AsyncIterator[Harness]:
    telemetry = build_with_exporter(TelemetryConfig(traces=True), span_exporter=exporter)
    attempts = [Attempt(_scripted(passes), "scripted")]
    if fallback is not None:
        attempts.append(Attempt(_scripted(fallback), "fallback"))
    async with bot_on_gateway([], None, attempts=attempts, observer=observer,
                              telemetry=telemetry) as h:
        yield h


class Transitions:
    """The bot's own observer, beside telemetry's."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        self.seen.append((turn.turn_id, dest))


async def _ask(h: Harness, text: str) -> None:
    """A user mentions the bot (a MESSAGE_CREATE dispatch); until the reply is done."""
    replies = len(h.bot.results)
    await h.mention(text)
    await h.until(lambda: len(h.bot.results) > replies)
    await h.idle()


def _children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id ==
            parent.context.span_id]


@virtual_time
async def test_every_reply_of_the_bot_is_one_turn_span_with_its_states() -> None:
    # covers D4 (replies one after another) and S2 as traces: one turn span per reply, the
    # states and the provider call inside it; the bot's own observer still sees every step
    exporter = InMemorySpanExporter()
    passes = [[{"at": 1, "text": f"answer {n}"}, {"at": 2, "end": "completed"}]
              for n in range(3)]
    transitions = Transitions()
    async with _traced_bot(passes, exporter, transitions) as h:
        for n in range(3):
            await _ask(h, f"question {n}")
        assert [r.text for r in h.bot.results] == [f"answer {n}" for n in range(3)]
        emu = h.emu
    spans = list(exporter.get_finished_spans())
    turns = [s for s in spans if s.name.startswith("turn ")]
    assert len(turns) == 3
    assert len({s.context.trace_id for s in turns if s.context}) == 3
    ids = [str(s.attributes["turn.id"]) for s in turns if s.attributes]
    assert [s.name for s in turns] == [f"turn {i}" for i in ids]
    assert sorted(ids) == sorted({turn_id for turn_id, _ in transitions.seen})
    assert [dest for _, dest in transitions.seen].count("Done") == 3
    for turn in turns:
        attributes = turn.attributes or {}
        assert attributes["turn.channel_id"] == str(emu.channel_id)
        assert attributes["turn.terminal_state"] == "Done"
        assert attributes["turn.status"] == "completed"
        inside = _children(spans, turn)
        [chat] = [s for s in inside if s.name == "chat scripted"]
        assert {s.name for s in inside} == {"chat scripted", "state Preparing"}
        assert {s.name for s in _children(spans, chat)} == {
            "state AwaitingFirstToken", "state Streaming"}
        assert turn.start_time is not None and turn.end_time is not None
        assert (turn.end_time - turn.start_time) / 1e9 == pytest.approx(2, abs=0.05)


def test_the_telemetry_settings_are_read_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # covers issue 18 item 3 settings: TURN_TELEMETRY__*, off by default, misspellings named
    monkeypatch.chdir(tmp_path)
    assert AppSettings().telemetry == TelemetryConfig()
    assert build_telemetry(AppSettings().telemetry) is None
    monkeypatch.setenv("TURN_TELEMETRY__TRACES", "true")
    monkeypatch.setenv("TURN_TELEMETRY__TRACE_SAMPLE_RATIO", "0.25")
    monkeypatch.setenv("TURN_TELEMETRY__METRICS", "true")
    monkeypatch.setenv("TURN_TELEMETRY__METRICS_PORT", "9100")
    assert load_settings().telemetry == TelemetryConfig(
        traces=True, trace_sample_ratio=0.25, metrics=True, metrics_port=9100)
    monkeypatch.setenv("TURN_TELEMETRY__METRIC_PORT", "9100")
    monkeypatch.setenv("TURN_TELEMETRY__TRACE_SAMPLE_RATIO", "2")
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    misspelt, ratio = caught.value.problems  # both at once
    assert "TURN_TELEMETRY__METRIC_PORT" in misspelt
    assert "TURN_TELEMETRY__METRICS_PORT" in misspelt  # did you mean
    assert ratio.startswith("telemetry.trace_sample_ratio (TURN_TELEMETRY__TRACE_SAMPLE_RATIO)")


@virtual_time
async def test_a_metrics_port_in_use_is_one_line_at_start_up(tmp_path: Path) -> None:
    # covers issue 18 item 3: a bad telemetry setting stops start-up with one line
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with emulator() as emu:
            settings = _settings(emu.token, "http://127.0.0.1:9", tmp_path,
                                 telemetry={"metrics": True, "metrics_port": port})
            with pytest.raises(StartupError) as caught:
                await asyncio.wait_for(serve(settings, stop=StopRequest()), 60)
    line = str(caught.value)
    assert line.startswith("telemetry.metrics_port (TURN_TELEMETRY__METRICS_PORT): cannot "
                           f"listen on 127.0.0.1:{port} (")
    assert "\n" not in line


def test_the_bot_runs_without_the_telemetry_packages_when_it_is_off(tmp_path: Path) -> None:
    # covers issue 18 item 3: off, the bot and the chat import no telemetry package; on
    # without them, start-up is one configuration line naming the extra
    code = BLOCK_TELEMETRY + """
import asyncio, sys
import aiohttp, discord
from discord_io.media_fetch import MediaFetcher
from turn_engine import chat
from turn_engine.bot import build_bot
from turn_engine.settings import AppSettings, ConfigurationError

async def main() -> None:
    client = discord.Client(intents=discord.Intents.default())
    fetcher = MediaFetcher()
    async with aiohttp.ClientSession() as session:
        bot = build_bot(client, AppSettings(), session, fetcher)
        assert bot.telemetry is None and bot.observer is None
        try:
            build_bot(client, AppSettings(telemetry={"metrics": True}), session, fetcher)
        except ConfigurationError as exc:
            print(*exc.problems)
    await fetcher.aclose()

asyncio.run(main())
assert "opentelemetry" not in sys.modules and "prometheus_client" not in sys.modules
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "telemetry.metrics is on but prometheus-client is not installed: "
        "pip install 'turn-engine[telemetry]'"]


@virtual_time
async def test_a_fallback_chains_attempts_are_the_turns_of_one_generation_span() -> None:
    # covers G1 as traces: the primary fails and the fallback answers under one generation
    # span; a reply the primary gives alone is one attempt of its own generation
    exporter = InMemorySpanExporter()
    primary = [[{"at": 1, "error": "overloaded"}],
               [{"at": 1, "text": "primary answer"}, {"at": 2, "end": "completed"}]]
    fallback = [[{"at": 1, "text": "fallback answer"}, {"at": 3, "end": "completed"}]]
    async with _traced_bot(primary, exporter, fallback=fallback) as h:
        await _ask(h, "first")
        await _ask(h, "second")
        emu = h.emu
        assert [(r.labels, r.text) for r in h.bot.results] == [
            (["scripted", "fallback"], "fallback answer"), (["scripted"], "primary answer")]
    spans = list(exporter.get_finished_spans())
    generations = [s for s in spans if s.name == "generation"]
    assert len(generations) == 2
    assert not [s for s in spans if s.name.startswith("turn ") and s.parent is None]
    chained, alone = generations
    for generation, attempts, statuses in ((chained, 2, ["error", "completed"]),
                                           (alone, 1, ["completed"])):
        turns = sorted(_children(spans, generation), key=lambda s: s.start_time or 0)
        assert [s.name.split("-")[-1] for s in turns] == ["scripted", "fallback"][:attempts]
        assert [(s.attributes or {})["turn.status"] for s in turns] == statuses
        attributes = generation.attributes or {}
        assert attributes["turn.attempts"] == attempts
        assert attributes["turn.status"] == "completed"
        assert attributes["turn.channel_id"] == str(emu.channel_id)
        assert generation.start_time == turns[0].start_time
        assert generation.end_time == turns[-1].end_time


@pytest.mark.asyncio
async def test_the_terminal_chat_exports_its_turns_over_otlp(tmp_path: Path,
                                                            collector: str) -> None:
    # covers S2 in the terminal chat's traces: `python -m turn_engine` with a provider and
    # TURN_TELEMETRY__TRACES exports each typed line's turn to the OTLP endpoint it names,
    # flushed as it leaves (a real process and real time; the timeout only bounds a hang)
    answer = sse(_chunk("Hello there."), _chunk("", "stop")) + b"data: [DONE]\n\n"
    async with ReplayServer([Send(answer)]) as server:
        env = {**_env(tmp_path, server.url), "TURN_TELEMETRY__TRACES": "true",
               "TURN_TELEMETRY__OTLP_ENDPOINT": collector,
               "TURN_TELEMETRY__SERVICE_NAME": "chat-under-test"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "turn_engine", cwd=tmp_path, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(b"hello\n/quit\n"), 120)
    assert proc.returncode == 0, err.decode()
    assert "Hello there." in out.decode()
    assert _Collector.bodies, "nothing reached the collector"
    spans = []
    for _path, _kind, body in _Collector.bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            assert resource["service.name"] == "chat-under-test"
            spans += [s for ss in resource_spans.scope_spans for s in ss.spans]
    [turn] = [s for s in spans if s.name.startswith("turn ")]
    attributes = {a.key: a.value.string_value for a in turn.attributes}
    assert attributes["turn.channel_id"] == "terminal"
    assert attributes["turn.status"] == "completed"
    assert attributes["gen_ai.request.model"] == "m0"
    assert "chat m0" in {s.name for s in spans}
