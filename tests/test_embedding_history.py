"""What an embedder's request becomes for the model (SPEC T7, S1, S2, A4): a history entry
given only its call and result is a successful call with no text before it, a bare request
sends no system prompt and no reply target, and the tail an adapter serializes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

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
from fsm.engine.turn import Turn
from fsm.scenarios.scripted import InMemoryChannel
from providers.anthropic import anthropic_messages
from providers.context import normalize_items


def test_a_bare_history_entry_is_a_successful_call_with_no_text_before_it() -> None:
    # covers T7: the defaults of a history entry are a call that succeeded and streamed no
    # text before it: Anthropic gets the tool use alone and a result that is no error
    entry = HistoryEntry(tool_name="weather", arguments={"city": "Oslo"},
                         result={"success": True, "data": {"sky": "sun"}}, call_id="call_1")
    request = PassRequest(context_items=[{"role": "user", "content": "weather?"}],
                          function_history=[entry])
    blocks = anthropic_messages(request, normalize_items(request.context_items))
    assert [m["role"] for m in blocks] == ["user", "assistant", "user"]
    assert [b["type"] for b in blocks[1]["content"]] == ["tool_use"]
    (result,) = blocks[2]["content"]
    assert result["type"] == "tool_result" and result["is_error"] is False


class _Probe:
    """Notes the request of each pass."""

    name = "probe"

    def __init__(self) -> None:
        self.requests: list[PassRequest] = []

    async def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[
            ProviderEvent]:
        self.requests.append(request)
        yield TextDelta("ok")
        yield Finish("stop")


async def _first_request(request: TurnRequest) -> PassRequest:
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c1", "test")
    assert lock is not None
    provider = _Probe()
    await Turn(provider=provider, channel=InMemoryChannel(), locks=locks, lock=lock,
               request=request).run()
    return provider.requests[0]


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_bare_request_sends_no_system_prompt_and_replies_to_nothing() -> None:
    # covers S2, A4: a request that sets no system prompt sends none of its own, and a turn
    # not queued (answering the newest message) sets no reply target even with a trigger
    sent = await _first_request(TurnRequest(trigger_message_id="m9"))
    assert sent.system_prompt == "" and sent.reply_to_message_id is None


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_the_tail_an_adapter_serializes_holds_each_item_whole() -> None:
    # covers S1: the request's tail, in order, as an adapter reads it: each tool-history
    # entry, then each request-only notice as a user item, then (with no history) the prefill
    entry = HistoryEntry(tool_name="weather", arguments={}, result={"success": True})
    with_history = await _first_request(TurnRequest(function_history=[entry],
                                                    request_notices=["[System: note]"]))
    assert with_history.tail == [
        {"kind": "tool_history", "entry": with_history.function_history[0]},
        {"kind": "notice", "role": "user", "content": "[System: note]"}]
    bare = await _first_request(TurnRequest(prefill="So far"))
    assert bare.tail == [{"kind": "prefill", "role": "assistant", "content": "So far"}]
