"""The model's `<details>` block and the thought log (T8, issue 15 item 8): the block is
taken out of the visible text however the stream splits it, kept on the pass result and
merged into the turn's final text; reasoning goes to the configured destination with its
owner. Virtual time."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm.engine.config import TurnConfig
from fsm.engine.details import DetailsFilter, details_suffix
from fsm.engine.generation import Attempt, run_generation_turn
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.provider import (
    AbortSignal,
    Finish,
    PassRequest,
    ProviderEvent,
    ReasoningDelta,
    TextDelta,
)
from fsm.engine.thoughts import publish_thoughts
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.runner import play
from fsm.scenarios.scripted import InMemoryChannel

virtual_time = pytest.mark.looptime

REPLY = ("Sure! <details><summary>For the bot</summary>mood: cheerful\nsprite: wave"
         "</details> Here is the answer, with a < sign and <b>bold</b>.")
VISIBLE = "Sure!  Here is the answer, with a < sign and <b>bold</b>."
BODY = "mood: cheerful\nsprite: wave"


def _filtered(chunks: list[str]) -> tuple[str, DetailsFilter]:
    details = DetailsFilter()
    out = "".join(details.feed(chunk) for chunk in chunks) + details.finish()
    return out, details


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=len(REPLY) - 1), max_size=12))
def test_a_details_block_split_anywhere_never_reaches_the_channel(cuts: list[int]) -> None:
    # covers T8: "even when split across chunks"
    points = sorted(set(cuts))
    chunks = [REPLY[a:b] for a, b in zip([0, *points], [*points, len(REPLY)], strict=True)]
    out, details = _filtered(chunks)
    assert out == VISIBLE and details.details == BODY


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab <>/detailsummry\n", max_size=60),
       st.lists(st.integers(min_value=1, max_value=59), max_size=8))
def test_text_without_a_whole_block_is_delivered_unchanged(text: str, cuts: list[int]) -> None:
    # covers T8 (nothing but a block is ever taken out; no text lost or doubled)
    if "<details" in text.lower():
        return
    points = sorted({c for c in cuts if c < len(text)})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    out, details = _filtered(chunks)
    assert out == text and details.details == ""


def test_an_unclosed_block_is_kept_not_delivered() -> None:
    # covers T8
    out, details = _filtered(["Hi <details open>", "<summary>x</summary>half a note"])
    assert out == "Hi " and details.details == "half a note"
    assert details_suffix(["a", "", "b"]) == "\n\n<details>\na\n\nb\n</details>"
    assert details_suffix(["", ""]) == ""


@pytest.mark.asyncio
@virtual_time
async def test_the_pass_result_keeps_the_block_and_the_turn_text_merges_it() -> None:
    # covers T8, S13 (the details that had arrived are on the pass result)
    played = await play(parse_scenario({
        "passes": [[{"at": 1, "text": "Checking. <details>looked up: weather"},
                    {"at": 1.5, "text": "</details>"},
                    {"at": 2, "tool_call": {"name": "weather"}}],
                   [{"at": 1, "text": "Snow. <details><summary>s</summary>mood: calm"},
                    {"at": 1.2, "text": "</details>"}, {"at": 2, "end": "completed"}]],
        "tools": {"weather": [{"success": True, "data": {"sky": "snow"}}]},
    }))
    result = played.result
    assert [p.details for p in result.passes] == ["looked up: weather", "mood: calm"]
    assert played.channel.text == "Checking. Snow. "
    assert result.text == "Snow. \n\n<details>\nlooked up: weather\n\nmood: calm\n</details>"
    assert played.provider.requests[1].function_history[0].pre_tool_text == "Checking. "
    assert result.as_dict()["pass_results"][0]["details"] == "looked up: weather"


class _Thinker:
    name = "thinker"

    def __init__(self) -> None:
        self.calls = 0

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        self.calls += 1
        return self._play()

    async def _play(self) -> AsyncIterator[ProviderEvent]:
        yield ReasoningDelta("The user wants a greeting.")
        yield TextDelta("Hello!")
        yield Finish("stop")


class _PostingChannel(InMemoryChannel):
    def __init__(self) -> None:
        super().__init__()
        self.thoughts: list[tuple[str, str, str]] = []

    async def post_thoughts(self, channel_id: str, owner: str, text: str) -> None:
        self.thoughts.append((channel_id, owner, text))


async def _reply(config: TurnConfig, channel: InMemoryChannel) -> str | None:
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "o")
    assert lock is not None
    result = await run_generation_turn([Attempt(_Thinker(), "a")], channel=channel, locks=locks,
                                       lock=lock, request=TurnRequest(owner="Tomori"),
                                       config=config)
    assert result.text == "Hello!" and channel.text == "Hello!"
    assert result.attempts[0].thoughts == {"owner": "Tomori",
                                           "log": ["The user wants a greeting."]}
    return result.thoughts_sent_to


@pytest.mark.asyncio
@virtual_time
async def test_the_thought_log_goes_where_the_operator_says(
        caplog: pytest.LogCaptureFixture) -> None:
    # covers T8 (the thought log with its owner; destination none, a log, a channel)
    caplog.set_level(logging.INFO, logger="fsm.thoughts")
    assert await _reply(TurnConfig(), InMemoryChannel()) is None
    assert not [r for r in caplog.records if r.name == "fsm.thoughts"]
    assert await _reply(TurnConfig(thought_log="log"), InMemoryChannel()) == "log"
    [logged] = [r for r in caplog.records if r.name == "fsm.thoughts"]
    assert "Tomori" in logged.getMessage() and "greeting" in logged.getMessage()
    channel = _PostingChannel()
    config = TurnConfig(thought_log="channel", thought_log_channel="42")
    assert await _reply(config, channel) == "channel"
    assert channel.thoughts == [("42", "Tomori", "The user wants a greeting.")]
    assert await publish_thoughts(config, "Tomori", ["  "], channel) is None


@pytest.mark.asyncio
@virtual_time
async def test_a_channel_that_cannot_post_thoughts_leaves_them_in_the_log(
        caplog: pytest.LogCaptureFixture) -> None:
    # covers T8 (nothing lost when the destination cannot take it)
    caplog.set_level(logging.INFO, logger="fsm.thoughts")
    config = TurnConfig(thought_log="channel", thought_log_channel="42")
    assert await _reply(config, InMemoryChannel()) == "log"
    assert any("greeting" in r.getMessage() for r in caplog.records if r.name == "fsm.thoughts")
    with pytest.raises(ValueError, match="thought_log_channel"):
        TurnConfig(thought_log="channel")
