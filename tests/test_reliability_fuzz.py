"""Fuzzing the inputs that come from outside: scenario and journal files (in process, over
arbitrary JSON values, mutated valid scenarios and arbitrary bytes; and through the CLI on a
handful of hostile files), the SSE parser and the three providers' stream decoders. The
contract: a valid scenario, or `ScenarioError` with a one-line message; never a traceback,
never a hang; the parser and decoders only ever return events (errors as `ProviderError`)."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsm.engine.provider import (
    Finish,
    KeepAlive,
    ProviderError,
    ReasoningDelta,
    TextDelta,
    ToolCallRequest,
    Usage,
)
from fsm.scenarios.format import Scenario, ScenarioError, load_scenario, parse_scenario
from fsm.scenarios.runner import play, read_journal, run_virtual, split_journal
from providers.anthropic import MessagesDecoder
from providers.gemini import GenerateContentDecoder, ProviderIds
from providers.openai import ChatCompletionsDecoder
from providers.sse import SSEComment, SSEEvent, SSEParser, json_payload

from engine_support import ROOT
from reliability_support import play_and_check, reliability_settings, scenarios

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sse"
PROVIDER_EVENTS = (TextDelta, ReasoningDelta, KeepAlive, ToolCallRequest, Usage, Finish,
                   ProviderError)

finite_scalars = (st.none() | st.booleans() | st.integers(-(10**7), 10**7)
                  | st.floats(-1e7, 1e7, allow_nan=False) | st.text(max_size=12))
any_scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12))


def json_values(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(scalars, lambda children: st.lists(children, max_size=4)
                        | st.dictionaries(st.text(max_size=12), children, max_size=4),
                        max_leaves=16)


def _assert_one_line(error: ScenarioError, source: str) -> None:
    message = str(error)
    assert message and "\n" not in message and "\r" not in message, repr(message)
    assert message.startswith(source), message


# --------------------------------------------------------------------- in-process loader


@reliability_settings(ci_examples=400)
@given(data=json_values(any_scalars))
def test_parse_scenario_on_arbitrary_json(data: Any) -> None:
    # covers the loader contract of docs/scenarios.md (malformed: one line naming the field)
    try:
        scenario = parse_scenario(data, "fuzz.json")
    except ScenarioError as error:
        _assert_one_line(error, "fuzz.json")
    else:
        assert isinstance(scenario, Scenario)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += _paths(child, (*prefix, index))
    return out


@st.composite
def mutated_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """A generated scenario with one value somewhere replaced (or removed): the inputs most
    likely to get past a validator half-way."""
    raw = draw(scenarios("mutated"))
    target = draw(st.sampled_from(_paths(raw)[1:]))
    mutated = copy.deepcopy(raw)
    parent = mutated
    for key in target[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[target[-1]]
    else:
        parent[target[-1]] = draw(json_values(finite_scalars))
    return mutated



@reliability_settings(ci_examples=400)
@given(raw=mutated_scenarios())
def test_mutated_scenarios_are_refused_or_play_cleanly(raw: dict[str, Any]) -> None:
    # covers S14, D4 and the loader contract: whatever the loader accepts, the engine plays
    # to one terminal state with every invariant and an identical replay
    try:
        parse_scenario(raw, "mutated.json")
    except ScenarioError as error:
        _assert_one_line(error, "mutated.json")
        return
    play_and_check(raw)


json_like_text = st.lists(st.sampled_from(
    ["{", "}", "[", "]", ",", ":", '"passes"', '"config"', '"at"', '"text"', '"x"', "1",
     "-0.5", "1e400", "NaN", "Infinity", "null", "true", " ", "\n", '"\\ud800"', "\ufeff"]),
    max_size=60).map("".join)


@reliability_settings(ci_examples=300)
@given(content=st.one_of(st.binary(max_size=300), json_like_text.map(str.encode),
                         st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_load_scenario_and_journal_on_arbitrary_bytes(content: bytes) -> None:
    # covers the CLI contract in process: read_json/load_scenario and the journal reader
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.json"
        path.write_bytes(content)
        try:
            assert isinstance(load_scenario(path), Scenario)
        except ScenarioError as error:
            _assert_one_line(error, str(path))
        try:
            split_journal(read_journal(path), str(path))
        except ScenarioError as error:
            _assert_one_line(error, str(path))


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '{"config": {"max_iterations": ' + "9" * 5000 + "}}"],
                         ids=["deep nesting", "huge integer"])
def test_load_scenario_on_pathological_json(text: str) -> None:
    # covers the loader contract: a malformed file is one ScenarioError line
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "hostile.json"
        path.write_text(text)
        with pytest.raises(ScenarioError):
            load_scenario(path)


def test_infinite_budgets_are_refused_or_end() -> None:
    # covers S4, S5 and the CLI contract (never a hang): measured in virtual time
    raw = json.loads('{"config": {"first_token_timeout_s": Infinity, "idle_timeout_s": '
                     'Infinity}, "passes": [[{"at": 0, "stall": true}]]}')
    try:
        scenario = parse_scenario(raw, "inf.json")
    except ScenarioError:
        return

    async def bounded() -> bool:
        try:
            await asyncio.wait_for(play(scenario), timeout=10**6)
        except TimeoutError:
            return False
        return True

    assert run_virtual(bounded), "the turn had not ended after 10^6 virtual seconds"


def test_stash_item_over_the_budget_is_refused_by_the_loader() -> None:
    # covers R3 and the loader contract
    raw = {"config": {"stash_max_bytes": 8}, "stash": {"a": {"role": "user", "content": "x" * 64}},
           "passes": [[{"at": 1, "end": "completed"}]]}
    try:
        parse_scenario(raw, "stash.json")
    except ScenarioError:
        return
    play_and_check(raw, replay=False)


# ------------------------------------------------------------------------------- the CLI


def _cli(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fsm", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _hostile_files(folder: Path) -> dict[str, Path]:
    files = {
        "random bytes": bytes(range(256)) * 3,
        "empty": b"",
        "a list": b"[1, 2]",
        "not utf-8": b'{"name": "\xff\xfe"}',
        "wrong types": b'{"passes": [[{"at": "soon", "text": 5}]]}',
        "two kinds in a step": b'{"passes": [[{"at": 1, "text": "a", "stall": true}]]}',
        "NaN time": b'{"passes": [[{"at": NaN, "text": "a"}]]}',
    }
    out = {}
    for name, content in files.items():
        path = folder / f"{name.replace(' ', '_')}.json"
        path.write_bytes(content)
        out[name] = path
    out["missing file"] = folder / "absent.json"
    out["a directory"] = folder
    return out


def test_cli_on_hostile_files_exits_2_with_one_line() -> None:
    # covers the run-scenario and replay contract of docs/scenarios.md: exit 2, one line, no
    # traceback, for every malformed file; all cases run concurrently
    with tempfile.TemporaryDirectory() as folder:
        files = _hostile_files(Path(folder))
        runs = {(name, "run-scenario"): _cli(["run-scenario", str(path)])
                for name, path in files.items()}
        runs.update({(name, "replay"): _cli(["replay", str(files[name])])
                     for name in ("random bytes", "a list", "missing file")})
        for (name, command), process in runs.items():
            out, err = process.communicate(timeout=120)
            assert process.returncode == 2, (name, command, out, err)
            assert err.count("\n") == 1 and err.startswith("error: "), (name, command, err)
            assert "Traceback" not in err and out == "", (name, command)


def test_cli_runs_and_replays_a_generated_scenario(tmp_path: Path) -> None:
    # covers the journal contract: run-scenario --journal then replay exits 0
    raw = {"name": "cli", "config": {"idle_timeout_s": 10},
           "passes": [[{"at": 1, "text": "Hi"}, {"at": 2, "tool_call": {"name": "s"}}],
                      [{"at": 1, "stall": True, "settles_after": 1, "lands": "!"}]],
           "tools": {"s": [{"after": 1, "success": True, "data": {"n": 1}}]},
           "events": [{"at": 3.5, "follow_up": True}]}
    scenario, journal = tmp_path / "s.json", tmp_path / "j.json"
    scenario.write_text(json.dumps(raw))
    run = _cli(["run-scenario", str(scenario), "--journal", str(journal)])
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert "result" in lines[-1] and all("event" in line for line in lines[:-1])
    replay = _cli(["replay", str(journal)])
    out, err = replay.communicate(timeout=120)
    assert replay.returncode == 0, (out, err)


def test_cli_on_pathological_files_exits_2() -> None:
    # covers the run-scenario contract of docs/scenarios.md
    files = {
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "bigint.json": '{"config": {"max_iterations": ' + "9" * 5000 + "}}",
        "stash.json": json.dumps({"config": {"stash_max_bytes": 8},
                                  "stash": {"a": {"role": "user", "content": "x" * 64}}}),
    }
    with tempfile.TemporaryDirectory() as folder:
        runs = {}
        for name, text in files.items():
            (Path(folder) / name).write_text(text)
            runs[name] = _cli(["run-scenario", str(Path(folder) / name)])
        failures = {}
        for name, process in runs.items():
            _, err = process.communicate(timeout=120)
            if process.returncode != 2 or "Traceback" in err:
                failures[name] = (process.returncode, err.strip().splitlines()[-1:])
        assert not failures, failures


# ---------------------------------------------------------------------------- providers


def _parse(chunks: list[bytes]) -> list[Any]:
    parser = SSEParser()
    items: list[Any] = []
    for chunk in chunks:
        items += parser.feed(chunk)
    return items + parser.close()


@reliability_settings(ci_examples=400)
@given(raw=st.binary(max_size=400) | st.text(
    alphabet=st.sampled_from(list("data: event: id: retry:\r\n:{}\"é\x00\ufeff")),
    max_size=200).map(lambda t: t.encode()), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_sse_parser_on_arbitrary_bytes(raw: bytes, cuts: list[int]) -> None:
    # covers S4, S5: any bytes, split anywhere, parse without raising to the same items
    # (only events and comments), and every event decodes to an object or a ProviderError
    bounds = sorted({c for c in cuts if c <= len(raw)})
    chunks = [raw[a:b] for a, b in zip([0, *bounds], [*bounds, len(raw)], strict=True)]
    items = _parse(chunks)
    assert items == _parse([raw])
    for item in items:
        assert isinstance(item, (SSEEvent, SSEComment))
        if isinstance(item, SSEEvent):
            payload = json_payload(item)
            assert isinstance(payload, (dict, ProviderError))


@pytest.mark.parametrize("data", ["[" * 100_000, "9" * 5000], ids=["deep", "huge integer"])
def test_json_payload_never_raises(data: str) -> None:
    # covers the provider contract (fsm/provider.py): failures are ProviderError events
    assert isinstance(json_payload(SSEEvent(data)), ProviderError)


def _fixture_events(kind: str) -> list[list[tuple[str, Any]]]:
    """Every recorded stream of `kind` as (event name, decoded data) pairs."""
    streams = []
    for path in sorted((FIXTURES / kind).glob("*.sse")):
        events = [(item.event, json.loads(item.data)) for item in _parse([path.read_bytes()])
                  if isinstance(item, SSEEvent) and item.data.strip() != "[DONE]"]
        streams.append(events)
    return streams


FIXTURE_STREAMS = {kind: _fixture_events(kind) for kind in ("openai", "anthropic", "gemini")} \
    if FIXTURES.is_dir() else {}


def _decoder(kind: str) -> Any:
    if kind == "openai":
        return ChatCompletionsDecoder()
    if kind == "anthropic":
        return MessagesDecoder()
    return GenerateContentDecoder(ProviderIds())


@st.composite
def mutated_streams(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]]]:
    kind = draw(st.sampled_from(sorted(FIXTURE_STREAMS)))
    stream = copy.deepcopy(draw(st.sampled_from(FIXTURE_STREAMS[kind])))
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(stream) - 1))
        name, data = stream[index]
        target = draw(st.sampled_from(_paths(data)))
        value = draw(json_values(any_scalars))
        if not target:
            data = value
        else:
            parent = data
            for key in target[:-1]:
                parent = parent[key]
            parent[target[-1]] = value
        stream[index] = (name, data)
    if draw(st.booleans()):
        stream = stream[: draw(st.integers(0, len(stream)))]
    encoded = [(name, json.dumps(data, allow_nan=True)) for name, data in stream]
    return kind, encoded


@pytest.mark.skipif(not FIXTURE_STREAMS, reason="no SSE fixtures in tests/fixtures/sse")
@reliability_settings(ci_examples=400)
@given(case=mutated_streams())
def test_decoders_on_mutated_recorded_streams(case: tuple[str, list[tuple[str, str]]]) -> None:
    # covers S8, T4 and the provider contract: a recorded stream with any field replaced by
    # any JSON value decodes to provider events only (errors as ProviderError), never raises
    kind, stream = case
    decoder = _decoder(kind)
    out: list[Any] = []
    for name, data in stream:
        if decoder.done:
            break
        out += decoder.feed(SSEEvent(data, name))
    out += decoder.finish()
    for event in out:
        assert isinstance(event, PROVIDER_EVENTS), event
        if isinstance(event, TextDelta):
            assert isinstance(event.text, str), event
        if isinstance(event, ToolCallRequest):
            assert isinstance(event.name, str) and isinstance(event.arguments, dict), event
        if isinstance(event, Usage):
            for value in (event.input_tokens, event.output_tokens, event.total_tokens):
                assert value is None or (isinstance(value, int) and not math.isnan(value))


@pytest.mark.parametrize("choices", [True, -1, 1.5])
def test_openai_decoder_on_choices_that_are_not_a_list(choices: Any) -> None:
    # covers S8 and the provider contract: a malformed event is an error event, not a raise
    # (found by the decoder fuzz in the nightly profile; fixed in 36b3d47)
    decoder = ChatCompletionsDecoder()
    out = decoder.feed(SSEEvent(json.dumps({"object": "chat.completion.chunk",
                                            "choices": choices})))
    assert [type(event) for event in out] == [ProviderError]
