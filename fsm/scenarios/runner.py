"""Playing scenarios on the real engine, and replaying journals against it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import looptime

from ..engine.locks import ChannelLockRegistry
from ..engine.prefill import TurnRequest
from ..engine.provider import HistoryEntry
from ..engine.result import TurnResult
from ..engine.stash import ContextStash
from ..engine.turn import Turn, TurnObserver
from ..review.journal import journal_document
from .format import Scenario, ScenarioError, decode_json, parse_scenario, read_text
from .scripted import InMemoryChannel, ScriptedProvider, ScriptedTools, history_items

T = TypeVar("T")
HISTORY_FIELDS = ("tool_name", "arguments", "result", "call_id", "pre_tool_text", "success")
CHANNEL_ID = "scenario-channel"


@dataclass(slots=True)
class Played:
    """A played scenario: the turn, its transitions and result, and the fakes it used."""

    turn: Turn
    result: TurnResult
    transitions: list[dict[str, Any]]
    channel: InMemoryChannel
    provider: ScriptedProvider
    locks: ChannelLockRegistry
    stash: ContextStash

    def journal(self, scenario: dict[str, Any]) -> dict[str, Any]:
        return journal_document(scenario, self.transitions, self.result.as_dict())


def turn_request(scenario: Scenario) -> TurnRequest:
    """The request a scenario's turn replies to: its history as context, plus what the
    scenario recorded about the request (owner, prefill, replayed calls)."""
    spec = scenario.request
    return TurnRequest(
        context_items=history_items(scenario.history),
        system_prompt=spec.system_prompt, prefill=spec.prefill,
        request_notices=list(spec.request_notices),
        function_history=[HistoryEntry(**entry.model_dump(include=set(HISTORY_FIELDS)))
                          for entry in spec.function_history],
        trigger_message_id=spec.trigger_message_id, queued=spec.queued,
        scene_turn=spec.scene_turn, owner=spec.owner,
    )


async def play(scenario: Scenario, observer: TurnObserver | None = None) -> Played:
    """Run `scenario` on the current loop's clock (virtual under looptime)."""
    config = scenario.turn_config()
    loop = asyncio.get_running_loop()
    stash = ContextStash(ttl_s=config.stash_ttl_s, max_items=config.stash_max_items,
                         max_bytes=config.stash_max_bytes)
    stash_keys: dict[str, str] = {}
    delayed: list[tuple[float, str, dict[str, Any]]] = []
    for name, item in scenario.stash.items():
        body = {k: v for k, v in item.items() if k != "stash_at"}
        at = item.get("stash_at")
        if isinstance(at, (int, float)) and at > 0:
            delayed.append((float(at), name, body))
        else:
            stash_keys[name] = stash.put(body)
    locks = ChannelLockRegistry(stale_age_s=config.stale_lock_age_s,
                                max_follow_up_interrupts=config.max_follow_up_interrupts)
    lock = locks.try_acquire(CHANNEL_ID, owner=scenario.name)
    assert lock is not None
    channel = InMemoryChannel(scenario.history, flush_delays=scenario.flush_delays())
    provider = ScriptedProvider(scenario.passes)
    tools = ScriptedTools(scenario.tools, stash, stash_keys)
    turn = Turn(provider=provider, channel=channel, locks=locks, lock=lock,
                request=turn_request(scenario),
                tools=tools.registry, stash=stash, config=config, observer=observer,
                turn_id=scenario.name)
    start = loop.time()

    async def stash_later(at: float, name: str, body: dict[str, Any]) -> None:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        stash_keys[name] = stash.put(body)

    async def fire_event(at: float, kill: bool) -> None:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        if kill:
            locks.request_stop(CHANNEL_ID)
        else:
            turn.notify_follow_up()

    side_tasks = [loop.create_task(stash_later(at, name, body)) for at, name, body in delayed]
    side_tasks += [loop.create_task(fire_event(e.at, e.kill)) for e in scenario.events]
    try:
        result = await turn.run()
    finally:
        for task in side_tasks:
            task.cancel()
        await asyncio.gather(*side_tasks, return_exceptions=True)
        locks.release(lock)
    return Played(turn=turn, result=result, transitions=list(turn.transitions),
                  channel=channel, provider=provider, locks=locks, stash=stash)


