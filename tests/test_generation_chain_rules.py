"""The generation chain at its edges (SPEC G1-G3, D5, T8): which turn id each attempt gets,
what a fallback is told about the calls already made, what the chain's result records,
what `superseded_output: continue` leaves alone, which notice stands when one could not be
posted, and the reply's length bound across attempts. Scripted providers, virtual time."""

from __future__ import annotations

from typing import Any

import pytest

from fsm.engine.channel import DestinationUnavailable, Notice
from fsm.engine.config import TurnConfig
from fsm.engine.generation import Attempt, GenerationResult, run_generation_turn
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.engine.stash import ContextStash
from fsm.engine.turn import Turn
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider, ScriptedTools

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

STALL = [{"at": 1, "text": "Partial answer"}, {"at": 2, "stall": True}]
ERROR = [{"at": 1, "error": "server_error"}]
ANSWER = [{"at": 1, "text": "Answer."}, {"at": 2, "end": "completed"}]


def _provider(*passes: list[dict[str, Any]]) -> ScriptedProvider:
    return ScriptedProvider(parse_scenario({"passes": list(passes)}).passes)


async def _run(attempts: list[Attempt], channel: InMemoryChannel | None = None,
               tools: dict[str, Any] | None = None, turns: list[Turn] | None = None,
               **config: Any) -> tuple[GenerationResult, InMemoryChannel]:
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "gen")
    assert lock is not None
    channel = channel if channel is not None else InMemoryChannel()
    stash = ContextStash()
    registry = ScriptedTools(parse_scenario({"tools": tools or {}}).tools, stash, {}).registry
    result = await run_generation_turn(
        attempts, channel=channel, locks=locks, lock=lock, request=TurnRequest(),
        config=TurnConfig(**config), tools=registry, stash=stash,
        on_attempt=turns.append if turns is not None else None)
    locks.release(lock)
    return result, channel


async def test_attempts_sharing_a_label_get_distinct_turn_ids() -> None:
    # covers G1: a turn id names an attempt's journal; two attempts of one label (one model
    # behind two endpoints) get ids of their own, the first the plain `owner-label`
    turns: list[Turn] = []
    result, _ = await _run([Attempt(_provider(ERROR), "m"), Attempt(_provider(ERROR), "m"),
                            Attempt(_provider(ERROR), "other"), Attempt(_provider(ANSWER), "m")],
                           turns=turns)
    assert result.status == "completed"
    assert [turn.turn_id for turn in turns] == ["gen-m", "gen-m#2", "gen-other", "gen-m#3"]


async def test_the_fallback_is_told_each_completed_call_apart() -> None:
    # covers G1: the request-only notice names every call the failed attempt completed,
    # one after the other, with its arguments
    primary = _provider([{"at": 1, "tool_calls": [
        {"name": "weather", "args": {"city": "Oslo"}},
        {"name": "weather", "args": {"city": "Rome"}}]}], ERROR)
    fallback = _provider(ANSWER)
    result, _ = await _run([Attempt(primary, "primary"), Attempt(fallback, "fb")],
                           tools={"weather": [{"success": True, "data": {"c": 1}}] * 2})
    assert result.status == "completed"
    notice = fallback.requests[0].request_notices[-1]
    assert ('weather({"city": "Oslo"}); weather({"city": "Rome"})' in notice)


async def test_the_chain_result_records_every_field_an_operator_reads() -> None:
    # covers G1, G2, T8: the chain's result as journals and `run-scenario` print it: the
    # final status and text, the delivered text across attempts, the notices, and each
    # attempt under its label
    result, _ = await _run([Attempt(_provider(STALL), "primary"),
                            Attempt(_provider([{"at": 1, "text": " and more."},
                                               {"at": 2, "end": "completed"}]), "fb")])
    record = result.as_dict()
    attempts = record.pop("attempts")
    assert record == {"status": "completed", "text": " and more.",
                      "delivered_text": "Partial answer and more.", "notices": [],
                      "deferred_notice_posted": None, "failure_notice_posted": None,
                      "superseded_deleted": 0, "thoughts_sent_to": None}
    assert [(a["label"], a["status"]) for a in attempts] == [("primary", "timeout"),
                                                             ("fb", "completed")]


