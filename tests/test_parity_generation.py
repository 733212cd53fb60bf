"""The generation turn's parity with TomoriBot (issue 15 items 3, 4, 5, 11 and 12): one
notice naming the failure's kind on the last attempt, none with user errors off, a dead
destination ends the chain, an optional "answered by the fallback" line, and deleting a
failed attempt's messages as a setting. Virtual time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from fsm.engine.channel import DestinationUnavailable
from fsm.engine.config import TurnConfig
from fsm.engine.failures import provider_failure
from fsm.engine.generation import Attempt, GenerationResult, run_generation_turn
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.provider import (
    AbortSignal,
    Finish,
    PassRequest,
    ProviderError,
    ProviderEvent,
    TextDelta,
)
from fsm.engine.stash import ContextStash
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider, ScriptedTools
from providers.config import ProviderConfig

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


class _Failing:
    """A provider whose every call streams `text` and then fails with `error`."""

    name = "failing"

    def __init__(self, error: ProviderError | None, text: str = "") -> None:
        self.error = error
        self.text = text
        self.requests: list[PassRequest] = []

    def stream(self, request: PassRequest, abort: AbortSignal) -> AsyncIterator[ProviderEvent]:
        self.requests.append(request)
        return self._play()

    async def _play(self) -> AsyncIterator[ProviderEvent]:
        if self.text:
            yield TextDelta(self.text)
        if self.error is not None:
            yield self.error
        else:
            yield Finish("stop")


def _error(status: int | None, type_: str | None = None, kind: str = "http") -> ProviderError:
    return ProviderError(kind=kind, message="failed", type=type_, status=status)  # type: ignore[arg-type]


async def _chain(providers: list[Any], channel: InMemoryChannel | None = None,
                 **config: Any) -> tuple[GenerationResult, InMemoryChannel]:
    channel = channel if channel is not None else InMemoryChannel()
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "o")
    assert lock is not None
    result = await run_generation_turn(
        [Attempt(p, f"m{n}") for n, p in enumerate(providers)], channel=channel, locks=locks,
        lock=lock, request=TurnRequest(), config=TurnConfig(**config))
    return result, channel


FAILURES = [
    (_error(400, "context_length_exceeded"), "failed_context_too_long"),
    (_error(None, "connection_error", "provider_stream_error"), "failed_unreachable"),
    (_error(503, "overloaded_error"), "failed_unreachable"),
    (_error(401, "authentication_error"), "failed_rejected_key"),
    (_error(429, "rate_limit_error"), "failed_rate_limited"),
    (_error(None, "SAFETY", "blocked"), "failed_blocked"),
    (_error(400, "invalid_request_error"), "failed_other"),
]


@pytest.mark.parametrize(("error", "notice"), FAILURES, ids=[n for _, n in FAILURES])
async def test_the_last_attempt_posts_one_notice_naming_the_failure(
        error: ProviderError, notice: str) -> None:
    # covers G2: every non-timeout failure was silent before
    result, channel = await _chain([_Failing(error), _Failing(error)])
    assert result.status == "error" and len(result.attempts) == 2
    assert [n.kind for n in channel.notices] == [notice] == result.notices
    assert result.failure_notice_posted == notice


async def test_an_empty_reply_says_so_once() -> None:
    # covers G2, S8
    result, channel = await _chain([ScriptedProvider(parse_scenario(
        {"passes": [[{"at": 1, "end": "empty"}]]}).passes)])
    assert result.status == "empty_response"
    assert [n.kind for n in channel.notices] == ["failed_empty_reply"]


async def test_the_last_attempts_failure_is_the_one_notice() -> None:
    # covers G2, S12: the primary timed out and the fallback was rate limited: the user is
    # told of the rate limit that ended the reply, not "the model went quiet" (TomoriBot
    # clears the deferred notice at each attempt)
    stall = ScriptedProvider(parse_scenario({"passes": [[{"at": 1, "stall": True}]]}).passes)
    result, channel = await _chain([stall, _Failing(_error(429))])
    assert result.attempts[0].deferred_notice == "timeout_first_token"
    assert [n.kind for n in channel.notices] == ["failed_rate_limited"] == result.notices
    assert result.deferred_notice_posted is None
    assert result.failure_notice_posted == "failed_rate_limited"


async def test_a_timeout_after_another_failure_posts_the_timeout_notice_once() -> None:
    # covers G2, S12: the last attempt timed out; its own notice is the one
    stall = ScriptedProvider(parse_scenario({"passes": [[{"at": 1, "stall": True}]]}).passes)
    result, channel = await _chain([_Failing(_error(429)), stall])
    assert [n.kind for n in channel.notices] == ["timeout_first_token"] == result.notices


async def test_with_user_errors_off_a_failure_posts_nothing() -> None:
    # covers G2 (no user-facing error notice of any kind)
    result, channel = await _chain([_Failing(_error(429)), _Failing(_error(401))],
                                   surface_user_errors=False)
    assert result.status == "error" and channel.notices == [] and result.notices == []


async def _tool_chain(raw: dict[str, Any], *fallbacks: Any,
                      **config: Any) -> tuple[GenerationResult, InMemoryChannel]:
    """A chain whose first attempt plays scenario `raw` with its scripted tools."""
    scenario = parse_scenario(raw)
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "o")
    assert lock is not None
    channel = InMemoryChannel()
    stash = ContextStash()
    tools = ScriptedTools(scenario.tools, stash, {})
    attempts = [Attempt(ScriptedProvider(scenario.passes), "a")]
    attempts += [Attempt(p, f"fb{n}") for n, p in enumerate(fallbacks)]
    result = await run_generation_turn(
        attempts, channel=channel, locks=locks, lock=lock, request=TurnRequest(),
        tools=tools.registry, stash=stash, config=TurnConfig(**config))
    return result, channel


async def test_a_tool_error_loop_notice_is_not_doubled() -> None:
    # covers G2, T6: the loop's own notice is the turn's one error notice
    result, channel = await _tool_chain(
        {"passes": [[{"at": 1, "tool_call": {"name": "t"}}]],
         "tools": {"t": [{"success": False, "error": "x"}]}}, max_consecutive_tool_errors=1)
    assert [n.kind for n in channel.notices] == ["tool_error_loop"] == result.notices


async def test_an_answer_by_the_fallback_can_be_announced() -> None:
    # covers G2 (optional, off by default), G1
    ok = _Failing(None, "Fine.")
    quiet, channel = await _chain([_Failing(_error(503)), ok])
    assert quiet.status == "completed" and channel.notices == []
    _, channel = await _chain([_Failing(_error(503)), _Failing(None, "Fine.")],
                                 announce_fallback=True)
    assert [n.kind for n in channel.notices] == ["answered_by_fallback"]
    _, channel = await _chain([_Failing(None, "Fine.")], announce_fallback=True)
    assert channel.notices == []


class _DeadChannel(InMemoryChannel):
    """Discord refuses every send here (the bot lost access to the channel)."""

    async def deliver(self, text: str) -> None:
        raise DestinationUnavailable("Missing Access")


async def test_a_dead_destination_ends_the_chain() -> None:
    # covers G3: no further model is spent on a channel that cannot receive the answer
    second = _Failing(None, "never")
    result, channel = await _chain([_Failing(None, "Hello"), second], _DeadChannel())
    assert len(result.attempts) == 1 and second.requests == []
    assert result.attempts[0].failure == "destination_unavailable"
    assert channel.notices == []  # there is nowhere to post one


class _CleaningChannel(InMemoryChannel):
    """Keeps messages like Discord does and can delete them (`DiscordChannel.cleanup`)."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[str] = []

    @property
    def delivered_text(self) -> str:
        return self.text

    async def cleanup(self) -> int:
        removed, self.deleted = len(self.delivered), self.deleted + self.delivered
        self.delivered = []
        return removed