def run_virtual(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a fresh event loop whose clock is virtual (looptime)."""
    loop = looptime.new_event_loop(start=0.0)
    try:
        return loop.run_until_complete(factory())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def play_virtual(scenario: Scenario, observer: TurnObserver | None = None) -> Played:
    return run_virtual(lambda: play(scenario, observer))


def read_journal(path: Path) -> Any:
    """A journal file: one JSON document, or JSON Lines as `run-scenario` prints them."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        first_error = exc
    except (RecursionError, ValueError):
        return decode_json(text, str(path))
    lines: list[Any] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if number == 1 and not line.lstrip().startswith("{"):
            raise ScenarioError(f"{path}: invalid JSON at line {first_error.lineno} column "
                                f"{first_error.colno}: {first_error.msg}")
        lines.append(decode_json(line, f"{path}: line {number}"))
    if not lines:
        raise ScenarioError(f"{path}: empty file, not a journal")
    return lines


def split_journal(data: Any, source: str) -> tuple[Scenario, list[dict[str, Any]], dict[str, Any]]:
    """A recorded journal's scenario, transitions and result.

    Accepts the JSON document `write_journal` produces, or JSON Lines with a
    `{"scenario": …}` line, the transition lines and the `{"result": …}` line."""
    if isinstance(data, list):
        scenario_data: Any = None
        lines: list[dict[str, Any]] = []
        result: Any = None
        for line in data:
            if not isinstance(line, dict):
                raise ScenarioError(f"{source}: every journal line must be a JSON object")
            if "scenario" in line:
                scenario_data = line["scenario"]
            elif "result" in line:
                result = line["result"]
            else:
                lines.append(line)
        data = {**(scenario_data or {}), "journal": lines, "result": result}
        if scenario_data is None:
            raise ScenarioError(f"{source}: the journal carries no scenario line")
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a journal is a JSON object")
    transitions = data.get("journal")
    result = data.get("result")
    if not isinstance(transitions, list):
        raise ScenarioError(f"{source}: journal: missing or not a list of transitions")
    if not isinstance(result, dict):
        raise ScenarioError(f"{source}: result: missing or not an object")
    scenario = parse_scenario({k: v for k, v in data.items() if k not in ("journal", "result")},
                              source)
    return scenario, transitions, result


def first_difference(expected: Any, actual: Any, where: str = "") -> str | None:
    """A readable description of the first place two JSON values differ."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in list(expected) + [k for k in actual if k not in expected]:
            if key not in actual:
                return f"{where}.{key}: recorded {_show(expected[key])}, replay has none"
            if key not in expected:
                return f"{where}.{key}: not recorded, replay has {_show(actual[key])}"
            diff = first_difference(expected[key], actual[key], f"{where}.{key}")
            if diff:
                return diff
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        for index, (a, b) in enumerate(zip(expected, actual, strict=False)):
            diff = first_difference(a, b, f"{where}[{index}]")
            if diff:
                return diff
        if len(expected) != len(actual):
            return (f"{where}: recorded {len(expected)} entries, replay has {len(actual)}")
        return None
    numbers = (int, float)
    if isinstance(expected, numbers) and isinstance(actual, numbers) \
            and not isinstance(expected, bool) and abs(expected - actual) <= 1e-6:
        return None
    if expected != actual:
        return f"{where or 'value'}: recorded {_show(expected)}, replay has {_show(actual)}"
    return None


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def replay_difference(data: Any, source: str) -> str | None:
    """None when the journal replays to the same transitions and result (virtual clock)."""
    return run_virtual(lambda: replay_on_loop(data, source))


async def replay_on_loop(data: Any, source: str) -> str | None:
    """`replay_difference` on the running loop, whose clock must be virtual to match."""
    scenario, transitions, result = split_journal(data, source)
    played = await play(scenario)
    diff = first_difference(transitions, played.transitions, "journal")
    if diff:
        return diff
    return first_difference(result, played.result.as_dict(), "result")
