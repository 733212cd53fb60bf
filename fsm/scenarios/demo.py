"""The main job's embedded default: a handful of built-in turns through the real engine
(scripted provider, scripted tools, in-memory channel, virtual clock), each transition
printed as it happens, each turn recorded as a live journal and replayable."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from ..engine.locks import ChannelLockRegistry
from ..engine.prefill import TurnRequest
from ..engine.table import TERMINAL, State
from ..engine.turn import Turn
from ..journal import JournalRecorder, RecordingStash, journal_document, write_journal
from .format import Scenario, parse_scenario
from .runner import run_virtual
from .scripted import InMemoryChannel, ScriptedProvider, ScriptedTools, history_items

BUILT_IN: list[dict[str, Any]] = [
    {
        "name": "plain_reply",
        "title": "A plain reply",
        "passes": [[{"at": 0.6, "text": "Hello! "}, {"at": 0.8, "text": "Nice to meet you."},
                    {"at": 1.1, "end": "completed"}]],
    },
    {
        "name": "tool_call",
        "title": "A tool call, then the answer",
        "passes": [
            [{"at": 0.5, "text": "Let me check the weather. "},
             {"at": 0.7, "tool_call": {"name": "get_weather", "args": {"city": "Oslo"}}}],
            [{"at": 0.9, "text": "It is -3 °C and snowing in Oslo."},
             {"at": 1.2, "end": "completed"}],
        ],
        "tools": {"get_weather": [{"after": 1.5, "success": True,
                                   "data": {"temp_c": -3, "sky": "snow"}}]},
    },
    {
        "name": "context_restart",
        "title": "A profile picture restarts the turn with richer context",
        "passes": [
            [{"at": 0.4, "tool_call": {"name": "peek_profile_picture", "args": {"user": "ana"}}}],
            [{"at": 1.0, "text": "Your avatar is a cat in a tiny hat."},
             {"at": 1.3, "end": "completed"}],
        ],
        "tools": {"peek_profile_picture": {
            "guard": "image",
            "outcomes": [{"after": 0.8, "success": True,
                          "data": {"type": "context_restart_image",
                                   "pending_context_key": "$stash:avatar"}}]}},
        "stash": {"avatar": {"role": "user",
                             "parts": [{"type": "text", "text": "<profile picture of ana>"}]}},
    },
    {
        "name": "idle_timeout",
        "title": "The provider goes quiet mid-answer",
        "passes": [[{"at": 1.0, "text": "The three reasons are"},
                    {"at": 2.0, "stall": True, "settles_after": 1.5, "lands": " first,"}]],
    },
    {
        "name": "kill",
        "title": "A user types /kill while the model streams",
        "passes": [[{"at": 1.0, "text": "Once upon a time, "},
                    {"at": 3.0, "text": "in a land far away"}, {"at": 4.0, "stall": True}]],
        "events": [{"at": 6.0, "kill": True}],
    },
]

_MARK = {State.DONE.value: "✔", State.TIMED_OUT.value: "⏱", State.STOPPED.value: "■"}


class TransitionPrinter:
    """Prints transitions as a person likes to read them."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def on_transition(self, turn: Turn, t: float, event: str, source: str, dest: str) -> None:
        arrow = f"─{event}─▶"
        self.out.write(f"   {t:8.3f}s  {source:<19} {arrow:<26} {dest}\n")
        self.out.flush()


async def play_live(scenario: Scenario, printer: TransitionPrinter | None) -> dict[str, Any]:
    """Run a built-in turn the way a live one runs: inputs recorded as they arrive."""
    import asyncio

    config = scenario.turn_config()
    loop = asyncio.get_running_loop()
    stash = RecordingStash(ttl_s=config.stash_ttl_s, max_items=config.stash_max_items,
                           max_bytes=config.stash_max_bytes)
    stash_keys = {name: stash.put(dict(item)) for name, item in scenario.stash.items()}
    stash.start(loop.time())
    tools = ScriptedTools(scenario.tools, stash, stash_keys)
    locks = ChannelLockRegistry(stale_age_s=config.stale_lock_age_s)
    lock = locks.try_acquire("demo", owner=scenario.name)
    assert lock is not None
    request = TurnRequest(context_items=history_items(scenario.history))
    recorder = JournalRecorder(scenario.name, config, tools.registry, stash,
                               history=[m.model_dump() for m in scenario.history],
                               request=request)
    turn = Turn(provider=ScriptedProvider(scenario.passes), channel=InMemoryChannel(),
                locks=locks, lock=lock, request=request,
                tools=tools.registry, stash=stash, config=config, observer=printer,
                recorder=recorder, turn_id=scenario.name)

    async def kill_at(at: float) -> None:
        await asyncio.sleep(at)
        locks.request_stop("demo")

    kills = [loop.create_task(kill_at(e.at)) for e in scenario.events if e.kill]
    try:
        result = await turn.run()
    finally:
        for task in kills:
            task.cancel()
        locks.release(lock)
    return journal_document(recorder.scenario(), turn.transitions, result.as_dict())


def main(journal_dir: Path, out: TextIO = sys.stdout,
         replay: str = "python -m fsm replay") -> int:
    """Play the built-in turns; `replay` is the command each journal's line suggests."""
    out.write("No Discord token or provider configured: playing the built-in turns through "
              "the real engine\n(scripted provider, virtual clock).\n\n")
    printer = TransitionPrinter(out)
    for number, raw in enumerate(BUILT_IN, 1):
        scenario = parse_scenario(raw, f"built-in turn {raw['name']}")
        out.write(f"▶ {number}. {raw['title']}\n")
        document = run_virtual(partial(play_live, scenario, printer))
        result = document["result"]
        mark = _MARK.get(result["state"], "?") if result["state"] in {
            s.value for s in TERMINAL} else "?"
        out.write(f"   {mark} {result['state']} · {result['status']}")
        if result["text"]:
            out.write(f" · “{result['text']}”")
        if result["notices"]:
            out.write(f" · notices: {', '.join(result['notices'])}")
        out.write("\n")
        path = journal_dir / f"{number:02d}_{raw['name']}.json"
        write_journal(path, document)
        out.write(f"   journal: {path}  (replay: {replay} {path})\n\n")
    return 0
