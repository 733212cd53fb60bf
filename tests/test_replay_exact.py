"""Live turns replay exactly (issue 18): a turn recorded on the real clock — the OpenAI-style
adapter streaming from a loopback server over real HTTP, a real tool — replays from its
journal alone to the same transitions at the same microsecond and the same result, finish
word, usage, error kind and exception type included. No virtual clock while recording: the
point is a clock whose readings fall between microseconds and a driver that acts on an
input a little after it arrived, as in production."""

from __future__ import annotations

import asyncio
import io
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel

from fsm.cli import main as fsm_main
from fsm.engine.config import TurnConfig
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.provider import AbortSignal, PassRequest, ProviderEvent, TextDelta
from fsm.engine.tools import FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.journal import JournalRecorder, journal_document, read_journal, serialize_journal
from fsm.review.replay import replay_difference
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play_virtual
from fsm.scenarios.scripted import InMemoryChannel, history_items
from providers import build_provider
from providers.replay_server import Pause, ReplayServer, Send, Step
from turn_engine.journals import JournalStore
from turn_engine.settings import JournalSettings

from providers_support import config_for, sse


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


USAGE = {"id": "c1", "object": "chat.completion.chunk", "choices": [],
         "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}}


class CityArgs(BaseModel):
    city: str


class KillingChannel(InMemoryChannel):
    """Asks for a /kill once it has been handed `after` chunks (a user reacting mid-reply)."""

    def __init__(self, locks: ChannelLockRegistry, after: int) -> None:
        super().__init__()
        self.locks = locks
        self.after = after

    async def deliver(self, text: str) -> None:
        await super().deliver(text)
        if len(self.delivered) == self.after:
            self.locks.request_stop("c")


async def _record(script: list[Step] | None = None, *, status: int = 200,
                  tools: ToolRegistry | None = None, config: TurnConfig | None = None,
                  kill_after: int | None = None, provider: Any = None,
                  channel: InMemoryChannel | None = None,
                  history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One live turn on the real clock, journaled as the bot journals it (`history`: the
    channel's recent messages, in the scenario format, that the turn sees)."""
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "live")
    assert lock is not None
    registry = tools if tools is not None else ToolRegistry()
    if channel is None:
        channel = KillingChannel(locks, kill_after) if kill_after else InMemoryChannel()
    items = history_items(parse_scenario({"history": history or []}).history)
    server = ReplayServer(script or [], status=status)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            turn = Turn(provider=provider or build_provider(config_for(server, "openai"),
                                                            session),
                        channel=channel, locks=locks, lock=lock, tools=registry,
                        config=config or TurnConfig(),
                        request=TurnRequest(context_items=items))
            recorder = JournalRecorder(turn.turn_id, turn.config, registry, history=history)
            turn.recorder = recorder
            result = await turn.run()
    finally:
        await server.close()
        locks.release(lock)
    return journal_document(recorder.scenario(), turn.transitions, result.as_dict())


def _round_trip(document: dict[str, Any]) -> dict[str, Any]:
    """The journal as it is read back from its file."""
    loaded = json.loads(serialize_journal(document))
    assert isinstance(loaded, dict)
    return loaded


def test_a_streamed_reply_over_http_replays_exactly() -> None:
    # covers docs/scenarios.md replay (exact, the recorded clock), S4, S5, S13: reasoning,
    # content, the provider's own finish word and its usage are recorded and replayed
    script = [Send(sse(chunk({"reasoning_content": "Thinking."}))), Pause(0.013),
              Send(sse(chunk({"content": "Hello"}))), Pause(0.021),
              Send(sse(chunk({"content": " there"}))), Pause(0.007),
              Send(sse(chunk({}, finish="length"))), Send(sse(USAGE)), Send(sse("[DONE]"))]
    document = _round_trip(asyncio.run(_record(script)))
    steps = document["passes"][0]
    assert {"finish": "length"} in [{k: v for k, v in s.items() if k != "at"} for s in steps]
    assert any("usage" in s for s in steps) and any("reasoning" in s for s in steps)
    passed = document["result"]["pass_results"][0]
    assert passed["finish_reason"] == "length" and passed["usage"]["output_tokens"] == 7
    assert replay_difference(document, "live reply") is None


def test_tool_calls_and_a_raising_tool_over_http_replay_exactly() -> None:
    # covers T5, T6 with the journal rule: the real tool's timing and the class of what it
    # raised are inputs of the turn, recorded and replayed
    calls = {"n": 0}

    async def weather(args: CityArgs, _ctx: ToolContext) -> ToolResult:
        calls["n"] += 1
        await asyncio.sleep(0.004)
        if calls["n"] == 2:
            raise LookupError(f"no station for {args.city}")
        return ToolResult.ok({"city": args.city, "temp_c": 18})

    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
    script = [Send(sse(chunk({"content": "Checking. "}))), Pause(0.005),
              Send(sse(chunk({"tool_calls": [call]}))), Send(sse(chunk({}, "tool_calls"))),
              Send(sse("[DONE]"))]
    tools = ToolRegistry([FunctionTool(name="get_weather", description="weather",
                                       args_model=CityArgs, func=weather)])
    document = _round_trip(asyncio.run(_record(script, tools=tools,
                                               config=TurnConfig(max_iterations=2))))
    outcomes = document["tools"]["get_weather"]
    assert outcomes[1]["raise"] == "no station for Paris"
    assert outcomes[1]["error_type"] == "LookupError"
    assert replay_difference(document, "live tools") is None


def test_an_http_error_replays_with_its_kind_type_and_status() -> None:
    # covers G2 with the journal rule: the error's kind, type and status are what the
    # result and a fallback decision see, so they are recorded whole
    body = json.dumps({"error": {"message": "the request exceeds the available context size",
                                 "type": "exceed_context_size_error"}}).encode()
    document = _round_trip(asyncio.run(_record([Send(body)], status=400)))
    error = document["passes"][0][-1]["error"]
    assert error["kind"] == "http" and error["status"] == 400
    assert document["result"]["pass_results"][0]["error"]["status"] == 400
    assert replay_difference(document, "live error") is None


def test_a_kill_mid_stream_replays_at_its_moment() -> None:
    # covers S7, S16 with the journal rule: the kill is an input timed on the engine's clock
    script = [Send(sse(chunk({"content": f"word{i} "}))) for i in range(3)]
    script += [Pause(0.01)] + [Send(sse(chunk({"content": "never"})))] * 50
    document = _round_trip(asyncio.run(_record(script, kill_after=2)))
    assert document["events"] and document["events"][0]["kill"] is True
    assert document["result"]["status"] == "stopped_by_user"
    assert replay_difference(document, "live kill") is None


class RaisingProvider:
    """A provider library that fails with its own exception class mid-stream."""

    name = "raising"

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ProviderEvent]:
        yield TextDelta("Partial")
        await asyncio.sleep(0.003)
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")


def test_an_exception_from_the_provider_replays_with_its_class_name() -> None:
    # covers S15 with the journal rule: `error` reads "UnicodeDecodeError: …" in replay too
    document = _round_trip(asyncio.run(_record(provider=RaisingProvider())))
    step = document["passes"][0][-1]
    assert step["error_type"] == "UnicodeDecodeError"
    assert document["result"]["error"].startswith("UnicodeDecodeError: ")
    assert replay_difference(document, "live raise") is None


def test_a_keepalive_flood_is_one_step_and_replays() -> None:
    # covers S4 (a keep-alive is no token) and the journal bound: thousands of SSE comments
    # become one step with their count and span, so the journal stays small
    flood = [Send(b": keep-alive\n\n")] * 3000
    script = [*flood, Send(sse(chunk({"content": "Finally."}))),
              Send(sse(chunk({}, "stop"))), Send(sse("[DONE]"))]
    document = _round_trip(asyncio.run(_record(script)))
    runs = [s for s in document["passes"][0] if s.get("keepalive")]
    assert len(runs) == 1 and runs[0]["count"] >= 3000 and runs[0]["until"] >= runs[0]["at"]
    assert len(serialize_journal(document)) < 16_000
    assert replay_difference(document, "live flood") is None


class NoArgs(BaseModel):
    pass


class SlowReactors(InMemoryChannel):
    """A live channel's reactor look-ups (REST calls): they take time, one fails, and one
    never answers when `hang_on` names its message."""

    def __init__(self, hang_on: str | None = None) -> None:
        super().__init__()
        self.hang_on = hang_on

    async def fetch_reactors(self, message_id: str, emoji: str, limit: int) -> list[str]:
        await asyncio.sleep(0.003)
        if message_id == "m2":
            raise ConnectionResetError("peer reset")
        if message_id == self.hang_on:
            await asyncio.Event().wait()
        return [f"{message_id}-fan-{n}" for n in range(limit + 2)]


async def _record_reveal(hang_on: str | None) -> dict[str, Any]:
    """A live metadata reveal on the real clock: the model calls the reveal tool over HTTP,
    the channel's look-ups take real time, then the model answers."""
    history = [{"id": f"m{n}", "author": "ana", "content": f"message {n}", "at": "t",
                "reactions": [{"emoji": "👍", "count": 3}]} for n in range(1, 4)]
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "reveal_message_metadata", "arguments": "{}"}}
    script: list[Step] = [Send(sse(chunk({"tool_calls": [call]}))),
                          Send(sse(chunk({}, "tool_calls"))), Send(sse("[DONE]"))]

    async def reveal(_args: NoArgs, _ctx: ToolContext) -> ToolResult:
        return ToolResult.ok({"type": "context_restart_with_message_metadata"})

    tools = ToolRegistry([FunctionTool(name="reveal_message_metadata", description="reveal",
                                       args_model=NoArgs, func=reveal,
                                       guard="message_metadata")])
    config = TurnConfig(max_iterations=2, tool_timeout_s=0.05, reactors_per_reaction=2)
    return await _record(script, tools=tools, config=config, channel=SlowReactors(hang_on),
                         history=history)


