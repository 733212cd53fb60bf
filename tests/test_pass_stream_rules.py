"""What one pass's stream delivers at its edges (SPEC S4, S5, S10, S13, S15, T8, D5): a
first token at the budget's last instant, text that lands after a timeout, a reply exactly
at the length bound, a held-back tag start at the stream's end, events after a provider
error, a channel that cuts the reply at its message bound, and what the journal keeps of a
stream that settles late. All in virtual time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from fsm.engine.channel import DeliveryCapReached
from fsm.engine.config import TurnConfig
from fsm.engine.events import FirstToken, StreamEnded, TurnEvent
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.mailbox import Mailbox
from fsm.engine.pass_runner import PassRunner
from fsm.engine.provider import (
    AbortSignal,
    Finish,
    PassRequest,
    ProviderError,
    ProviderEvent,
    TextDelta,
)
from fsm.engine.result import TurnResult
from fsm.engine.tools import ToolRegistry
from fsm.engine.turn import Turn
from fsm.journal import JournalRecorder, journal_document
from fsm.review.replay import replay_on_loop
from fsm.scenarios.scripted import InMemoryChannel

from engine_support import live_turn

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


class Script:
    """A provider that yields its events at the given seconds into the pass; `then_hang`
    waits for the abort after the last, `after_abort` yields more once it fired (a send
    that was on the wire landing, `settles_s` after the abort)."""

    name = "script"

    def __init__(self, events: list[tuple[float, ProviderEvent]], then_hang: bool = False,
                 after_abort: list[ProviderEvent] | None = None, settles_s: float = 0.0) -> None:
        self.events = events
        self.then_hang = then_hang
        self.after_abort = after_abort or []
        self.settles_s = settles_s

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        return self._play(abort)

    async def _play(self, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for at, event in self.events:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            yield event
        if self.then_hang:
            await abort.wait()
            await asyncio.sleep(self.settles_s)
            for event in self.after_abort:
                yield event


def _text(*chunks: tuple[float, str]) -> list[tuple[float, ProviderEvent]]:
    return [(at, TextDelta(text)) for at, text in chunks]


async def test_a_first_token_at_the_budgets_last_instant_counts() -> None:
    # covers S4, S5: the first-token budget includes its last instant; a token arriving
    # exactly as it runs out starts the reply (as the driver and the replay read it) and
    # arms the idle budget, so the answer completes
    channel = InMemoryChannel()
    provider = Script([*_text((30, "Just in time."), (35, " Done.")), (35, Finish("stop"))])
    result = await live_turn(provider, channel, first_token_timeout_s=30, idle_timeout_s=10).run()
    assert result.status == "completed" and result.notices == []
    assert channel.text == "Just in time. Done."


async def test_text_landing_after_a_timeout_keeps_its_details_block_out() -> None:
    # covers S10, S13, T8: a send that lands after the idle timeout is delivered, but a
    # `<details>` block in it is metadata, never prose, as it would be before the abort
    channel = InMemoryChannel()
    provider = Script(_text((1, "Hello ")), then_hang=True, settles_s=1,
                      after_abort=[TextDelta("there<details>for the bot</details>!")])
    result = await live_turn(provider, channel, idle_timeout_s=10).run()
    assert result.status == "timeout"
    assert channel.text == "Hello there!"
    assert "for the bot" not in channel.text


async def test_a_reply_exactly_at_the_length_bound_is_complete() -> None:
    # covers D5: the bound is what a reply may deliver; a reply of exactly that many
    # characters is delivered whole and completes, with no "reply too long" notice
    channel = InMemoryChannel()
    provider = Script([*_text((1, "abcd"), (2, "efgh")), (2, Finish("stop"))])
    result = await live_turn(provider, channel, max_delivered_chars=8).run()
    assert result.status == "completed" and result.notices == []
    assert channel.text == "abcdefgh"


async def test_a_held_back_tag_start_at_the_bound_is_not_sent() -> None:
    # covers D5, T8: a reply that filled its bound and ends on what might have become a tag
    # (`<`, held back until the next chunk says) does not send that character past the bound
    channel = InMemoryChannel()
    provider = Script([*_text((1, "abcd"), (2, "<")), (2, Finish("stop"))])
    await live_turn(provider, channel, max_delivered_chars=4).run()
    assert channel.text == "abcd"


async def test_a_reply_ending_on_a_held_back_tag_start_is_delivered_whole() -> None:
    # covers T8: a `<` at the very end is held back in case a `<details>` tag follows; when
    # the stream ends instead, it was prose and is delivered
    channel = InMemoryChannel()
    provider = Script([*_text((1, "HTML tags start with <")), (1, Finish("stop"))])
    result = await live_turn(provider, channel).run()
    assert result.status == "completed"
    assert channel.text == "HTML tags start with <"


async def test_a_tag_start_cut_off_by_a_timeout_is_not_sent() -> None:
    # covers S10, T8: the stream went quiet in the middle of an opening `<details` tag; after
    # the timeout the half tag is not flushed into the channel as prose
    channel = InMemoryChannel()
    provider = Script(_text((1, "Answer. <deta")), then_hang=True)
    result = await live_turn(provider, channel, idle_timeout_s=10).run()
    assert result.status == "timeout"
    assert channel.text == "Answer. "


async def test_nothing_after_a_provider_error_is_delivered() -> None:
    # covers S8, S15: an in-band provider error ends the pass: text the adapter still yields
    # after it is not delivered
    channel = InMemoryChannel()
    provider = Script([*_text((1, "Partial ")),
                       (2, ProviderError(kind="provider_stream_error", message="overloaded")),
                       (3, TextDelta("after the error"))])
    result = await live_turn(provider, channel).run()
    assert result.status == "error"
    assert channel.text == "Partial "


class CappedChannel(InMemoryChannel):
    """A channel that bounds the reply in messages (Discord's `max_delivered_messages`):
    it raises DeliveryCapReached once the bound is hit, on a send or at the pass's flush."""

    def __init__(self, on_flush: bool) -> None:
        super().__init__()
        self.on_flush = on_flush

    async def deliver(self, text: str) -> None:
        if not self.on_flush and self.delivered:
            raise DeliveryCapReached
        await super().deliver(text)

    async def finish_pass(self) -> None:
        if self.on_flush:
            raise DeliveryCapReached
        await super().finish_pass()


@pytest.mark.parametrize("on_flush", [False, True], ids=["on_a_send", "at_the_flush"])
async def test_a_channel_at_its_message_bound_ends_the_turn_delivery_cap(on_flush: bool) -> None:
    # covers D5: the channel's message bound ends the turn as the character bound does:
    # status delivery_cap and the "reply too long" notice, whether the bound is hit by a
    # send while streaming or by the pass's last flush
    channel = CappedChannel(on_flush)
    provider = Script([*_text((1, "one "), (2, "two ")), (2, Finish("stop"))])
    result = await live_turn(provider, channel).run()
    assert result.status == "delivery_cap"
    assert [notice.kind for notice in channel.notices] == ["delivery_cap"]
    assert channel.text.startswith("one ")


async def _journaled(provider: Script, **config: Any) -> tuple[Turn, TurnResult, JournalRecorder]:
    turn_config = TurnConfig(**config)
    recorder = JournalRecorder("late-settle", turn_config, ToolRegistry())
    turn = live_turn(provider, recorder=recorder, **config)
    return turn, await turn.run(), recorder


async def test_a_late_settling_stream_is_journaled_with_its_settle_time() -> None:
    # covers S10, S13: a stream that settles 2 s after its timeout, its last send landing
    # then, is journaled as a stall that settles after 2 s with that text, and the journal
    # replays to the same transitions
    provider = Script(_text((1, "Half ")), then_hang=True, settles_s=2,
                      after_abort=[TextDelta("landed.")])
    turn, result, recorder = await _journaled(provider, idle_timeout_s=10)
    assert result.status == "timeout"
    assert recorder.passes[0][-1] == {"at": 1.0, "stall": True, "settles_after": 2.0,
                                      "lands": "landed."}
    document = json.loads(json.dumps(journal_document(recorder.scenario(), turn.transitions,
                                                      result.as_dict())))
    assert await replay_on_loop(document, "late-settle") is None


async def test_a_chunk_past_the_deadline_before_the_driver_acts_is_no_first_token() -> None:
    # covers S4, S10: the first chunk arrives after the first-token deadline, before the
    # driver got round to it (busy): the deadline comes first, as in replay, so the chunk
    # lands (it is delivered) but does not start the reply or re-arm a timer
    loop = asyncio.get_running_loop()
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c1", "test")
    assert lock is not None
    mailbox: Mailbox[TurnEvent] = Mailbox()
    channel = InMemoryChannel()
    runner = PassRunner(provider=Script(_text((0, "late"))), channel=channel, locks=locks,
                        lock=lock, config=TurnConfig(first_token_timeout_s=30, idle_timeout_s=10),
                        mailbox=mailbox, turn_id="t",
                        spawn=lambda work, name: loop.create_task(work, name=name))
    run = runner.begin(PassRequest(context_items=[], function_history=[]), loop.time() - 31,
                       chars_left=100)
    assert run.worker is not None
    await run.worker
    posted = [mailbox.take_earliest() for _ in range(len(mailbox))]
    assert not any(isinstance(event, FirstToken) for event in posted)
    assert [event.outcome for event in posted if isinstance(event, StreamEnded)] == ["empty"]
    assert channel.text == "late"


class DeafAfterAbort:
    """Streams one chunk, then ignores its abort (it never ends its stream by itself)."""

    name = "deaf"

    async def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[
            ProviderEvent]:
        yield TextDelta("first")
        await asyncio.sleep(10_000)


class SlowFlush(InMemoryChannel):
    """A channel whose end-of-pass flush takes a long time (Discord waiting out 429s)."""

    async def finish_pass(self) -> None:
        await asyncio.sleep(1000)
        await super().finish_pass()


async def test_a_stream_the_engine_stops_ends_at_the_settle_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    # covers S10, S14: an adapter that ignores its abort is stopped by the engine when the
    # settle wait runs out: its worker ends there (it does not go on to flush into the
    # channel), so the turn ends and frees the channel at the settle timeout, with no
    # worker left behind and none abandoned for ignoring cancellation
    loop = asyncio.get_running_loop()
    start = loop.time()
    turn = live_turn(DeafAfterAbort(), SlowFlush(), idle_timeout_s=10, settle_timeout_s=5)
    result = await turn.run()
    assert result.state == "TimedOut"
    assert loop.time() - start == pytest.approx(15.0)
    assert "ignore cancellation" not in caplog.text


@pytest.mark.parametrize(("error", "recorded"), [
    (ProviderError(kind="blocked", message="safety filter", type="SAFETY"),
     {"kind": "blocked", "type": "SAFETY", "message": "safety filter"}),
    (ProviderError(kind="http", message="slow down", status=429, retryable=True,
                   retry_after_s=30.0),
     {"kind": "http", "type": None, "message": "slow down", "status": 429, "retryable": True,
      "retry_after_s": 30.0}),
], ids=["blocked", "rate_limited"])
async def test_a_provider_errors_record_says_what_the_provider_said(
        error: ProviderError, recorded: dict[str, Any]) -> None:
    # covers S8, S13, G4: the pass result (and so the journal) keeps the provider's error as
    # it came: no retry promised where the adapter made none, the wait it asked for kept
    result = await live_turn(Script([(1, error)])).run()
    assert result.status == "error"
    assert result.passes[-1].error == recorded


async def test_a_tag_held_back_across_chunks_hides_the_block_that_follows() -> None:
    # covers T8: a chunk ending in the start of a tag is held back, and the next chunk,
    # with no `<` of its own, is read with it: the block it opens is never delivered
    channel = InMemoryChannel()
    provider = Script([*_text((1, "Answer <det"), (2, "ails>hidden"), (3, "</details> done")),
                       (3, Finish("stop"))])
    result = await live_turn(provider, channel).run()
    assert channel.text == "Answer  done" and result.passes[-1].details == "hidden"
