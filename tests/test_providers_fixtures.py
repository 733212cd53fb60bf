"""Every recorded stream in the shared fixtures, through the real client over loopback HTTP.

These run the same code as `python -m providers stream-file`, in virtual time (looptime), so
the fixtures' `:@pause` and `:@hang` directives cost no wall-clock time.
"""

from __future__ import annotations

import asyncio

import pytest

from providers.stream_file import stream_file

from providers_support import EXPECTED, FIXTURES, assert_matches_expected, fixture_cases


@pytest.mark.asyncio
@pytest.mark.looptime
@pytest.mark.parametrize(("kind", "case"), fixture_cases())
async def test_fixture_parses_to_expected(kind: str, case: str) -> None:
    """covers S3, S4, S5, T4: each recorded stream yields exactly its expected.json entry
    (text, tool calls, finish word, usage, in-band errors; stalls caught by the watchdog)."""
    script = (FIXTURES / kind / f"{case}.sse").read_bytes()
    result = await stream_file(kind, script, idle_timeout_s=30)  # type: ignore[arg-type]
    assert_matches_expected(result, EXPECTED[kind][case])


@pytest.mark.asyncio
@pytest.mark.looptime
@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_stall_is_caught_after_exactly_the_idle_timeout(kind: str) -> None:
    """covers S5: a stream that goes silent is aborted once the idle budget has passed
    since the last byte, not before and not much later."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    script = (FIXTURES / kind / "stall.sse").read_bytes()
    result = await stream_file(kind, script, idle_timeout_s=30)  # type: ignore[arg-type]
    assert result["error"]["kind"] == "stall_timeout"
    assert 30 <= loop.time() - start < 31


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_keepalive_comments_keep_a_paused_stream_alive() -> None:
    """covers S4, S5: comments are liveness: two 3 s pauses separated by a comment survive a
    3.5 s idle budget (no single silence exceeds it), but not a 2.5 s one."""
    script = (FIXTURES / "openai" / "keepalive_comments.sse").read_bytes()
    alive = await stream_file("openai", script, idle_timeout_s=3.5)
    assert alive["error"] is None
    assert alive["text"] == "Sure thing."
    stalled = await stream_file("openai", script, idle_timeout_s=2.5)
    assert stalled["error"]["kind"] == "stall_timeout"
    assert stalled["text"] == ""


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_anthropic_pings_keep_a_paused_stream_alive() -> None:
    """covers S4, S5: Anthropic pings between two 5 s pauses count as bytes for the watchdog."""
    script = (FIXTURES / "anthropic" / "keepalive_ping.sse").read_bytes()
    assert (await stream_file("anthropic", script, idle_timeout_s=6))["error"] is None
    stalled = await stream_file("anthropic", script, idle_timeout_s=4)
    assert stalled["error"]["kind"] == "stall_timeout"