def test_a_metadata_reveal_replays_with_its_lookups_timing_and_names() -> None:
    # covers R6 with the journal rule: each reactor look-up is an input — how long it took,
    # the names it answered, the class of what it raised — so a live reveal replays at the
    # same microseconds and the next pass is asked with the same annotated dialogue
    document = _round_trip(asyncio.run(_record_reveal(hang_on=None)))
    lookups = document["channel"]["lookups"]
    assert [(x["message_id"], x.get("error_type")) for x in lookups] == [
        ("m1", None), ("m2", "ConnectionResetError"), ("m3", None)]
    assert lookups[0]["users"] == ["m1-fan-0", "m1-fan-1", "m1-fan-2", "m1-fan-3"]
    assert all(x["after"] >= 0.003 for x in lookups), lookups
    assert document["result"]["reactor_lookups"] == 3
    assert replay_difference(document, "live reveal") is None
    played = play_virtual(parse_scenario(document))
    annotated = played.provider.requests[1].context_items[0]["metadata"]["reactions"]
    assert annotated == [{"emoji": "👍", "count": 3, "users": ["m1-fan-0", "m1-fan-1"]}]


def test_a_reveal_cut_off_by_its_budget_replays_at_the_same_moment() -> None:
    # covers R6 (look-ups past the tool budget do not hold the turn) with the journal rule:
    # the look-up that never answered is recorded as such, so the reveal times out in replay
    # at the recorded moment, not at once
    document = _round_trip(asyncio.run(_record_reveal(hang_on="m3")))
    assert document["channel"]["lookups"][-1] == {"message_id": "m3", "emoji": "👍",
                                                  "hang": True}
    assert replay_difference(document, "live reveal cut off") is None
    document["channel"]["lookups"][-1] = {"message_id": "m3", "emoji": "👍", "users": []}
    assert replay_difference(document, "lookup answered instead") is not None


