"""A background loop stops on one cancel(), whenever it comes: `gasless.core.workers.wait_event`.

Every worker of a host (the tracker, the polling loops, the settlement and webhook workers, the singleton
runner) waits for its wake-up event between ticks, and a host's stop cancels each once. On Python 3.11,
`asyncio.wait_for(event.wait(), timeout)` loses a cancellation that comes within a few loop iterations of the
event being set: the loop then ran on for good and the host's stop hung (a test's shutdown stuck for 10
minutes under the suite's load, `gasless up --hosts 2` not stopping on SIGINT).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable

import pytest

from gasless.core.workers import PollingLoop, cancel_and_wait, wait_event

Waiter = Callable[[asyncio.Event], Awaitable[object]]


async def _through_wait_for(event: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), 10)


async def _through_wait_event(event: asyncio.Event) -> None:
    await wait_event(event, 10)


async def _survives_one_cancel(waiter: Waiter, iterations: int) -> bool:
    """A loop waiting through `waiter`: its event is set, and `iterations` later it is cancelled once.
    Whether it is still running afterwards."""
    event = asyncio.Event()

    async def loop() -> None:
        while True:
            await waiter(event)
            event.clear()

    task = asyncio.create_task(loop())
    for _ in range(2):
        await asyncio.sleep(0)  # the loop waits on its event
    event.set()
    for _ in range(iterations):
        await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    running = not task.done()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return running


@pytest.mark.parametrize("iterations", range(6))
async def test_one_cancel_stops_a_loop_whose_event_was_just_set(iterations: int) -> None:
    assert not await _survives_one_cancel(_through_wait_event, iterations)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="asyncio.wait_for keeps cancellations from 3.12 on")
async def test_wait_for_loses_that_cancel_on_this_python() -> None:
    """Why the service never waits through `asyncio.wait_for` in a loop: here it loses the stop."""
    lost = [await _survives_one_cancel(_through_wait_for, iterations) for iterations in range(6)]
    assert any(lost), lost


async def test_wait_event_says_whether_the_event_came() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, 10) is True


async def test_a_polling_loop_stops_while_woken() -> None:
    """A PollingLoop woken as it is stopped (its tick ran just now) stops, and ticks no more."""
    ticks: list[int] = []
    wake = asyncio.Event()

    async def tick() -> bool:
        ticks.append(1)
        return False

    loop = PollingLoop("test", tick, poll_ms=60_000, wake=wake)
    loop.start()
    while not ticks:
        await asyncio.sleep(0)
    wake.set()
    async with asyncio.timeout(10):
        await loop.stop()
    count = len(ticks)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(ticks) == count


async def test_cancel_and_wait_passes_on_the_callers_own_cancellation() -> None:
    """A caller cancelled while it waits for a worker it cancelled ends cancelled, never returns."""
    ending = asyncio.Event()

    async def slow_to_end() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await ending.wait()  # a worker finishing its last write before it ends
            raise

    worker = asyncio.create_task(slow_to_end())
    await asyncio.sleep(0)

    async def caller() -> str:
        await cancel_and_wait(worker)
        return "returned"

    stopping = asyncio.create_task(caller())
    for _ in range(3):
        await asyncio.sleep(0)  # the caller waits for the worker to end
    stopping.cancel()
    ending.set()
    await asyncio.wait({stopping}, timeout=5)
    assert stopping.cancelled()
    assert worker.cancelled()


async def test_cancel_and_wait_asks_again_a_worker_that_lost_its_cancellation() -> None:
    """A worker whose cancellation was turned into an error it survives (as a library's timeout can) runs
    on: the stop cancels it again instead of waiting for good."""
    lost: list[bool] = []

    async def loses_the_first_cancel() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(True)  # survived as a failure, the loop goes on

    worker = asyncio.create_task(loses_the_first_cancel())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(worker, recancel_after_s=0.05), timeout=5)
    assert lost == [True] and worker.cancelled()


async def test_a_stop_in_a_finally_after_a_cancel_runs_to_its_end() -> None:
    """`gasless up` after SIGINT: cancelled, it stops localnet in a `finally` (its round task, then the
    chain saved); that cancellation came before the stop and must not cut the stop short."""
    saved: list[bool] = []
    rounds = asyncio.create_task(asyncio.sleep(3600))

    async def up() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await cancel_and_wait(rounds)
            saved.append(True)

    task = asyncio.create_task(up())
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled() and saved == [True]


async def test_a_loop_cancelled_while_it_stops_a_polling_loop_ends() -> None:
    """The singleton runner's case: after a lost lock it stops its roles' workers, and the host's stop
    cancels it right then. `PollingLoop.stop` swallowed that cancellation, and the runner went on for good."""
    ticking = asyncio.Event()

    async def slow_tick() -> bool:
        ticking.set()
        await asyncio.sleep(3600)  # a tick that outlasts the stop's grace
        return False

    worker = PollingLoop("role", slow_tick, poll_ms=60_000, grace_s=3600)

    async def runner() -> None:
        while True:
            worker.start()
            await ticking.wait()
            ticking.clear()
            with contextlib.suppress(Exception):
                await worker.stop()  # cancelled here

    task = asyncio.create_task(runner())
    await ticking.wait()
    for _ in range(3):
        await asyncio.sleep(0)  # the runner waits in the worker's stop
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    running = not task.done()
    if running:  # clean up the loop that would not stop
        task.cancel()
    assert not running, "the runner went on after its cancellation"


def test_the_service_never_waits_through_wait_for() -> None:
    """Every wait with a timeout in the service goes through `wait_event` or `asyncio.timeout`."""
    from pathlib import Path

    import gasless

    root = Path(gasless.__file__).parent
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "asyncio.wait_for(" in line
    ]
    assert found == [], found
