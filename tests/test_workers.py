"""The turn's task group (S14, S15, D4): every worker the driver starts belongs to it, none
runs once the group closes, a worker's failure reaches the driver instead of cancelling it,
and a collaborator ignoring cancellation is cut loose after its grace. Virtual time."""

from __future__ import annotations

import asyncio

import pytest

from fsm.engine.tasks import Workers

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]


async def test_closing_the_group_cancels_and_awaits_every_worker() -> None:
    # covers S14: the driver ends; nothing it started is still running
    crashes: list[BaseException] = []
    workers = Workers("w", grace_s=5, on_crash=crashes.append)
    started: list[asyncio.Task[None]] = []

    async def driver() -> None:
        started.append(workers.spawn(asyncio.sleep(100), "w-sleep"))
        started.append(workers.spawn(asyncio.sleep(0), "w-quick"))
        await asyncio.sleep(1)

    await workers.own(driver)
    assert all(task.done() for task in started) and crashes == []
    assert asyncio.get_running_loop().time() == pytest.approx(1.0)
    assert [t for t in asyncio.all_tasks() if t.get_name().startswith("w-")] == []


async def test_a_worker_failure_reaches_the_driver_not_the_group() -> None:
    # covers S15: an unexpected exception is the driver's to handle (a crash edge), and the
    # driver is not cancelled by it
    crashes: list[BaseException] = []
    workers = Workers("w", grace_s=5, on_crash=crashes.append)

    async def broken() -> None:
        raise ValueError("boom")

    async def driver() -> None:
        workers.spawn(broken(), "w-broken")
        await asyncio.sleep(2)

    await workers.own(driver)
    assert [type(e) for e in crashes] == [ValueError]
    assert asyncio.get_running_loop().time() == pytest.approx(2.0)


async def test_a_worker_ignoring_cancellation_is_cut_loose_after_the_grace() -> None:
    # covers D4, S14: the turn still ends (and its lock can be released) at the grace
    release = asyncio.Event()
    refused: list[int] = []

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                refused.append(1)

    workers = Workers("w", grace_s=5, on_crash=lambda _exc: None)

    async def driver() -> None:
        workers.spawn(stubborn(), "w-stubborn")
        await asyncio.sleep(1)

    await workers.own(driver)
    assert asyncio.get_running_loop().time() == pytest.approx(6.0) and refused == [1]
    release.set()
    await asyncio.sleep(0)


async def test_no_worker_starts_outside_a_running_turn() -> None:
    # covers S14: a worker with no group to own it is refused, not orphaned
    workers = Workers("w", grace_s=1, on_crash=lambda _exc: None)
    with pytest.raises(RuntimeError, match="no turn is running"):
        workers.spawn(asyncio.sleep(1), "w-late")


async def test_a_loop_shutting_down_mid_turn_ends_the_group_quietly() -> None:
    # covers S14: asyncio.run's shutdown cancels every task at once, the group's owner with
    # the driver's; the run ends cancelled, with no error of the group's own on the way out
    workers = Workers("w", grace_s=5, on_crash=lambda exc: None)
    loop = asyncio.get_running_loop()
    errors: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))

    async def driver() -> None:
        workers.spawn(asyncio.sleep(100), "w-sleep")
        await asyncio.sleep(100)

    run = asyncio.create_task(workers.own(driver))
    await asyncio.sleep(1)
    for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
        task.cancel()  # what asyncio.run does to the tasks left when its main returns
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert errors == []
    assert [t for t in asyncio.all_tasks() if t.get_name().startswith("w-")] == []
