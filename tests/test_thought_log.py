"""Where a reply's reasoning goes and how it reads there (SPEC T8, G1): the reasoning of every
model a reply tried, in order and a blank line apart, blank reasoning left out; the
thought-log channel is used only when `thought_log` is `channel`. Virtual time."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fsm.engine.config import TurnConfig
from fsm.engine.generation import Attempt, GenerationResult, run_generation_turn
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


class _ThoughtChannel(InMemoryChannel):
    """A channel that can post to the operator's thought-log channel."""

    def __init__(self) -> None:
        super().__init__()
        self.thoughts: list[tuple[str, str, str]] = []

    async def post_thoughts(self, channel_id: str, owner: str, text: str) -> None:
        self.thoughts.append((channel_id, owner, text))


def _model(*steps: dict[str, Any]) -> ScriptedProvider:
    return ScriptedProvider(parse_scenario({"passes": [list(steps)]}).passes)


async def _reply(channel: InMemoryChannel, config: TurnConfig,
                 *models: ScriptedProvider) -> GenerationResult:
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "o")
    assert lock is not None
    return await run_generation_turn(
        [Attempt(m, f"m{n}") for n, m in enumerate(models)], channel=channel, locks=locks,
        lock=lock, request=TurnRequest(owner="Tomori"), config=config)


async def test_a_fallback_replys_thought_log_holds_each_models_reasoning_a_blank_line_apart(
        ) -> None:
    # covers T8, G1: the primary reasoned and failed, the fallback reasoned and answered:
    # the one thought log posted reads both, in order, as separate paragraphs; a model
    # whose reasoning was only blank adds no empty paragraph
    channel = _ThoughtChannel()
    result = await _reply(
        channel, TurnConfig(thought_log="channel", thought_log_channel="42"),
        _model({"at": 1, "reasoning": "Look the weather up."},
               {"at": 2, "error": {"kind": "http", "status": 503}}),
        _model({"at": 1, "reasoning": "   "}, {"at": 2, "error": {"kind": "http", "status": 503}}),
        _model({"at": 1, "reasoning": "It is sunny."}, {"at": 2, "text": "Sunny."},
               {"at": 3, "end": "completed"}))
    assert channel.text == "Sunny." and result.thoughts_sent_to == "channel"
    assert channel.thoughts == [("42", "Tomori", "Look the weather up.\n\nIt is sunny.")]


async def test_a_thought_log_channel_left_configured_is_not_used_when_the_log_is_chosen(
        caplog: pytest.LogCaptureFixture) -> None:
    # covers T8: an operator who switched `thought_log` to `log` (or `none`) but left the
    # channel id set does not get reasoning posted in that channel
    caplog.set_level(logging.INFO, logger="fsm.thoughts")
    thinking = ({"at": 1, "reasoning": "The user wants a greeting."},
                {"at": 2, "text": "Hello!"}, {"at": 3, "end": "completed"})
    channel = _ThoughtChannel()
    logged = await _reply(channel, TurnConfig(thought_log="log", thought_log_channel="42"),
                          _model(*thinking))
    assert logged.thoughts_sent_to == "log" and channel.thoughts == []
    [record] = [r for r in caplog.records if r.name == "fsm.thoughts"]
    assert record.getMessage() == "thoughts of Tomori:\nThe user wants a greeting."
    caplog.clear()
    silent = await _reply(channel, TurnConfig(thought_log="none", thought_log_channel="42"),
                          _model(*thinking))
    assert silent.thoughts_sent_to is None and channel.thoughts == []
    assert [r for r in caplog.records if r.name == "fsm.thoughts"] == []
