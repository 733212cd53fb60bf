"""discord.py's rate-limit buckets are forgotten at an amortized cost (D2): the walk for idle
buckets runs when the table has doubled, not on every new bucket, so a bot with thousands of
channels does not pay for the whole table on each one (BENCHMARKS.md 7b). Costs are counted
(bucket checks), never timed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import discord
import discord.http
import pytest

from discord_io.rate_limits import SWEEP_FLOOR, amortize_bucket_sweep, guard_rate_limits
from turn_engine.bot import build_client

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many times any bucket was asked whether it is idle."""
    counted = [0]
    original = discord.http.Ratelimit.is_inactive

    def is_inactive(self: discord.http.Ratelimit) -> bool:
        counted[0] += 1
        return original(self)

    monkeypatch.setattr(discord.http.Ratelimit, "is_inactive", is_inactive)
    yield counted


def _new_buckets(client: discord.Client, prefix: str, count: int) -> None:
    for n in range(count):
        client.http.get_ratelimit(f"{prefix}{n}")


async def test_new_buckets_cost_linear_checks_in_all(checks: list[int]) -> None:
    # covers D2: 20,000 channels' first sends check buckets O(n) times in all; discord.py's
    # own sweep checks the whole table on each new bucket past 256 (~2e8 checks here)
    client = discord.Client(intents=discord.Intents.none())
    amortize_bucket_sweep(client)
    _new_buckets(client, "channel-", 20_000)
    assert len(client.http._buckets) == 20_000  # all in use: nothing forgotten
    assert checks[0] <= 2 * 20_000


async def test_the_unamortized_sweep_is_quadratic(checks: list[int]) -> None:
    # covers D2: what the fix removes, counted on discord.py as it ships
    client = discord.Client(intents=discord.Intents.none())
    _new_buckets(client, "channel-", 2_000)
    assert checks[0] >= (2_000 - SWEEP_FLOOR) * SWEEP_FLOOR


async def test_idle_buckets_are_still_forgotten_and_the_table_stays_bounded() -> None:
    # covers D2: buckets idle for 300 s go as before; the table never holds more than twice
    # the buckets in use (or the 256 discord.py keeps anyway)
    client = discord.Client(intents=discord.Intents.none())
    amortize_bucket_sweep(client)
    _new_buckets(client, "old-", 1_000)
    await asyncio.sleep(301)  # virtual time: every one of them is now idle
    largest = 0
    for n in range(3_000):
        client.http.get_ratelimit(f"new-{n}")
        largest = max(largest, len(client.http._buckets))
    table = client.http._buckets
    assert not any(key.startswith("old-") for key in table)
    assert len(table) == 3_000
    assert largest <= 2 * 3_000


async def test_the_bot_client_gets_both_guards_once() -> None:
    # covers D2: build_client applies them; applying again wraps nothing twice
    client = build_client()
    sweep = client.http._try_clear_expired_ratelimits
    request = client.http.request
    guard_rate_limits(client)
    assert client.http._try_clear_expired_ratelimits is sweep
    assert client.http.request is request
    assert getattr(sweep, "__qualname__", "").startswith("amortize_bucket_sweep")
