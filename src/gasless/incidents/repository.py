"""SQL of incidents and their append-only updates.

Concurrency, on SQLite (one writer) and PostgreSQL (READ COMMITTED) alike:
- an update is appended in the transaction that bumps `incidents.update_count`; the bump takes the row
  lock, so concurrent appends to one incident get consecutive `seq` values;
- at most one automatic incident per kind is open: its `open_key` is unique, so of two hosts raising at
  the same moment one inserts and the other's insert fails and touches the winner's incident instead;
- a status move is one conditional UPDATE (`WHERE status <> 'resolved'`), and so is the quiet-period
  resolution (`WHERE open_key = kind AND last_seen_at_ms < quiet`): exactly one writer can win either.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, case, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gasless.db import begin_write, incident_updates, incidents
from gasless.db.engine import run_read

ID_PREFIX = "inc_"
_RAISE_ATTEMPTS = 3


def new_incident_id() -> str:
    return ID_PREFIX + secrets.token_hex(10)


@dataclass(frozen=True)
class UpdateRow:
    seq: int
    status: str
    body: str
    at_ms: int


@dataclass(frozen=True)
class IncidentRow:
    id: str
    title: str
    status: str
    impact: str
    shard: int | None
    source: str
    kind: str | None
    open_key: str | None
    update_count: int
    occurrences: int
    last_seen_at_ms: int | None
    created_at_ms: int
    updated_at_ms: int
    resolved_at_ms: int | None
    updates: tuple[UpdateRow, ...] = ()


class NotOpen(Exception):
    """The incident exists but is resolved: it takes no more updates."""


@dataclass(frozen=True)
class Raised:
    """What `raise_or_touch` did: opened a new incident (`created`) or counted into the open one."""

    incident_id: str
    created: bool


def _incident(row: Any, updates: Sequence[UpdateRow] = ()) -> IncidentRow:
    return IncidentRow(**dict(row._mapping), updates=tuple(updates))


class IncidentRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    # Writes -------------------------------------------------------------------------------------------
    async def create(
        self,
        *,
        title: str,
        impact: str,
        shard: int | None,
        source: str,
        kind: str | None,
        status: str,
        body: str,
        now_ms: int,
        open_key: str | None = None,
        occurrences: int = 0,
        last_seen_at_ms: int | None = None,
    ) -> str:
        """A new incident with its first update; IntegrityError when `open_key` is taken."""
        incident_id = new_incident_id()
        async with begin_write(self.engine) as conn:
            await conn.execute(
                incidents.insert().values(
                    id=incident_id,
                    title=title,
                    status=status,
                    impact=impact,
                    shard=shard,
                    source=source,
                    kind=kind,
                    open_key=open_key,
                    update_count=1,
                    occurrences=occurrences,
                    last_seen_at_ms=last_seen_at_ms,
                    created_at_ms=now_ms,
                    updated_at_ms=now_ms,
                    resolved_at_ms=None,
                )
            )
            await self._append(conn, incident_id, 1, status, body, now_ms)
        return incident_id

    async def add_update(self, incident_id: str, *, status: str, body: str, now_ms: int) -> None:
        """Append an update moving an open incident to `status` (`resolved` closes it).

        KeyError: no such incident. NotOpen: it is resolved (resolved is final)."""
        resolving = status == "resolved"
        async with begin_write(self.engine) as conn:
            result = await conn.execute(
                update(incidents)
                .where(incidents.c.id == incident_id, incidents.c.status != "resolved")
                .values(
                    status=status,
                    update_count=incidents.c.update_count + 1,
                    updated_at_ms=now_ms,
                    resolved_at_ms=now_ms if resolving else None,
                    # an automatic incident frees its kind when resolved: the next occurrence is new
                    open_key=None if resolving else incidents.c.open_key,
                )
            )
            if result.rowcount != 1:
                exists = (
                    await conn.execute(select(incidents.c.id).where(incidents.c.id == incident_id))
                ).first()
                raise NotOpen(incident_id) if exists is not None else KeyError(incident_id)
            seq = await self._count(conn, incident_id)
            await self._append(conn, incident_id, seq, status, body, now_ms)

    async def touch_open(self, kind: str, *, occurrences: int, seen_at_ms: int) -> str | None:
        """Count `occurrences` more into the open automatic incident of `kind`; its id, or None."""
        async with begin_write(self.engine) as conn:
            result = await conn.execute(
                update(incidents)
                .where(incidents.c.open_key == kind)
                .values(
                    occurrences=incidents.c.occurrences + occurrences,
                    # the latest time any host saw it (hosts report in any order)
                    last_seen_at_ms=case(
                        (incidents.c.last_seen_at_ms > seen_at_ms, incidents.c.last_seen_at_ms),
                        else_=seen_at_ms,
                    ),
                )
            )
            if result.rowcount != 1:
                return None
            row = (await conn.execute(select(incidents.c.id).where(incidents.c.open_key == kind))).first()
        return None if row is None else str(row.id)

    async def raise_or_touch(
        self,
        kind: str,
        *,
        title: str,
        impact: str,
        body: str,
        occurrences: int,
        seen_at_ms: int,
        now_ms: int,
    ) -> Raised:
        """The open automatic incident of `kind` counts `occurrences` more, or a new one is opened."""
        for _ in range(_RAISE_ATTEMPTS):
            touched = await self.touch_open(kind, occurrences=occurrences, seen_at_ms=seen_at_ms)
            if touched is not None:
                return Raised(touched, created=False)
            try:
                created = await self.create(
                    title=title,
                    impact=impact,
                    shard=None,
                    source="automatic",
                    kind=kind,
                    status="investigating",
                    body=body,
                    now_ms=now_ms,
                    open_key=kind,
                    occurrences=occurrences,
                    last_seen_at_ms=seen_at_ms,
                )
                return Raised(created, created=True)
            except IntegrityError:
                continue  # another host opened it between our touch and our insert: touch theirs
        raise RuntimeError(f"could neither open nor touch the {kind} incident")

    async def resolve_quiet(
        self, kind: str, *, quiet_before_ms: int, now_ms: int, body: Callable[[IncidentRow], str]
    ) -> IncidentRow | None:
        """Resolve the open automatic incident of `kind` when nothing was seen since `quiet_before_ms`.

        One conditional UPDATE: when several hosts try at once, one wins and appends the update; the
        others change nothing. Returns the incident as it was before resolving when this call won."""
        async with begin_write(self.engine) as conn:
            before = (await conn.execute(select(incidents).where(incidents.c.open_key == kind))).first()
            if before is None:
                return None
            result = await conn.execute(
                update(incidents)
                .where(
                    incidents.c.id == before.id,
                    incidents.c.open_key == kind,
                    incidents.c.last_seen_at_ms < quiet_before_ms,
                )
                .values(
                    status="resolved",
                    open_key=None,
                    update_count=incidents.c.update_count + 1,
                    updated_at_ms=now_ms,
                    resolved_at_ms=now_ms,
                )
            )
            if result.rowcount != 1:
                return None
            # Read again after the row lock: a touch that committed meanwhile is in the count.
            current = (await conn.execute(select(incidents).where(incidents.c.id == before.id))).one()
            row = _incident(current)
            await self._append(conn, row.id, row.update_count, "resolved", body(row), now_ms)
        return row

    @staticmethod
    async def _count(conn: AsyncConnection, incident_id: str) -> int:
        return int(
            (
                await conn.execute(select(incidents.c.update_count).where(incidents.c.id == incident_id))
            ).scalar_one()
        )

    @staticmethod
    async def _append(
        conn: AsyncConnection, incident_id: str, seq: int, status: str, body: str, now_ms: int
    ) -> None:
        await conn.execute(
            incident_updates.insert().values(
                incident_id=incident_id, seq=seq, status=status, body=body, at_ms=now_ms
            )
        )

    # Reads --------------------------------------------------------------------------------------------
    async def open_automatic(self, kind: str) -> IncidentRow | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(incidents).where(incidents.c.open_key == kind))).first()
        return None if row is None else _incident(row)

    async def get(self, incident_id: str) -> IncidentRow | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(incidents).where(incidents.c.id == incident_id))).first()
            if row is None:
                return None
            updates = await self._updates(conn, [incident_id])
        return _incident(row, updates.get(incident_id, ()))

    async def page(
        self,
        *,
        shard: int | None,
        status: str | None,
        from_ms: int | None,
        to_ms: int | None,
        now_ms: int,
        after: tuple[int, str] | None,
        limit: int,
    ) -> list[IncidentRow]:
        """Incidents matching the filters, newest first (created, then id), after the `after` position.

        The window keeps incidents whose [created, resolved or now] overlaps [from, to]."""
        conditions: list[Any] = []
        if shard is not None:
            conditions.append(incidents.c.shard == shard)
        if status is not None:
            conditions.append(incidents.c.status == status)
        if to_ms is not None:
            conditions.append(incidents.c.created_at_ms <= to_ms)
        if from_ms is not None:
            ended_after = incidents.c.resolved_at_ms >= from_ms
            # An open incident lasts until now: it overlaps a window that starts before now.
            conditions.append(
                or_(ended_after, incidents.c.resolved_at_ms.is_(None)) if from_ms <= now_ms else ended_after
            )
        if after is not None:
            created, ident = after
            conditions.append(
                or_(
                    incidents.c.created_at_ms < created,
                    and_(incidents.c.created_at_ms == created, incidents.c.id < ident),
                )
            )
        query = (
            select(incidents)
            .where(*conditions)
            .order_by(incidents.c.created_at_ms.desc(), incidents.c.id.desc())
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
            updates = await self._updates(conn, [row.id for row in rows])
        return [_incident(row, updates.get(row.id, ())) for row in rows]

    async def changed_since(self, since_ms: int) -> list[IncidentRow]:
        """Incidents whose latest update is at or after `since_ms` (for publishing changes). Polled twice a
        second on every host: inline on the loop (gasless.db.engine.run_read), without aiosqlite's hops."""
        query = (
            select(incidents).where(incidents.c.updated_at_ms >= since_ms).order_by(incidents.c.updated_at_ms)
        )

        def read(conn: Connection) -> list[IncidentRow]:
            rows = conn.execute(query).all()
            updates = _group_updates(
                conn.execute(_updates_of([row.id for row in rows])).all() if rows else []
            )
            return [_incident(row, updates.get(row.id, ())) for row in rows]

        return await run_read(self.engine, read)

    @staticmethod
    async def _updates(conn: AsyncConnection, ids: list[str]) -> dict[str, list[UpdateRow]]:
        if not ids:
            return {}
        return _group_updates((await conn.execute(_updates_of(ids))).all())


def _updates_of(ids: list[str]) -> Any:
    return (
        select(incident_updates)
        .where(incident_updates.c.incident_id.in_(ids))
        .order_by(incident_updates.c.incident_id, incident_updates.c.seq)
    )


def _group_updates(rows: Sequence[Any]) -> dict[str, list[UpdateRow]]:
    out: dict[str, list[UpdateRow]] = {}
    for row in rows:
        out.setdefault(row.incident_id, []).append(UpdateRow(row.seq, row.status, row.body, row.at_ms))
    return out