def test_replay_reports_a_one_microsecond_difference_in_words() -> None:
    # covers docs/scenarios.md `replay`: equality is exact, and the first difference names
    # the transition, both times and where it is in the file
    script = [Send(sse(chunk({"content": "Hi"}))), Send(sse(chunk({}, "stop"))),
              Send(sse("[DONE]"))]
    document = _round_trip(asyncio.run(_record(script)))
    document["journal"][1]["t"] = round(document["journal"][1]["t"] + 0.000001, 6)
    difference = replay_difference(document, "tampered")
    assert difference is not None
    assert difference.startswith("transition 2 (first_token AwaitingFirstToken → Streaming): "
                                 "recorded at ")
    assert "journal[1].t" in difference
    out = io.StringIO()
    out.write(difference)
    assert "\n" not in out.getvalue()


class PeekArgs(BaseModel):
    user: str


def test_a_restart_from_a_shared_stash_replays_exactly() -> None:
    # covers R3, R4, R8 with the journal rule: the bot's stash is shared by every turn and
    # its keys are random; what a tool of this turn stashed is recorded under a stable name
    from fsm.engine.stash import ContextStash
    from fsm.scenarios.format import parse_scenario
    from fsm.scenarios.scripted import ScriptedProvider

    shared = ContextStash()

    async def peek(args: PeekArgs, ctx: ToolContext) -> ToolResult:
        await asyncio.sleep(0.003)
        key = ctx.stash.put({"role": "user",
                             "parts": [{"type": "text", "text": f"<avatar of {args.user}>"}]})
        return ToolResult.ok({"type": "context_restart_image", "pending_context_key": key})

    tools = ToolRegistry([FunctionTool(name="peek_profile_picture", description="avatar",
                                       args_model=PeekArgs, func=peek, guard="image")])
    passes = parse_scenario({"passes": [
        [{"at": 0.002, "tool_call": {"name": "peek_profile_picture", "args": {"user": "ana"}}}],
        [{"at": 0.004, "text": "A cat in a hat."}, {"at": 0.005, "end": "completed"}]]}).passes

    async def record() -> dict[str, Any]:
        locks = ChannelLockRegistry()
        lock = locks.try_acquire("c", "live")
        assert lock is not None
        turn = Turn(provider=ScriptedProvider(passes), channel=InMemoryChannel(), locks=locks,
                    lock=lock, tools=tools, stash=shared)
        recorder = JournalRecorder(turn.turn_id, turn.config, tools, stash=shared)
        turn.recorder = recorder
        result = await turn.run()
        locks.release(lock)
        return journal_document(recorder.scenario(), turn.transitions, result.as_dict())

    document = _round_trip(asyncio.run(record()))
    assert document["result"]["context_items_added"] == 1
    outcome = document["tools"]["peek_profile_picture"]["outcomes"][0]
    assert outcome["data"]["pending_context_key"] == "$stash:item1"
    assert "<avatar of ana>" in json.dumps(document["stash"]["item1"])
    assert replay_difference(document, "live restart") is None


