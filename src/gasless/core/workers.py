"""PollingLoop: a background loop that runs `tick()` every `poll_ms` (at once again when it says there is
more, or when `wake` is set) and stops cooperatively.

Stopping sets a flag the loop sees between ticks, so a tick is never cut in the middle of a database
statement (a query cancelled mid-flight can leave a pooled connection that the engine's dispose then waits
on); a tick still running after `grace_s` is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("gasless.core.workers")


RECANCEL_AFTER_S = 10.0  # longer than any worker's last write after its cancellation


async def cancel_and_wait(task: asyncio.Task[object], recancel_after_s: float = RECANCEL_AFTER_S) -> None:
    """Cancel `task` and wait until it ended; its own cancellation is expected, the caller's is passed on.

    Not `task.cancel()` then `with suppress(CancelledError): await task`: when the caller is itself being
    cancelled meanwhile (a host's stop, cancelling a loop that is stopping one of its workers), that swallows
    the caller's cancellation too, and a loop stopped by one `cancel()` runs on for good. Seen: the
    singleton runner, cancelled while it stopped a role's worker after its lock connection failed, went on
    retrying, and the host's stop waited for it for good.
    """
    current = asyncio.current_task()
    # Cancellations the caller had already received (a stop in a `finally` after a signal) are not news:
    # only one requested while it waits here is passed on.
    before = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        while not (await asyncio.wait([task], timeout=recancel_after_s))[0]:
            # A cancellation can be lost on its way (a library turning it into its own error, which the
            # worker then survives as a failure): the worker runs on and the stop would wait for good. Seen:
            # the mirror follower at a host's stop, its gateway reads timing out. Asked again, with its name.
            log.warning("worker outlived its cancellation: cancelled again", task=task.get_name())
            task.cancel()
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > before:
            raise


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """`event.wait()` for at most `timeout_s` seconds: True when the event was set.

    Every background loop waits through this, never through `asyncio.wait_for`: on Python 3.11, a
    cancellation that arrives once the inner wait is done but before `wait_for` resumes is swallowed (it
    returns the result instead of raising), so a loop stopped by one `cancel()` ran on for good and the host's
    stop hung (seen under the suite's load: a test's shutdown stuck for 10 minutes). `asyncio.timeout`
    counts cancellations and never loses one.
    """
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True


class PollingLoop:
    def __init__(
        self,
        name: str,
        tick: Callable[[], Awaitable[bool]],
        *,
        poll_ms: int,
        wake: asyncio.Event | None = None,
        grace_s: float = 5.0,
    ) -> None:
        self.name = name
        self.tick = tick
        self.poll_ms = poll_ms
        self.wake = wake if wake is not None else asyncio.Event()
        self.grace_s = grace_s
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self.wake.set()
        current = asyncio.current_task()
        before = current.cancelling() if current is not None else 0
        try:
            async with asyncio.timeout(self.grace_s):  # not wait_for: see wait_event
                await asyncio.shield(task)
        except TimeoutError:
            await cancel_and_wait(task)
        except asyncio.CancelledError:
            if current is not None and current.cancelling() > before:
                task.cancel()  # the caller is cancelled: the tick is cut short, the caller's stop goes on
                raise
            await cancel_and_wait(task)  # the loop's task was cancelled by someone else

    async def _run(self) -> None:
        while not self._stopping:
            more = False
            try:
                more = await self.tick()
                if self._failing:
                    log.info("worker recovered", worker=self.name)
                self._failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the loop outlives database and network failures
                if not self._failing:
                    log.warning("worker tick failed", worker=self.name, error=repr(exc))
                self._failing = True
            if more or self._stopping:
                continue
            self.wake.clear()
            await wait_event(self.wake, self.poll_ms / 1000)
