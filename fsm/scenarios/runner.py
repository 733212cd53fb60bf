"""Playing scenarios on the real engine, on a virtual clock (replaying a journal is
`fsm.review.replay`: it plays the journal's scenario here and compares)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import looptime

from ..engine.locks import ChannelLockRegistry
from ..engine.prefill import TurnRequest
from ..engine.provider import HistoryEntry
from ..engine.result import TurnResult
from ..engine.stash import ContextStash
from ..engine.table import TERMINAL
from ..engine.turn import Turn, TurnObserver
from ..journal import journal_document, read_journal
from .format import (
    HistoryMessage,
    LookupSpec,
    Scenario,
    split_journal,
)
from .scripted import InMemoryChannel, ScriptedProvider, ScriptedTools, history_items

__all__ = ["Played", "play", "play_virtual", "read_journal", "run_virtual", "split_journal",
           "turn_request"]
_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)

T = TypeVar("T")
HISTORY_FIELDS = ("tool_name", "arguments", "result", "call_id", "pre_tool_text", "success",
                  "batch")
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
    channel: InMemoryChannel
    if scenario.channel.delivered_text is not None:
        channel = AccountedChannel(scenario.history, flush_delays=scenario.flush_delays(),
                                   account=scenario.channel.delivered_text,
                                   lookups=scenario.channel.lookups)
    else:
        channel = InMemoryChannel(scenario.history, flush_delays=scenario.flush_delays(),
                                  lookups=scenario.channel.lookups)
    provider = ScriptedProvider(scenario.passes)
    tools = ScriptedTools(scenario.tools, stash, stash_keys)
    turn = Turn(provider=provider, channel=channel, locks=locks, lock=lock,
                request=turn_request(scenario),
                tools=tools.registry, stash=stash, config=config, observer=observer,
                turn_id=scenario.name)
    if isinstance(channel, AccountedChannel):
        channel.turn = turn
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
    side_tasks += [loop.create_task(fire_event(e.at, e.kill)) for e in scenario.events
                   if not (e.kill and e.before_start)]
    if any(e.kill and e.before_start for e in scenario.events):
        locks.request_stop(CHANNEL_ID)
    try:
        result = await turn.run()
    finally:
        for task in side_tasks:
            task.cancel()
        await asyncio.gather(*side_tasks, return_exceptions=True)
        locks.release(lock)
    return Played(turn=turn, result=result, transitions=list(turn.transitions),
                  channel=channel, provider=provider, locks=locks, stash=stash)


class AccountedChannel(InMemoryChannel):
    """The in-memory channel, reporting the recorded live channel's own account of what it
    delivered (`channel.delivered_text`) once the turn has ended — the one place the
    engine reads it — and nothing before."""

    def __init__(self, history: list[HistoryMessage], flush_delays: list[float],
                 account: str, lookups: Sequence[LookupSpec] = ()) -> None:
        super().__init__(history, flush_delays=flush_delays, lookups=lookups)
        self.account = account
        self.turn: Turn | None = None

    @property
    def delivered_text(self) -> str:
        turn = self.turn
        return self.account if turn is not None and turn.state in _TERMINAL_NAMES else ""


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
