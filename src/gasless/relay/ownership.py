"""Which host follows which intent after the commit point.

Each host's tracker follows the intents it committed: it has them in memory from the commit on, so it
sees them executed and final without a database round trip, and no two hosts ask the gateways about the
same intent. An intent outlives its host, though: a host that dies leaves intents it committed, some
perhaps never acknowledged by any gateway. The singleton `intent-recovery` (run by one host at a time,
see gasless.db.leader) looks every few seconds for in-flight intents of hosts that no longer hold their
presence lock and hands them to its own tracker, which re-broadcasts and follows them to the end. When
the host comes back it recovers its own intents at start-up and the adopter lets them go.

Two trackers following one intent for a moment (a host returning, leadership moving) is harmless: every
state change is a guarded update, and a re-broadcast of the same signed bytes has the same hash.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db import intents
from gasless.db.engine import run_read_off_loop
from gasless.db.leader import SingletonRunner
from gasless.relay.jobs import Worker
from gasless.relay.repository import IN_FLIGHT, IntentRepository, Rec, recs

log = structlog.get_logger("gasless.relay.ownership")

ADOPT_EVERY_MS = 1_000
RECOVERY_ROLE = "intent-recovery"


class HostIntents(IntentRepository):
    """The intent repository as one host's tracker sees it: its own in-flight intents, plus those of the
    hosts it adopted (while it leads intent recovery). Every read the tracker uses to find intents
    (start-up recovery, its periodic resync) is scoped; reads by key and guarded updates are not."""

    def __init__(self, engine: AsyncEngine, host_id: str) -> None:
        super().__init__(engine)
        self.host_id = host_id
        self.adopted: frozenset[str] = frozenset()

    def _ours(self) -> Any:
        hosts = {self.host_id, *self.adopted}
        return intents.c.host_id.in_(sorted(hosts))

    async def in_flight(self, limit: int = 10_000) -> list[Rec]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(intents)
                .where(intents.c.state.in_(IN_FLIGHT), self._ours())
                .order_by(intents.c.pk)
                .limit(limit)
            )
            return recs(rows.all())

    # The two reads below run every second or two: off the loop (there can be many intents in flight)
    # and without aiosqlite's hops (gasless.db.engine.run_read_off_loop).
    async def in_flight_stamps(self) -> dict[int, int]:
        query = select(intents.c.pk, intents.c.seq).where(intents.c.state.in_(IN_FLIGHT), self._ours())
        rows = await run_read_off_loop(self.engine, lambda conn: conn.execute(query).all())
        return {int(pk): int(seq) for pk, seq in rows}

    async def unbroadcast(self) -> list[Rec]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(intents).where(intents.c.state == "COSIGNED", self._ours()).order_by(intents.c.pk)
            )
            return recs(rows.all())

    async def hosts_with_in_flight(self) -> set[str]:
        query = (
            select(intents.c.host_id)
            .where(intents.c.state.in_(IN_FLIGHT), intents.c.host_id != self.host_id)
            .distinct()
        )
        rows = await run_read_off_loop(self.engine, lambda conn: conn.execute(query).all())
        return {str(row[0]) for row in rows}


class OrphanAdopter(Worker):
    """Singleton `intent-recovery`: adopts the in-flight intents of hosts that are gone."""

    def __init__(self, repo: HostIntents, runner: SingletonRunner, *, every_ms: int = ADOPT_EVERY_MS) -> None:
        self.repo = repo
        self.runner = runner
        self.every_ms = every_ms

    async def stop(self) -> None:
        await super().stop()
        if self.repo.adopted:
            log.info("released adopted intents", hosts=sorted(self.repo.adopted))
        self.repo.adopted = frozenset()

    async def _loop(self) -> None:
        while True:
            try:
                await self.adopt_once()
            except Exception as exc:  # keep the last answer; the next look may succeed
                log.warning("orphan look failed", error=type(exc).__name__)
            await asyncio.sleep(self.every_ms / 1000)

    async def adopt_once(self) -> frozenset[str]:
        others = await self.repo.hosts_with_in_flight()
        gone = frozenset(others - await self.runner.present(others))
        if gone - self.repo.adopted:
            log.info("adopting in-flight intents of hosts that are gone", hosts=sorted(gone))
        elif self.repo.adopted - gone:
            log.info(
                "adopted intents settled or their hosts came back", hosts=sorted(self.repo.adopted - gone)
            )
        self.repo.adopted = gone
        return gone