class DeletingChannel(InMemoryChannel):
    """A channel that can delete what it delivered (Discord's, for `superseded_output`)."""

    def __init__(self) -> None:
        super().__init__()
        self.cleanups = 0

    async def cleanup(self) -> int:
        self.cleanups += 1
        removed = len(self.delivered)
        self.delivered.clear()
        return removed


async def test_superseded_output_continue_deletes_nothing() -> None:
    # covers G1: with the default `continue`, a channel that could delete the failed
    # attempt's messages keeps them, and the fallback continues from them
    channel = DeletingChannel()
    fallback = _provider([{"at": 1, "text": " and more."}, {"at": 2, "end": "completed"}])
    result, _ = await _run([Attempt(_provider(STALL), "primary"), Attempt(fallback, "fb")],
                           channel=channel)
    assert channel.cleanups == 0 and result.superseded_deleted == 0
    assert channel.text == "Partial answer and more."
    assert fallback.requests[0].prefill == "Partial answer"


async def test_superseded_output_delete_with_nothing_shown_deletes_nothing() -> None:
    # covers G1: `delete` removes what failed attempts showed; when they showed nothing
    # there is nothing to delete, and the channel is not asked to
    channel = DeletingChannel()
    result, _ = await _run([Attempt(_provider(ERROR), "primary"),
                            Attempt(_provider(ANSWER), "fb")],
                           channel=channel, superseded_output="delete")
    assert result.status == "completed" and channel.cleanups == 0


class FirstNoticeFails(InMemoryChannel):
    """A channel whose first notice cannot be posted (a transient Discord error)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    async def post_notice(self, notice: Notice) -> None:
        if not self.refused:
            self.refused += 1
            raise RuntimeError("503")
        await super().post_notice(notice)


async def test_a_timeout_notice_that_could_not_be_posted_is_not_replaced() -> None:
    # covers G2, S12: the last attempt timed out and its notice could not be posted; the
    # chain does not post another notice in its place (which would name the wrong reason)
    channel = FirstNoticeFails()
    result, _ = await _run([Attempt(_provider(STALL), "a"), Attempt(_provider(STALL), "b")],
                           channel=channel)
    assert result.status == "timeout" and channel.refused == 1
    assert channel.notices == [] and result.failure_notice_posted is None


class RefusingChannel(InMemoryChannel):
    """A destination that refuses every send (Discord 50013, missing permissions)."""

    async def deliver(self, text: str) -> None:
        raise DestinationUnavailable("50013")


async def test_a_refused_destination_is_logged_as_the_end_of_the_chain(
        caplog: pytest.LogCaptureFixture) -> None:
    # covers G3: the operator reads in the log why no fallback ran
    fallback = _provider(ANSWER)
    result, _ = await _run([Attempt(_provider(ANSWER), "primary"), Attempt(fallback, "fb")],
                           channel=RefusingChannel())
    assert len(result.attempts) == 1 and fallback.calls == 0
    assert "attempt primary: the channel refuses the send; no fallback" in caplog.text
    assert "attempt fb" not in caplog.text


async def test_a_reply_at_its_bound_gets_no_fallback_past_it() -> None:
    # covers D5, G1: the bound counts across attempts; a first attempt that delivered
    # exactly the bound and then went quiet leaves nothing for a fallback to deliver
    channel = InMemoryChannel()
    fallback = _provider([{"at": 1, "text": "more"}, {"at": 2, "end": "completed"}])
    result, _ = await _run([Attempt(_provider([{"at": 1, "text": "abcdefgh"},
                                               {"at": 2, "stall": True}]), "primary"),
                            Attempt(fallback, "fb")], channel=channel, max_delivered_chars=8)
    assert channel.text == "abcdefgh" and len(result.delivered_text) == 8
    assert fallback.calls == 0 and [n.kind for n in channel.notices] == ["timeout_idle"]
