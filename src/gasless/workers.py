"""PollingLoop: a background loop that runs `tick()` every `poll_ms` (at once again when it says there is
more, or when `wake` is set) and stops cooperatively.

Stopping sets a flag the loop sees between ticks, so a tick is never cut in the middle of a database
statement (a query cancelled mid-flight can leave a pooled connection that the engine's dispose then waits
on); a tick still running after `grace_s` is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("gasless.workers")


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
        try:
            await asyncio.wait_for(asyncio.shield(task), self.grace_s)
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.poll_ms / 1000)
