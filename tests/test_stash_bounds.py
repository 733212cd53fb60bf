"""What the stash keeps, for how long and within which budget (SPEC R3, R4, R5): its
defaults, the exact edges of its time-to-live and its byte budget, and how items are
measured against that budget."""

from __future__ import annotations

import asyncio

import pytest

from fsm.engine.stash import ContextStash, StashFull

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def test_by_default_an_item_lives_five_minutes_and_no_longer() -> None:
    # covers R3
    stash = ContextStash()
    kept, dropped = stash.put({"n": 1}), stash.put({"n": 2})
    await asyncio.sleep(299.9)
    assert stash.live_count() == 2
    assert stash.take(kept) == {"n": 1}
    await asyncio.sleep(0.1)
    assert stash.take(dropped) is None  # exactly five minutes: gone


async def test_an_item_is_dropped_when_its_time_is_up_even_if_never_taken() -> None:
    # covers R3: expiry frees the memory without anyone asking for the item
    stash = ContextStash(ttl_s=10)
    stash.put(b"x" * 100)
    await asyncio.sleep(9.5)
    assert stash.live_count() == 1 and stash.total_bytes == 100
    await asyncio.sleep(0.5)
    assert stash.live_count() == 0 and stash.total_bytes == 0


async def test_by_default_sixteen_items_are_kept_the_oldest_dropped_first() -> None:
    # covers R3
    stash = ContextStash()
    keys = [stash.put({"n": i}) for i in range(18)]
    assert len(stash) == 16
    assert stash.take(keys[0]) is None and stash.take(keys[1]) is None
    assert stash.take(keys[2]) == {"n": 2}


async def test_by_default_the_budget_is_64_mib() -> None:
    # covers R3
    stash = ContextStash()
    stash.put(b"x" * (64 * 1024 * 1024))
    assert stash.total_bytes == 64 * 1024 * 1024
    with pytest.raises(StashFull):
        stash.put(b"x" * (64 * 1024 * 1024 + 1))


async def test_items_that_exactly_fill_the_budget_are_all_kept() -> None:
    # covers R3
    stash = ContextStash(max_bytes=10)
    first, second = stash.put(b"a" * 4), stash.put(b"b" * 6)
    assert stash.total_bytes == 10 and len(stash) == 2
    assert stash.peek(first) == b"a" * 4
    third = stash.put(b"c")  # one byte over: the oldest goes
    assert stash.take(first) is None
    assert stash.total_bytes == 7 and stash.take(second) == b"b" * 6
    assert stash.take(third) == b"c" and stash.total_bytes == 0


async def test_an_item_as_large_as_the_whole_budget_is_stored() -> None:
    # covers R3: only a larger one is refused
    stash = ContextStash(max_bytes=8)
    stash.put(b"12345678")
    with pytest.raises(StashFull):
        stash.put(b"123456789")
    assert len(stash) == 1


async def test_items_are_measured_as_bytes_text_and_json() -> None:
    # covers R3: what counts against the byte budget
    sizes: list[tuple[object, int]] = [
        (b"abc", 3), (bytearray(b"ab"), 2), (memoryview(b"abcd"), 4),
        ("é", 2), ("abc", 3), (("ab", b"c"), 3), (["ab", b"c", "d"], 4),
        (7, 1), (None, 4), (2.5, 3),
    ]
    for item, size in sizes:
        stash = ContextStash()
        stash.put(item)
        assert stash.total_bytes == size, item
    stash = ContextStash()
    stash.put({"role": "user", "parts": [{"data": b"\x00" * 10}, "hi"]})
    assert stash.total_bytes == len("role") + len("user") + len("parts") + len("data") + 10 + 2


async def test_a_peek_leaves_the_item_and_a_take_frees_its_bytes() -> None:
    # covers R4, R5
    stash = ContextStash()
    key = stash.put(b"x" * 50)
    assert stash.peek(key) == b"x" * 50 and stash.total_bytes == 50
    assert stash.peek("unknown") is None and stash.take("unknown") is None
    assert stash.take(key) == b"x" * 50
    assert stash.total_bytes == 0 and stash.peek(key) is None


async def test_an_expired_take_frees_its_bytes_too() -> None:
    # covers R3, R5
    stash = ContextStash(ttl_s=1)
    key = stash.put(b"x" * 50)
    await asyncio.sleep(1)
    assert stash.take(key) is None and stash.total_bytes == 0


@pytest.mark.parametrize("bounds", [{"ttl_s": 0}, {"max_items": 0}, {"max_bytes": 0},
                                    {"ttl_s": -1}])
async def test_bounds_that_would_keep_nothing_are_refused(bounds: dict[str, float]) -> None:
    # covers R3 (bad configuration gets a clear error)
    with pytest.raises(ValueError, match="must be positive"):
        ContextStash(**bounds)  # type: ignore[arg-type]


async def test_the_smallest_bounds_keep_one_item() -> None:
    # covers R3
    stash = ContextStash(ttl_s=0.5, max_items=1, max_bytes=1)
    key = stash.put(b"x")
    assert stash.take(key) == b"x"


async def test_an_item_stashed_late_in_the_bots_life_lives_its_full_time() -> None:
    # covers R3: the time-to-live counts from when the item was stored
    stash = ContextStash(ttl_s=60)
    await asyncio.sleep(1000)
    taken, kept = stash.put({"n": 1}), stash.put({"n": 2})
    await asyncio.sleep(59)
    assert stash.live_count() == 2 and stash.take(taken) == {"n": 1}
    await asyncio.sleep(1)
    assert stash.live_count() == 0 and stash.take(kept) is None


async def test_text_with_a_lone_surrogate_is_measured_not_refused() -> None:
    # covers R3: a broken stream's half emoji in a stashed item still gets a size
    stash = ContextStash()
    stash.put({"text": "a\ud83d"})
    assert stash.total_bytes == len("text") + 1 + 3
