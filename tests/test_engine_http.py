"""The engine over real HTTP: the provider clients streaming from a loopback server into a
turn and a generation turn (SPEC S3, S7, S10, G1, G2). Virtual time via looptime."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fsm.engine.config import TurnConfig
from fsm.engine.generation import Attempt, run_generation_turn
from fsm.engine.prefill import TurnRequest
from fsm.engine.turn import Turn
from fsm.scenarios.scripted import InMemoryChannel
from providers import build_provider
from providers.replay_server import Hang, Pause, ReplayServer, Send

from providers_support import channel_lock, config_for, serving, sse

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


def chunk(text: str) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


STOP = {"id": "c1", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}


async def test_kill_mid_stream_disconnects_the_server() -> None:
    # covers S7, S3: /kill aborts the HTTP request at once; the server sees the disconnect
    server = ReplayServer([Send(sse(chunk("Once upon"))), Pause(1.0),
                           Send(sse(chunk(" a time"))), Hang()])
    async with serving(server) as session:
        locks, lock = channel_lock()
        provider = build_provider(config_for(server, "openai"), session)
        turn = Turn(provider=provider, channel=InMemoryChannel(), locks=locks, lock=lock)
        task = asyncio.create_task(turn.run())
        await asyncio.sleep(10)
        assert turn.state == "Streaming"
        locks.request_stop("c")
        result = await task
        await asyncio.wait_for(server.client_gone.wait(), 5)
    assert result.status == "stopped_by_user" and result.text == "Once upon a time"
    assert server.disconnected == 1


async def test_stall_over_http_times_out_at_the_idle_budget() -> None:
    # covers S5, S10, S13 over a real connection
    server = ReplayServer([Send(sse(chunk("Working"))), Pause(2.0), Send(sse(chunk(" on it"))),
                           Hang()])
    async with serving(server) as session:
        locks, lock = channel_lock()
        provider = build_provider(config_for(server, "openai"), session)
        turn = Turn(provider=provider, channel=InMemoryChannel(), locks=locks, lock=lock,
                    config=TurnConfig(idle_timeout_s=30))
        result = await turn.run()
    assert result.status == "timeout" and result.text == "Working on it"
    assert [t["event"] for t in turn.transitions][-2:] == ["idle_timeout", "settled"]
    assert turn.transitions[-2]["t"] == pytest.approx(32.0, abs=0.01)
    assert server.disconnected == 1


async def test_429_then_fallback_completes() -> None:
    # covers G1: a rate-limited primary falls back to the next attempt
    limited = ReplayServer(b'{"error": {"message": "Rate limit reached", "type": "requests"}}',
                           status=429, content_type="application/json",
                           headers={"retry-after": "7"})
    healthy = ReplayServer([Send(sse(chunk("Hello"), STOP)), Send(b"data: [DONE]\n\n")])
    async with serving(limited, healthy) as session:
        locks, lock = channel_lock()
        channel = InMemoryChannel()
        result = await run_generation_turn(
            [Attempt(build_provider(config_for(limited, "openai"), session), "primary"),
             Attempt(build_provider(config_for(healthy, "openai"), session), "fallback")],
            channel=channel, locks=locks, lock=lock, request=TurnRequest())
    first = result.attempts[0]
    assert first.status == "error" and first.passes[0].error is not None
    assert first.passes[0].error["status"] == 429
    assert first.passes[0].error.get("retry_after_s") == 7
    assert result.status == "completed" and result.text == "Hello"
    assert channel.notices == []


async def test_all_attempts_failing_post_one_notice_for_the_last_failure() -> None:
    # covers G2, S12: the primary's deferred timeout notice is cleared by the fallback
    stalled = ReplayServer([Hang()])
    broken = ReplayServer(b'{"error": {"message": "upstream exploded", "type": "server_error"}}',
                          status=500, content_type="application/json")
    async with serving(stalled, broken) as session:
        locks, lock = channel_lock()
        channel = InMemoryChannel()
        result = await run_generation_turn(
            [Attempt(build_provider(config_for(stalled, "openai"), session), "primary"),
             Attempt(build_provider(config_for(broken, "openai"), session), "fallback")],
            channel=channel, locks=locks, lock=lock, request=TurnRequest(),
            config=TurnConfig(first_token_timeout_s=60, idle_timeout_s=30))
    assert [a.status for a in result.attempts] == ["timeout", "error"]
    assert [n.kind for n in channel.notices] == ["failed_unreachable"]
    assert stalled.disconnected == 1