def test_a_kill_before_the_turn_began_replays() -> None:
    # covers S16 (a kill in Preparing) with the journal rule: a /kill while the bot read the
    # channel's history reaches the turn through the lock; the journal says so
    from fsm.scenarios.scripted import ScriptedProvider

    async def record() -> dict[str, Any]:
        locks = ChannelLockRegistry()
        lock = locks.try_acquire("c", "live")
        assert lock is not None
        locks.request_stop("c")  # before the turn runs, as during the history read
        registry = ToolRegistry()
        turn = Turn(provider=ScriptedProvider([]), channel=InMemoryChannel(), locks=locks,
                    lock=lock, tools=registry)
        recorder = JournalRecorder(turn.turn_id, turn.config, registry)
        turn.recorder = recorder
        result = await turn.run()
        locks.release(lock)
        return journal_document(recorder.scenario(), turn.transitions, result.as_dict())

    document = _round_trip(asyncio.run(record()))
    assert document["events"] == [{"at": 0.0, "kill": True, "before_start": True}]
    assert [t["event"] for t in document["journal"]] == ["kill"]
    assert replay_difference(document, "killed before") is None


def test_a_tool_result_with_nan_is_journaled_by_the_bot_readable_and_replays(
        tmp_path: Path) -> None:
    # covers D57 with the journal rule: a number JSON cannot hold (a tool's NaN) is written
    # as null in the bot's journal, which `python -m fsm replay` then reads and replays
    async def score(_args: CityArgs, _ctx: ToolContext) -> ToolResult:
        return ToolResult.ok({"city": "Paris", "score": math.nan, "range": [-math.inf, 1.5]})

    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "score", "arguments": "{\"city\": \"Paris\"}"}}
    script = [Send(sse(chunk({"tool_calls": [call]}))), Send(sse(chunk({}, "tool_calls"))),
              Send(sse("[DONE]"))]
    tools = ToolRegistry([FunctionTool(name="score", description="score", args_model=CityArgs,
                                       func=score)])
    document = asyncio.run(_record(script, tools=tools, config=TurnConfig(max_iterations=2)))
    path = JournalStore(JournalSettings(dir=str(tmp_path))).write("nan", document)
    assert path is not None
    written = read_journal(path)
    assert written["tools"]["score"][0]["data"] == {"city": "Paris", "score": None,
                                                    "range": [None, 1.5]}
    assert written["result"]["status"] == document["result"]["status"]
    assert fsm_main(["replay", str(path)]) == 0
