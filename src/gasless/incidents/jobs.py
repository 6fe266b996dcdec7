"""The incident watcher of one host: raises and resolves automatic incidents, publishes incident changes.

`note()` is the limiter's `on_platform_bind` hook: it runs on the relay hot path, synchronously, so it only
counts and notes the time. Every `poll_ms` (1 000 ms: at most one raise or touch per second per host) the
watcher's task
1. raises the open `platform_admission` incident, or touches it (counts the refusals, moves its
   `last_seen_at_ms`), when this host saw refusals since the previous tick;
2. resolves it once no host has seen a refusal for `quiet_ms` (one conditional UPDATE: whichever host
   gets there first wins, the others change nothing, so exactly one resolving update is appended);
3. publishes incidents changed in the last minute (by any host, or by an operator's command) to the account
   streams of this host, topic `incidents`, once per change (each host reads the database itself, so no
   cross-host fan-out is needed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog

from gasless.core.workers import cancel_and_wait
from gasless.http.pages import CursorCodec
from gasless.incidents.repository import IncidentRepository
from gasless.incidents.schemas import Incident
from gasless.incidents.service import PLATFORM_ADMISSION, AutomaticKind, IncidentService, to_incident

log = structlog.get_logger("gasless.incidents")

PUBLISH_LOOKBACK_MS = 60_000  # changes are looked for this far back (clock skew between hosts, slow commits)


class IncidentWatch:
    def __init__(
        self,
        service: IncidentService,
        *,
        quiet_ms: int,
        poll_ms: int = 1_000,
        kind: AutomaticKind = PLATFORM_ADMISSION,
        metrics: Any = None,
        publish: Callable[[Incident], None] | None = None,
    ) -> None:
        self.service = service
        self.kind = kind
        self.quiet_ms = quiet_ms
        self.poll_ms = poll_ms
        self.metrics = metrics
        self.publish = publish
        self._pending = 0
        self._last_seen_ms = 0
        self._published: dict[str, tuple[int, int]] | None = None  # id -> (updatedAtMs, updates)
        self._task: asyncio.Task[None] | None = None

    # The hot-path hook ----------------------------------------------------------------------------------
    def note(self) -> None:
        """One refusal by the platform admission budget (synchronous, no I/O)."""
        self._pending += 1
        self._last_seen_ms = self.service.now_ms()  # the service's clock, which judges the quiet too
        if self.metrics is not None:
            self.metrics.platform_refusals.inc()

    # Life cycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.publish is not None:
            # What exists at start-up is not news (a new stream starts with `reset` anyway); when the
            # database does not answer now, the first tick that reads it sets this baseline instead.
            with contextlib.suppress(Exception):
                self._published = await self._versions()
        self._task = asyncio.create_task(self._run(), name="incident-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_ms / 1000)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is away: try again next tick (refusals stay counted)
                log.warning("incident watch tick failed", error=type(exc).__name__, detail=str(exc)[:200])

    async def tick(self) -> None:
        await self._raise()
        resolved = await self.service.resolve_if_quiet(self.kind, quiet_ms=self.quiet_ms)
        if resolved is not None:
            log.info("automatic incident resolved", incident=resolved.id, kind=self.kind.kind)
            self._count("resolved")
        if self.publish is not None:
            await self._publish_changes()

    async def _raise(self) -> None:
        if not self._pending:
            return
        refused, seen_at_ms = self._pending, self._last_seen_ms
        self._pending = 0
        try:
            raised = await self.service.raise_automatic(self.kind, occurrences=refused, seen_at_ms=seen_at_ms)
        except BaseException:
            self._pending += refused  # counted again at the next tick
            raise
        if raised.created:
            log.warning("automatic incident raised", incident=raised.incident_id, kind=self.kind.kind)
            self._count("raised")

    def _count(self, change: str) -> None:
        if self.metrics is not None:
            self.metrics.automatic_incidents.labels(self.kind.kind, change).inc()

    async def _versions(self) -> dict[str, tuple[int, int]]:
        rows = await self.service.repo.changed_since(self.service.now_ms() - PUBLISH_LOOKBACK_MS)
        return {row.id: (row.updated_at_ms, row.update_count) for row in rows}

    async def _publish_changes(self) -> None:
        assert self.publish is not None
        rows = await self.service.repo.changed_since(self.service.now_ms() - PUBLISH_LOOKBACK_MS)
        versions = {row.id: (row.updated_at_ms, row.update_count) for row in rows}
        previous = self._published
        self._published = versions  # a row changed again re-enters the window with a new version
        if previous is None:
            return  # no baseline yet (the database did not answer at start-up)
        for row in rows:
            if previous.get(row.id) != versions[row.id]:
                try:
                    self.publish(to_incident(row))
                except Exception as exc:  # a stream must never stop the watcher
                    log.warning("incident stream event failed", error=type(exc).__name__)


def build_incidents(
    engine: Any, cursors: CursorCodec, settings: Any, metrics: Any, streams: Any
) -> tuple[IncidentService, IncidentWatch]:
    """The host's incident service and watcher (streams: the host's StreamService, or None)."""
    service = IncidentService(IncidentRepository(engine), cursors)
    publish: Callable[[Incident], None] | None = None
    if streams is not None:
        hub = streams.hub

        def publish(incident: Incident) -> None:
            hub.deliver_everywhere("incidents", incident.id, incident.model_dump(mode="json"))

    watch = IncidentWatch(
        service,
        quiet_ms=settings.incident_quiet_ms,
        poll_ms=settings.incident_poll_ms,
        metrics=metrics,
        publish=publish,
    )
    return service, watch
