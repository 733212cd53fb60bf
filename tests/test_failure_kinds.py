"""Which notice a failed reply posts, from the provider's own error (SPEC G2, G3): every
error type and HTTP status the adapters report is named in plain words (context too long,
unreachable, rejected key, rate limited, blocked), the turn's record says which kind ended
it, and the public `FailureKind` lists exactly the kinds a record can carry. Virtual time."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from fsm import FailureKind
from fsm.engine.config import TurnConfig
from fsm.engine.failures import NOTICE_BY_FAILURE, provider_failure
from fsm.engine.generation import Attempt, GenerationResult, run_generation_turn
from fsm.engine.locks import ChannelLockRegistry
from fsm.engine.prefill import TurnRequest
from fsm.scenarios.format import parse_scenario
from fsm.scenarios.scripted import InMemoryChannel, ScriptedProvider

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def _reply(steps: list[dict[str, Any]]) -> tuple[GenerationResult, InMemoryChannel]:
    """One model, one pass of `steps`: what the user is shown when it fails."""
    channel = InMemoryChannel()
    locks = ChannelLockRegistry()
    lock = locks.try_acquire("c", "o")
    assert lock is not None
    provider = ScriptedProvider(parse_scenario({"passes": [steps]}).passes)
    result = await run_generation_turn(
        [Attempt(provider, "m0")], channel=channel, locks=locks, lock=lock,
        request=TurnRequest(), config=TurnConfig())
    return result, channel


def _error(kind: str = "http", type_: str | None = None,
           status: int | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"kind": kind, "message": "failed"}
    if type_ is not None:
        spec["type"] = type_
    if status is not None:
        spec["status"] = status
    return spec


# (what the adapter reported, the notice the user is shown)
REPORTED = [
    # an authentication failure, by the provider's type alone or by its status alone
    (_error("provider_stream_error", "authentication_error"), "failed_rejected_key"),
    (_error("provider_stream_error", "permission_error"), "failed_rejected_key"),
    (_error("provider_stream_error", "invalid_api_key"), "failed_rejected_key"),
    (_error("provider_stream_error", "UNAUTHENTICATED"), "failed_rejected_key"),
    (_error("provider_stream_error", "PERMISSION_DENIED"), "failed_rejected_key"),
    (_error(status=401), "failed_rejected_key"),
    (_error(status=403), "failed_rejected_key"),
    # a rate limit or an exhausted quota
    (_error("provider_stream_error", "rate_limit_error"), "failed_rate_limited"),
    (_error("provider_stream_error", "rate_limit_exceeded"), "failed_rate_limited"),
    (_error("provider_stream_error", "insufficient_quota"), "failed_rate_limited"),
    (_error("provider_stream_error", "RESOURCE_EXHAUSTED"), "failed_rate_limited"),
    (_error("provider_stream_error", "tokens"), "failed_rate_limited"),
    (_error("provider_stream_error", "requests"), "failed_rate_limited"),
    (_error(status=402), "failed_rate_limited"),
    (_error(status=429), "failed_rate_limited"),
    # the provider could not be reached or broke off
    (_error("provider_stream_error", "connection_error"), "failed_unreachable"),
    (_error("provider_stream_error", "read_timeout"), "failed_unreachable"),
    (_error("provider_stream_error", "overloaded_error"), "failed_unreachable"),
    (_error("provider_stream_error", "UNAVAILABLE"), "failed_unreachable"),
    (_error("provider_stream_error", "incomplete_stream"), "failed_unreachable"),
    (_error("provider_stream_error", "not_a_stream"), "failed_unreachable"),
    (_error("provider_stream_error", "redirect"), "failed_unreachable"),
    (_error("provider_stream_error", "server_error"), "failed_unreachable"),
    (_error("provider_stream_error", "api_error"), "failed_unreachable"),
    (_error("stall_timeout"), "failed_unreachable"),
    (_error(status=500), "failed_unreachable"),
    (_error(status=502), "failed_unreachable"),
    # the provider refused the content: by the adapter's kind alone or the provider's type
    (_error("blocked"), "failed_blocked"),
    (_error("blocked", "other_finish_reason"), "failed_blocked"),
    (_error("provider_stream_error", "SAFETY"), "failed_blocked"),
    (_error("provider_stream_error", "content_filter"), "failed_blocked"),
    (_error("provider_stream_error", "blocked"), "failed_blocked"),
    (_error("provider_stream_error", "PROHIBITED_CONTENT"), "failed_blocked"),
    (_error("provider_stream_error", "RECITATION"), "failed_blocked"),
    # the request was too long for the model
    (_error(status=413), "failed_context_too_long"),
    (_error(type_="context_length_exceeded", status=400), "failed_context_too_long"),
    # anything else, a client error included, is named as "something went wrong"
    (_error(status=400), "failed_other"),
    (_error(status=499), "failed_other"),
    (_error("provider_stream_error", "invalid_request_error"), "failed_other"),
]


@pytest.mark.parametrize(("error", "notice"), REPORTED,
                         ids=[f"{e.get('kind')}-{e.get('type')}-{e.get('status')}"
                              for e, _ in REPORTED])
async def test_a_failed_reply_names_the_providers_error_in_plain_words(
        error: dict[str, Any], notice: str) -> None:
    # covers G2: the kind comes from the provider's error type or its HTTP status, and the
    # one notice the user sees names it
    result, channel = await _reply([{"at": 1, "error": error}])
    assert result.status == "error"
    assert [n.kind for n in channel.notices] == [notice] == result.notices
    assert result.failure_notice_posted == notice


async def test_a_model_that_crashes_is_recorded_and_shown_as_another_failure() -> None:
    # covers G2: a pass that raised instead of reporting an error has no kind of its own:
    # the record says `other` and the user is shown the generic notice
    result, channel = await _reply([{"at": 1, "raise": "boom"}])
    assert result.status == "error"
    assert result.attempts[-1].failure == "other"
    assert result.attempts[-1].as_dict()["failure"] == "other"
    assert [n.kind for n in channel.notices] == ["failed_other"]


async def test_a_status_that_is_not_an_http_code_is_not_read_as_one() -> None:
    # covers G2: an error read back from a journal written elsewhere may hold its status as
    # text or a flag; neither is taken for an HTTP status (nor crashes the classification)
    assert provider_failure({"kind": "http", "status": "503"}) == "other"
    assert provider_failure({"kind": "http", "status": "401"}) == "other"
    assert provider_failure({"kind": "http", "status": True}) == "other"
    assert provider_failure({}) == "other"


async def test_the_public_failure_kinds_are_the_ones_a_turn_can_record() -> None:
    # covers G2, G3: integrators match on `fsm.FailureKind`; it names exactly the kinds a
    # turn's record carries, and every one but a timeout (its own S12 notice) and a dead
    # destination (nowhere to post, G3) has the `failed_<kind>` notice the spec lists
    kinds = set(get_args(FailureKind))
    assert kinds == {"context_too_long", "unreachable", "rejected_key", "rate_limited",
                     "blocked", "empty_reply", "destination_unavailable", "timeout", "other"}
    assert set(NOTICE_BY_FAILURE) == kinds - {"timeout", "destination_unavailable"}
    assert all(notice == f"failed_{kind}" for kind, notice in NOTICE_BY_FAILURE.items())