async def test_superseded_partial_output_can_be_deleted_and_answered_in_full() -> None:
    # covers G1 (continuation stays the default), issue 15 item 12 (deletion as a setting)
    kept, channel = await _chain([_Failing(_error(503), "Half an ans"),
                                  fallback := _Failing(None, "wer.")])
    assert fallback.requests[0].prefill == "Half an ans" and channel.text == "Half an answer."
    assert kept.superseded_deleted == 0
    cleaning = _CleaningChannel()
    deleted, _ = await _chain([_Failing(_error(503), "Half an ans"),
                               full := _Failing(None, "A whole answer.")], cleaning,
                              superseded_output="delete")
    assert full.requests[0].prefill == "" and cleaning.deleted == ["Half an ans"]
    assert cleaning.text == "A whole answer." == deleted.delivered_text
    assert deleted.superseded_deleted == 1


async def test_failure_kinds_from_provider_errors() -> None:
    # covers G2 (the kinds in plain words come from the adapters' classification)
    assert provider_failure({"kind": "http", "status": 413}) == "context_too_long"
    assert provider_failure({"kind": "http", "status": 403}) == "rejected_key"
    assert provider_failure({"kind": "http", "type": "insufficient_quota"}) == "rate_limited"
    assert provider_failure({"kind": "stall_timeout"}) == "unreachable"
    assert provider_failure({"kind": "provider_stream_error", "status": True}) == "other"


async def test_every_provider_call_is_given_an_output_limit() -> None:
    # covers D5 (issue 12: no default output-token limit was sent): a model that never
    # stops is bounded at the source too; null leaves it to the provider
    assert ProviderConfig(kind="openai", model="m").max_output_tokens == 4096
    assert ProviderConfig(kind="gemini", model="m", max_output_tokens=None).max_output_tokens \
        is None


async def test_the_delivery_bound_counts_the_whole_reply_across_attempts() -> None:
    # covers D5, G1: a fallback continues within what the reply may still deliver
    result, channel = await _chain([_Failing(_error(503), "12345678"),
                                    _Failing(None, "abcdef")], max_delivered_chars=10)
    assert channel.text == "12345678ab" and result.status == "delivery_cap"
    assert [n.kind for n in channel.notices] == ["delivery_cap"]


async def test_a_token_capped_empty_pass_after_a_tool_falls_back() -> None:
    # covers T10, G1: the pre-tool line is not the answer; the fallback gives it
    result, _ = await _tool_chain({
        "passes": [[{"at": 1, "text": "Checking."}, {"at": 2, "tool_call": {"name": "t"}}],
                   [{"at": 1, "reasoning": "Hmm..."}, {"at": 2, "finish": "length"},
                    {"at": 2, "end": "empty"}]],
        "tools": {"t": [{"success": True, "data": {}}]}}, _Failing(None, " Snow."))
    assert [a.status for a in result.attempts] == ["empty_response", "completed"]
    assert result.delivered_text == "Checking. Snow."
