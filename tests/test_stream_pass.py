"""One provider pass (SPEC S1-S17) beyond what the scenario files show: request building,
abort handles, the lock watchdog, kill routing and cleanup. All in virtual time."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel

from fsm.engine.channel import Notice, TurnChannel
from fsm.engine.config import TurnConfig
from fsm.engine.events import FirstToken, StreamEnded
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.provider import (
    AbortSignal,
    Finish,
    HistoryEntry,
    PassRequest,
    ProviderEvent,
    TextDelta,
)
from fsm.engine.tools import FunctionTool, ToolContext, ToolRegistry, ToolResult
from fsm.engine.turn import Turn
from fsm.journal import JournalRecorder, journal_document
from fsm.review.replay import replay_on_loop
from fsm.scenarios.format import Step, parse_scenario
from fsm.scenarios.runner import play
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


def _turn(provider: Any, request: TurnRequest | None = None,
          locks: ChannelLockRegistry | None = None, channel: TurnChannel | None = None,
          **config: Any) -> Turn:
    registry = locks if locks is not None else ChannelLockRegistry()
    lock = registry.try_acquire("c1", "test")
    assert lock is not None
    return Turn(provider=provider, channel=channel if channel is not None else InMemoryChannel(),
                locks=registry, lock=lock, request=request, config=TurnConfig(**config))


class ProbeProvider:
    """Streams a few chunks on the loop clock and notes what the engine handed it."""

    name = "probe"

    def __init__(self, chunks: list[tuple[float, str]], hang: bool = False) -> None:
        self.chunks = chunks
        self.hang = hang
        self.requests: list[PassRequest] = []
        self.aborts: list[AbortSignal] = []
        self.closed_at: float | None = None

    def stream(self, request: PassRequest, abort: AbortSignal) -> Any:
        self.requests.append(request)
        self.aborts.append(abort)
        abort.add_callback(self._on_abort)
        return self._gen(abort)

    def _on_abort(self) -> None:
        self.closed_at = asyncio.get_running_loop().time()

    async def _gen(self, abort: AbortSignal) -> Any:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for at, text in self.chunks:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            if abort.fired:
                return
            yield TextDelta(text)
        if self.hang:
            await abort.wait()


async def test_prefill_is_last_and_notices_precede_it() -> None:
    # covers S1: with no tool history the prefill is the last item, after the notices
    request = TurnRequest(prefill="Continuing: ", request_notices=["[System: lookup done]"])
    provider = ProbeProvider([(1, "x")])
    await _turn(provider, request).run()
    tail = provider.requests[0].tail
    assert [item["kind"] for item in tail] == ["notice", "prefill"]
    assert tail[-1]["content"] == provider.requests[0].prefill == "Continuing: "


async def test_prefill_folds_into_the_first_tool_call_turn() -> None:
    # covers S1: once there is tool history the prefill is merged into the first tool-call
    # turn, before its pre-tool text, and not repeated at the end
    history = [HistoryEntry(tool_name="lookup", arguments={}, result={"success": True},
                            pre_tool_text="Looking.")]
    request = TurnRequest(prefill="Continuing: ", request_notices=["[System: lookup done]"],
                          function_history=history)
    provider = ProbeProvider([(1, "x")])
    await _turn(provider, request).run()
    sent = provider.requests[0]
    assert [item["kind"] for item in sent.tail] == ["tool_history", "notice"]
    assert sent.function_history[0].pre_tool_text == "Continuing: Looking."
    assert sent.prefill == "" and history[0].pre_tool_text == "Looking."


async def test_queued_turn_replies_to_trigger_scene_turn_does_not() -> None:
    # covers S2
    queued = ProbeProvider([(1, "x")])
    await _turn(queued, TurnRequest(trigger_message_id="m9", queued=True)).run()
    assert queued.requests[0].reply_to_message_id == "m9"
    scene = ProbeProvider([(1, "x")])
    await _turn(scene, TurnRequest(trigger_message_id="m9", queued=True,
                                   scene_turn=True)).run()
    assert scene.requests[0].reply_to_message_id is None


async def test_each_pass_gets_a_fresh_abort_that_fires_on_timeout() -> None:
    # covers S3, S10
    provider = ProbeProvider([(1, "a")], hang=True)
    turn = _turn(provider, idle_timeout_s=20)
    result = await turn.run()
    assert result.status == "timeout"
    assert len(provider.aborts) == 1 and provider.aborts[0].fired
    assert provider.closed_at == pytest.approx(21.0)


async def test_kill_handle_registered_per_pass_and_aborts_http_at_once() -> None:
    # covers S7, S14
    provider = ProbeProvider([(1, "a")], hang=True)
    locks = ChannelLockRegistry()
    turn = _turn(provider, locks=locks)
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(5)
    lock = locks.get("c1")
    assert lock is not None and lock.stream_kill is not None
    assert locks.request_stop("c1")
    assert provider.aborts[0].fired  # the HTTP request is aborted synchronously
    result = await task
    assert result.status == "stopped_by_user"
    assert asyncio.get_running_loop().time() == pytest.approx(5.0)
    assert lock.stream_kill is None and lock.turn_kill is None


async def test_lock_exempt_from_stale_release_while_pass_runs() -> None:
    # covers S6, S5
    provider = ProbeProvider([(1, "a"), (100, "b"), (199, "c")], hang=True)
    locks = ChannelLockRegistry(stale_age_s=180)
    turn = _turn(provider, locks=locks, idle_timeout_s=120)
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(250)
    assert locks.release_stale() == []  # a long healthy generation is not stale
    lock = locks.get("c1")
    assert lock is not None and lock.last_touch == pytest.approx(199.0)
    await task


async def test_stale_lock_released_when_no_pass_runs() -> None:
    # covers S6
    locks = ChannelLockRegistry(stale_age_s=180)
    lock = locks.try_acquire("c2", "stuck")
    assert lock is not None
    await asyncio.sleep(179)
    assert locks.release_stale() == []
    await asyncio.sleep(1)
    assert locks.release_stale() == [lock] and "c2" not in locks


async def test_timer_firing_with_stop_pending_stops_without_settling() -> None:
    # covers S9
    provider = ProbeProvider([(1, "a")], hang=True)
    locks = ChannelLockRegistry()
    turn = _turn(provider, locks=locks, idle_timeout_s=30)
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(10)
    lock = locks.get("c1")
    assert lock is not None
    lock.stop_requested = True  # requested, its kill not yet delivered when the timer fires
    result = await task
    assert result.status == "stopped_by_user" and result.notices == []
    assert [t["event"] for t in turn.transitions][-1] == "idle_timeout"
    assert turn.transitions[-1]["to"] == "Stopped"
    assert turn.transitions[-1]["t"] == pytest.approx(31.0)


async def test_stop_requested_before_the_turn_starts() -> None:
    # covers S16, D3
    locks = ChannelLockRegistry()
    turn = _turn(ProbeProvider([(1, "a")]), locks=locks)
    locks.request_stop("c1")
    result = await turn.run()
    assert result.status == "stopped_by_user" and result.passes == []
    assert turn.transitions == [{"t": 0.0, "event": "kill", "from": "Preparing",
                                 "to": "Stopped"}]


async def test_budgets_are_clamped_to_their_floors() -> None:
    # covers S4, S5
    config = TurnConfig(idle_timeout_s=2, first_token_timeout_s=5)
    assert config.idle_timeout_s == 10 and config.first_token_timeout_s == 10
    config = TurnConfig(idle_timeout_s=60, first_token_timeout_s=30)
    assert config.first_token_timeout_s == 60


async def test_unexpected_exception_ends_turn_error_and_cleans_up() -> None:
    # covers S15, S14
    scenario = parse_scenario({"passes": [[{"at": 1, "text": "x"},
                                            {"at": 2, "raise": "boom"}]]})
    played = await play(scenario)
    assert played.result.status == "error" and "boom" in (played.result.error or "")
    assert played.turn._passes.run is not None and played.turn._passes.run.abort.fired
    assert played.turn._passes.run.worker is not None and played.turn._passes.run.worker.done()


async def test_timeout_returns_settled_text_usage_and_metric() -> None:
    # covers S11, S13
    scenario = parse_scenario({"passes": [[{"at": 1, "text": "Hel"},
                                            {"at": 2, "stall": True, "settles_after": 1,
                                             "lands": "lo"}]]})
    played = await play(scenario)
    last = played.result.passes[-1]
    assert last.status == "timeout" and last.text == "Hello"
    assert played.result.metrics == [{"name": "stream_sdk_timeout", "phase": "idle"}]


async def test_chunks_after_the_first_bypass_the_machine() -> None:
    # covers S5 (only the first chunk is a transition)
    chunks = [(i * 0.01, "x") for i in range(1, 500)]
    turn = _turn(ProbeProvider(chunks), idle_timeout_s=10)
    result = await turn.run()
    assert result.text == "x" * 499
    assert [t["event"] for t in turn.transitions] == ["begin", "first_token", "completed"]


async def test_empty_provider_stream_is_empty_response() -> None:
    # covers S8
    class Silent:
        name = "silent"

        async def _gen(self) -> Any:
            if False:
                yield TextDelta("")

        def stream(self, request: PassRequest, abort: AbortSignal) -> Any:
            events: Any = self._gen()
            return events

    result = await _turn(Silent()).run()
    assert result.status == "empty_response"


async def test_scripted_provider_honours_abort_mid_wait() -> None:
    # covers S3 (the scripted adapter obeys the same contract)
    provider = ScriptedProvider([[Step.model_validate({"at": 50, "text": "late"})]])
    abort = AbortSignal()
    events: list[ProviderEvent] = []

    async def consume() -> None:
        async for event in provider.stream(PassRequest([], []), abort):
            events.append(event)

    task = asyncio.create_task(consume())
    await asyncio.sleep(1)
    abort.fire()
    await task
    assert events == [] and asyncio.get_running_loop().time() == pytest.approx(1.0)


async def test_chunk_after_the_abort_neither_rearms_nor_touches_the_lock() -> None:
    # covers S14, S5, S10: once the pass's abort has fired (here its idle timeout), a chunk
    # from an adapter that ignores the abort lands, but no longer re-arms a deadline or
    # touches the channel lock: the progress hook went with the abort
    seen: dict[str, Any] = {}

    class DeafProvider:
        name = "deaf"

        def stream(self, request: PassRequest, abort: AbortSignal) -> Any:
            return self._gen()

        async def _gen(self) -> Any:
            yield TextDelta("first")
            await asyncio.sleep(122)  # the idle timeout fires at 120 s
            yield TextDelta(" late")
            run = turn._passes.run  # resumed once the worker has handled the late chunk
            assert run is not None
            seen["touch"], seen["deadline"] = turn.lock.last_touch, run.deadline

    loop = asyncio.get_running_loop()
    turn = _turn(DeafProvider(), idle_timeout_s=120)
    start = loop.time()
    result = await turn.run()
    assert result.state == "TimedOut" and result.text == "first late"
    assert seen == {"touch": pytest.approx(start), "deadline": None}
    assert [line["t"] for line in turn.transitions][-2:] == [pytest.approx(120.0),
                                                             pytest.approx(122.0)]


class BufferingChannel(InMemoryChannel):
    """Like a Discord channel: text is buffered until the pass ends; one send may already be
    on the wire, landing `lands_after` seconds into the next flush."""

    def __init__(self, lands_after: float | None = None) -> None:
        super().__init__()
        self.pending: list[str] = []
        self.sent: list[str] = []
        self.lands_after = lands_after
        self.discarded: list[str] = []

    @property
    def delivered_text(self) -> str:
        return "".join(self.sent)

    async def deliver(self, text: str) -> None:
        self.pending.append(text)

    async def finish_pass(self) -> None:
        if self.lands_after is not None:
            await asyncio.sleep(self.lands_after)
            self.sent.append("[on the wire]")
            self.lands_after = None
        self.sent += self.pending
        self.pending.clear()

    def discard_unsent(self) -> None:
        self.discarded += self.pending
        self.pending.clear()


async def test_timed_out_pass_sends_what_it_had_within_the_settle_budget() -> None:
    # covers S10, S13, G1: after a timeout, the send already on the wire lands and the text
    # still buffered is sent, within the settle budget: all of it is in the delivered text a
    # fallback continues from
    channel = BufferingChannel(lands_after=3)
    turn = _turn(ProbeProvider([(1, "Half a sent")], hang=True), channel=channel, idle_timeout_s=10)
    result = await turn.run()
    assert [(line["event"], line["t"]) for line in turn.transitions][-2:] == [
        ("idle_timeout", pytest.approx(11.0)), ("settled", pytest.approx(14.0))]
    assert channel.discarded == [] and channel.pending == []
    assert result.delivered_text == "[on the wire]Half a sent"
    assert result.text == "Half a sent"


async def test_timed_out_pass_that_cannot_flush_in_time_drops_the_rest() -> None:
    # covers S10, G1: a send that outlives the settle wait is cut off there; what was not
    # sent by then is dropped, not left for a fallback to send with its own answer
    channel = BufferingChannel(lands_after=60)
    turn = _turn(ProbeProvider([(1, "Half a sent")], hang=True), channel=channel, idle_timeout_s=10)
    result = await turn.run()
    assert [(line["event"], line["t"]) for line in turn.transitions][-2:] == [
        ("idle_timeout", pytest.approx(11.0)), ("settle_timeout", pytest.approx(16.0))]
    assert channel.discarded == ["Half a sent"] and result.delivered_text == ""


async def test_pass_cut_short_by_a_kill_leaves_no_unsent_text() -> None:
    # covers S16, G1: a stopped turn's unsent text is not left for a later attempt to send
    channel = BufferingChannel()
    turn = _turn(ProbeProvider([(1, "never sent")], hang=True), channel=channel)
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(2)
    turn.request_stop()
    result = await task
    assert result.status == "stopped_by_user"
    assert channel.discarded == ["never sent"] and channel.sent == []


class SlowFlush(InMemoryChannel):
    """A channel whose end-of-pass flush takes `flush_s` (Discord waiting out 429s)."""

    def __init__(self, flush_s: float) -> None:
        super().__init__()
        self.flush_s = flush_s

    async def finish_pass(self) -> None:
        await asyncio.sleep(self.flush_s)
        await super().finish_pass()


async def test_model_that_finished_is_not_timed_out_while_the_channel_sends() -> None:
    # covers S5, S15, D2: the idle timer measures the model; once its stream has ended, a
    # flush longer than the idle budget is the channel's time, and the journal records it
    # so the turn replays exactly
    registry = ChannelLockRegistry()
    lock = registry.try_acquire("c1", "test")
    assert lock is not None
    config = TurnConfig(idle_timeout_s=120)
    recorder = JournalRecorder("slow-flush", config, ToolRegistry())
    class Answer:
        name = "answer"

        async def stream(self, request: PassRequest, abort: AbortSignal) -> Any:
            await asyncio.sleep(1)
            yield TextDelta("A short answer.")
            yield Finish("stop")

    turn = Turn(provider=Answer(), channel=SlowFlush(150),
                locks=registry, lock=lock, config=config, recorder=recorder)
    result = await turn.run()
    assert result.status == "completed" and result.notices == []
    assert [(line["event"], line["t"]) for line in turn.transitions][-1] == (
        "completed", pytest.approx(151.0))
    assert recorder.passes == [[{"at": 1.0, "text": "A short answer."},
                                {"at": 1.0, "finish": "stop"},
                                {"at": 1.0, "end": "completed", "flush_s": 150.0}]]
    document = json.loads(json.dumps(journal_document(recorder.scenario(), turn.transitions,
                                                      result.as_dict())))
    assert await replay_on_loop(document, "slow-flush") is None


async def test_flush_past_the_delivery_budget_is_a_failed_send() -> None:
    # covers S15, D2: a channel that never finishes sending does not hold the turn and its
    # lock: past the delivery budget the turn ends Done/error, the delivered text kept
    turn = _turn(ProbeProvider([(1, "Stuck.")]), channel=SlowFlush(1000), delivery_timeout_s=60)
    result = await turn.run()
    assert result.status == "error" and "within 60 s" in (result.error or "")
    assert turn.transitions[-1]["t"] == pytest.approx(61.0)
    assert result.text == "Stuck."


async def test_a_pass_that_begins_calls_the_provider_even_if_interrupted_at_once() -> None:
    # covers S3, S17: a follow-up already waiting when a pass begins ends it at that instant,
    # but only after the pass's worker has asked the model: one provider call per begin
    # (found by the soak when transitions stopped yielding to the loop)
    provider = ProbeProvider([(1, "late")])

    class FollowUpOnBegin:
        def on_transition(self, turn: Turn, t: float, event: str, source: str,
                          dest: str) -> None:
            if event == "begin":
                turn.notify_follow_up()

    turn = _turn(provider)
    turn.observer = FollowUpOnBegin()
    result = await turn.run()
    assert result.status == "follow_up_interrupt"
    assert [line["event"] for line in turn.transitions] == ["begin", "follow_up"]
    assert len(provider.requests) == len(result.passes) == 1
    assert provider.aborts[0].fired


async def test_the_stream_is_told_why_it_was_aborted() -> None:
    # covers S10, S14: the abort carries its reason to the adapter: `timeout` for a genuine
    # timeout, `pass ended` for a pass that ended on its own (the engine's clean-up abort)
    hung = ProbeProvider([(1, "a")], hang=True)
    assert (await _turn(hung, idle_timeout_s=20).run()).status == "timeout"
    assert hung.aborts[0].reason == "timeout"
    done = ProbeProvider([(1, "a")])
    assert (await _turn(done).run()).status == "completed"
    assert done.aborts[0].fired and done.aborts[0].reason == "pass ended"


async def test_a_late_event_of_an_earlier_pass_is_ignored() -> None:
    # covers S3, S14: pass 1 ended in a tool call and pass 2 streams; an end event that
    # still names pass 1 arriving now does not end pass 2 (nor the turn)
    async def weather(args: _City, ctx: ToolContext) -> ToolResult:
        return ToolResult.ok({"city": args.city})

    scenario = parse_scenario({"passes": [
        [{"at": 1, "tool_call": {"name": "weather", "args": {"city": "Oslo"}}}],
        [{"at": 1, "text": "Sunny "}, {"at": 6, "text": "in Oslo."}, {"at": 7, "end": "completed"}],
    ]})
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c1", "test")
    assert lock is not None
    turn = Turn(provider=ScriptedProvider(scenario.passes), channel=InMemoryChannel(),
                locks=locks, lock=lock,
                tools=ToolRegistry([FunctionTool("weather", "w", _City, weather)]))
    task = asyncio.create_task(turn.run())
    await asyncio.sleep(4)
    assert turn._passes.run is not None and turn._passes.run.no == 2
    turn.mailbox.post(StreamEnded(1, "completed"))
    turn.mailbox.post(FirstToken(1))
    result = await task
    assert result.status == "completed" and result.text == "Sunny in Oslo."
    assert [p.status for p in result.passes] == ["function_call", "completed"]


class _City(BaseModel):
    city: str


class _SlowNoticeChannel(InMemoryChannel):
    """Takes twenty seconds to post a notice, as a rate-limited channel may."""

    async def post_notice(self, notice: Notice) -> None:
        await asyncio.sleep(20)
        await super().post_notice(notice)


async def test_a_stream_still_running_when_its_pass_ends_is_stopped_at_once() -> None:
    # covers S14: an adapter that ignores the abort keeps its stream open past a timeout;
    # when the pass ends, its worker is cancelled there and then, so nothing it yields
    # later reaches the channel while the turn is still posting its timeout notice
    class DeafProvider:
        name = "deaf"

        def stream(self, request: PassRequest, abort: AbortSignal) -> Any:
            return self._gen()

        async def _gen(self) -> Any:
            await asyncio.sleep(1)
            yield TextDelta("a")
            await asyncio.sleep(30)
            while True:
                yield TextDelta("late")
                await asyncio.sleep(1)

    channel = _SlowNoticeChannel()
    result = await _turn(DeafProvider(), channel=channel, idle_timeout_s=20,
                         settle_timeout_s=0).run()
    assert result.status == "timeout"
    assert asyncio.get_running_loop().time() == pytest.approx(41.0)
    assert channel.delivered == ["a"] and len(channel.notices) == 1
