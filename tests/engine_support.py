"""Helpers for the engine's tests: scenario files, paths, and the session-wide record of
which declared edges the tests took (see test_machine.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fsm.engine.channel import TurnChannel
from fsm.engine.config import TurnConfig
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.provider import Provider
from fsm.engine.recording import InputRecorder
from fsm.engine.stash import ContextStash
from fsm.engine.tools import ToolRegistry
from fsm.engine.turn import Turn, TurnObserver
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider, ScriptedTools, history_items

ROOT = Path(__file__).resolve().parents[1]
OWN_SCENARIOS = ROOT / "tests" / "scenarios"
EXAMPLE_SCENARIOS = OWN_SCENARIOS / "examples"

TAKEN_EDGES: set[tuple[str, str, str]] = set()


def live_turn(provider: Provider, channel: TurnChannel | None = None, *,
              tools: ToolRegistry | None = None, recorder: InputRecorder | None = None,
              **config: Any) -> Turn:
    """A turn calling `provider` (a test's own adapter) on `channel` (an in-memory one by
    default), holding its channel's lock, with `config`'s engine settings."""
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c1", "test")
    assert lock is not None
    return Turn(provider=provider, channel=channel if channel is not None else InMemoryChannel(),
                locks=locks, lock=lock, tools=tools, config=TurnConfig(**config),
                recorder=recorder)


def scripted_turn(raw: dict[str, Any], *, channel_class: type[InMemoryChannel] = InMemoryChannel,
                  turn_class: type[Turn] = Turn, observer: TurnObserver | None = None) -> Turn:
    """A turn playing scenario `raw` (its passes, tools, history and config) on an
    in-memory channel of `channel_class`, holding its channel's lock."""
    scenario = parse_scenario(raw)
    stash = ContextStash()
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c1", "test")
    assert lock is not None
    return turn_class(provider=ScriptedProvider(scenario.passes),
                      channel=channel_class(scenario.history), locks=locks, lock=lock,
                      request=TurnRequest(history_items(scenario.history)),
                      tools=ScriptedTools(scenario.tools, stash, {}).registry, stash=stash,
                      observer=observer, config=scenario.turn_config())


def scenario_files() -> list[Path]:
    return sorted(OWN_SCENARIOS.glob("*.json")) + sorted(EXAMPLE_SCENARIOS.glob("*.json"))


def path_of(transitions: list[dict[str, Any]]) -> tuple[list[str], list[float]]:
    """The states visited (starting with Preparing) and the time of each entry."""
    states = ["Preparing"]
    times = [0.0]
    for line in transitions:
        if line["from"] == line["to"]:
            continue
        states.append(line["to"])
        times.append(line["t"])
    return states, times


def load_raw(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def check_invariants(played: Any) -> None:
    """After every turn: one terminal state, nothing left running, lock and handles clear."""
    from fsm.engine.table import TERMINAL

    turn = played.turn
    terminal = {s.value for s in TERMINAL}
    assert turn.state in terminal
    entries = [line for line in played.transitions if line["to"] in terminal]
    assert (len(entries) == 1 and played.transitions[-1] is entries[0]) or \
        played.transitions[-1] == entries[0]
    run = turn._passes.run
    if run is not None:
        assert run.worker is None or run.worker.done()
        assert run.abort.fired and run.deadline is None and run.kill_handle is None
    assert not turn._workers.live, turn._workers.live  # no worker outlives the turn (S14)
    assert not turn._tools.busy() and turn._tools.deadline is None
    assert not turn._restarts.busy()
    lock = turn.lock
    assert lock.stream_kill is None and lock.turn_kill is None
    assert lock.released and len(played.locks) == 0
