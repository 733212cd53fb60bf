"""A pass's record of what arrived in pieces (SPEC S10, S13, T8): reasoning streamed in several
chunks is recorded whole, and text that lands in several sends after a timeout is part of the
timed-out pass's text as it settled. All in virtual time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from fsm.engine.config import TurnConfig
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.provider import AbortSignal, PassRequest, ProviderEvent, TextDelta
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play
from fsm.scenarios.scripted import InMemoryChannel

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def test_reasoning_in_several_chunks_is_recorded_whole() -> None:
    # covers T8: the pass's record keeps the model's reasoning as it was streamed, every
    # chunk in order and nothing between them
    played = await play(parse_scenario({"passes": [[
        {"at": 1, "reasoning": "Look "}, {"at": 1, "reasoning": "it up."},
        {"at": 2, "text": "Sunny."}, {"at": 3, "end": "completed"}]]}))
    (record,) = played.result.as_dict()["pass_results"]
    assert record["reasoning"] == "Look it up."
    assert record["text"] == "Sunny."


class LandsInTwoSends:
    """Streams one chunk, then goes quiet; once aborted, two sends that were already on the
    wire land before the stream settles."""

    name = "two-sends"

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        return self._play(abort)

    async def _play(self, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        yield TextDelta("Half ")
        await abort.wait()
        yield TextDelta("land")
        yield TextDelta("ed.")


async def test_text_landing_in_several_sends_after_a_timeout_is_the_passs_text() -> None:
    # covers S10, S13: the idle timeout aborts the stream; the two sends that land while it
    # settles are delivered and are the timed-out pass's text, joined as delivered
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c1", "test")
    assert lock is not None
    channel = InMemoryChannel()
    turn = Turn(provider=LandsInTwoSends(), channel=channel, locks=locks, lock=lock,
                config=TurnConfig(idle_timeout_s=10))
    result = await turn.run()
    assert result.status == "timeout"
    assert channel.text == "Half landed."
    (record,) = result.as_dict()["pass_results"]
    assert record["status"] == "timeout" and record["text"] == "Half landed."
