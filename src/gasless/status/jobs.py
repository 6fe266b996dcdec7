"""The feed publisher (singleton role `status-feed`): every 60 000 ms it writes `status.json` (the document
of `GET /v1/status`), `incidents.json` (the first page of `GET /v1/incidents`) and `telemetry.json`
(`latency30d` and `availabilityDaily90`) into the feed directory, each atomically (a temporary file renamed
over the old one), for the separate status site to serve."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import structlog

from gasless.core.workers import cancel_and_wait
from gasless.http.pages import PageParams, TimeWindow

log = structlog.get_logger("gasless.status")

FEED_PERIOD_MS = 60_000  # docs/status.md: the feeds' publication period
FEED_ROLE = "status-feed"
FEED_FILES = ("status.json", "incidents.json", "telemetry.json")


def write_atomically(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(document, separators=(",", ":")), encoding="utf-8")
    os.replace(temporary, path)


class FeedPublisher:
    def __init__(
        self, status: Any, incidents: Any, directory: Path, *, every_ms: int = FEED_PERIOD_MS
    ) -> None:
        self.status = status
        self.incidents = incidents
        self.directory = directory
        self.every_ms = every_ms
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="status-feed")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def publish(self) -> None:
        document = await self.status.status()
        page = await self.incidents.page(
            shard=None, status=None, window=TimeWindow(None, None), page=PageParams(limit=50, cursor=None)
        )
        write_atomically(self.directory / "status.json", document.model_dump(mode="json"))
        write_atomically(self.directory / "incidents.json", page.model_dump(mode="json"))
        write_atomically(
            self.directory / "telemetry.json", self.status.telemetry(document).model_dump(mode="json")
        )

    async def _loop(self) -> None:
        while True:
            try:
                await self.publish()
            except Exception as exc:  # the site keeps serving the last feeds, and says how old they are
                log.warning("status feed not published", error=type(exc).__name__)
            await asyncio.sleep(self.every_ms / 1000)
