"""The channel lock's rules as the bot meets them (SPEC S5, S6, S7, S17, D4): when a
silent turn's channel is freed, what a running tool or look-up protects, how many
follow-ups may interrupt, what /kill reaches. The clock is a plain number moved by hand."""

from __future__ import annotations

import pytest

from fsm.engine.config import TurnConfig
from fsm.engine.locks import ChannelLock, ChannelLockRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _held(clock: Clock, **options: float) -> tuple[ChannelLockRegistry, ChannelLock]:
    locks = ChannelLockRegistry(clock=clock, **options)  # type: ignore[arg-type]
    lock = locks.try_acquire("c", "turn")
    assert lock is not None
    return locks, lock


def test_a_silent_turn_frees_its_channel_after_three_minutes_by_default() -> None:
    # covers S5 (default stale age 180 s, the age itself counts as stale), D4
    clock = Clock()
    locks, lock = _held(clock)
    clock.now += 179.9
    assert locks.release_stale() == [] and "c" in locks
    clock.now += 0.1
    assert locks.release_stale() == [lock] and "c" not in locks
    assert locks.try_acquire("c", "next") is not None  # the channel answers again


def test_progress_postpones_the_release() -> None:
    # covers S5: a touch restarts the three minutes
    clock = Clock()
    locks, lock = _held(clock)
    clock.now += 100
    lock.touch(clock.now)
    clock.now += 179
    assert not locks.is_stale(lock) and locks.release_stale() == []


def test_a_running_tool_is_never_released_as_stale_even_nested() -> None:
    # covers S6: while a tool (or a look-up inside it) runs, however long, the lock stays;
    # once both end, the channel is released after the stale age from then
    clock = Clock()
    locks, lock = _held(clock)
    with locks.watchdog(lock):
        with locks.watchdog(lock):
            clock.now += 1000
            assert locks.release_stale() == []
        clock.now += 1000
        assert locks.release_stale() == []
    clock.now += 179
    assert locks.release_stale() == []
    clock.now += 1
    assert locks.release_stale() == [lock]


def test_a_stale_release_tells_the_turn_why() -> None:
    # covers S6, S7: the sweeper stops the turn with the reason `stale_lock`
    clock = Clock()
    locks, lock = _held(clock)
    reasons: list[str] = []
    lock.turn_kill = reasons.append
    clock.now += 180
    locks.release_stale()
    assert reasons == ["stale_lock"] and lock.released


def test_a_stale_age_must_be_positive() -> None:
    # covers S5 (bad configuration is a clear error)
    for age in (0.0, -1.0):
        with pytest.raises(ValueError, match="stale_age_s must be positive"):
            ChannelLockRegistry(stale_age_s=age)
    assert ChannelLockRegistry(stale_age_s=0.5).stale_age_s == 0.5  # any positive age


def test_a_registry_without_options_applies_the_documented_defaults() -> None:
    # covers S5, S17: the terminal chat builds its registry with a stale age only; the
    # follow-up cap and the stale age it falls back on are TurnConfig's (3, 180 s)
    locks = ChannelLockRegistry()
    defaults = TurnConfig()
    assert locks.max_follow_up_interrupts == defaults.max_follow_up_interrupts == 3
    assert locks.stale_age_s == defaults.stale_lock_age_s == 180.0


def test_kill_reaches_the_pass_and_the_turn_once_each() -> None:
    # covers S7, S16: /kill fires the running pass's handle and the turn's, each with
    # "kill", and says a turn was running; the same handle for both is fired once
    locks, lock = _held(Clock())
    fired: list[str] = []
    locks.set_stream_kill(lock, lambda reason: fired.append(f"pass {reason}"))
    lock.turn_kill = lambda reason: fired.append(f"turn {reason}")
    assert locks.request_stop("c") is True
    assert fired == ["pass kill", "turn kill"] and lock.stop_requested
    one: list[str] = []
    other = ChannelLockRegistry(clock=Clock())
    shared = other.try_acquire("d", "turn")
    assert shared is not None
    shared.turn_kill = one.append
    other.set_stream_kill(shared, one.append)
    assert other.request_stop("d") and one == ["kill"]
    assert ChannelLockRegistry(clock=Clock()).request_stop("idle") is False


def test_a_pass_only_clears_its_own_kill_handle() -> None:
    # covers S7: exactly one kill handle per pass; a finished pass never removes the next's
    locks, lock = _held(Clock())
    fired: list[str] = []

    def first(reason: str) -> None:
        fired.append("first")

    def second(reason: str) -> None:
        fired.append("second")

    locks.set_stream_kill(lock, first)
    locks.set_stream_kill(lock, second)
    locks.clear_stream_kill(lock, first)  # the earlier pass's late clean-up
    locks.request_stop("c")
    assert fired == ["second"]
    locks.clear_stream_kill(lock)
    assert lock.stream_kill is None


def test_releasing_an_old_lock_leaves_the_channels_new_turn_alone() -> None:
    # covers D4: a turn that outlived its (stale-released) lock releases it late; the
    # channel's next turn keeps its own
    clock = Clock()
    locks, old = _held(clock)
    clock.now += 180
    locks.release_stale()
    new = locks.try_acquire("c", "next")
    assert new is not None
    assert locks.release(old) is False
    assert locks.get("c") is new and "c" in locks and len(locks) == 1
    assert locks.release(new) is True and "c" not in locks and locks.release(new) is False


def test_the_sweeper_may_judge_staleness_at_the_moment_it_names() -> None:
    # covers S5: a sweep given its own "now" releases what is stale then, by that reading
    clock = Clock()
    locks, lock = _held(clock)
    assert not locks.is_stale(lock, clock.now + 179)
    assert locks.is_stale(lock, clock.now + 180)
    assert locks.release_stale(clock.now + 179) == []
    assert locks.release_stale(clock.now + 180) == [lock]
