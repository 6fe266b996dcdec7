"""SQL of webhooks and of their outbox / delivery log.

Delivery rows are claimed for one attempt at a time: on PostgreSQL by `FOR UPDATE SKIP LOCKED` inside the
claiming UPDATE (hosts never wait on each other's rows), on SQLite by a guarded UPDATE under its single
writer. A claim is a lease (`claimed_until_ms`); a host that dies mid-attempt leaves a lease that expires,
and the row is claimed again as a new attempt (the event id stays the same, the attempt number grows).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, text, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db import begin_write, dialect_insert
from gasless.db.engine import run_read
from gasless.db.tables import webhook_deliveries, webhooks


@dataclass(frozen=True)
class WebhookRow:
    webhook_id: str
    account: str
    env: str
    url: str
    event_types: list[str]
    enabled: bool
    description: str | None
    secret_sealed: str
    previous_secret_sealed: str | None
    previous_expires_at_ms: int | None
    created_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True)
class DeliveryRow:
    delivery_id: str
    webhook_id: str
    account: str
    event_id: str
    event_type: str
    payload: dict[str, Any]
    status: str
    attempts: int
    max_attempts: int
    next_attempt_at_ms: int
    claimed_by: str | None
    claimed_until_ms: int | None
    last_status_code: int | None
    last_latency_ms: int | None
    last_error: str | None
    created_at_ms: int
    updated_at_ms: int
    completed_at_ms: int | None


class WebhooksFull(Exception):
    """The account already has its maximum number of webhooks."""


def _account_lock(account: str, env: str) -> int:
    digest = hashlib.sha256(f"gasless.webhooks|{account}|{env}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _webhook(row: Row[Any] | None) -> WebhookRow | None:
    return None if row is None else WebhookRow(**row._mapping)


def _delivery(row: Row[Any] | None) -> DeliveryRow | None:
    return None if row is None else DeliveryRow(**row._mapping)


class WebhookRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    # Webhooks ---------------------------------------------------------------------------------------
    async def insert(self, values: dict[str, Any], *, max_per_account: int) -> WebhookRow:
        async with begin_write(self.engine) as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"),
                    {"key": _account_lock(values["account"], values["env"])},
                )
            count = (
                await conn.execute(
                    select(func.count())
                    .select_from(webhooks)
                    .where(webhooks.c.account == values["account"], webhooks.c.env == values["env"])
                )
            ).scalar_one()
            if count >= max_per_account:
                raise WebhooksFull
            await conn.execute(webhooks.insert().values(**values))
        return WebhookRow(**values)

    async def get(self, webhook_id: str, account: str, env: str) -> WebhookRow | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(webhooks).where(*self._owned(webhook_id, account, env)))).first()
        return _webhook(row)

    async def by_id(self, webhook_id: str) -> WebhookRow | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(webhooks).where(webhooks.c.webhook_id == webhook_id))).first()
        return _webhook(row)

    async def accounts_with_webhooks(self, env: str) -> list[str]:
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(select(webhooks.c.account).where(webhooks.c.env == env).distinct())
            ).all()
        return [str(row[0]) for row in rows]

    async def list_for(self, account: str, env: str) -> list[WebhookRow]:
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(webhooks)
                    .where(webhooks.c.account == account, webhooks.c.env == env)
                    .order_by(webhooks.c.created_at_ms, webhooks.c.webhook_id)
                )
            ).all()
        return [WebhookRow(**row._mapping) for row in rows]

    async def update(
        self, webhook_id: str, account: str, env: str, changes: dict[str, Any]
    ) -> WebhookRow | None:
        async with begin_write(self.engine) as conn:
            result = await conn.execute(
                update(webhooks).where(*self._owned(webhook_id, account, env)).values(**changes)
            )
            if result.rowcount != 1:
                return None
            row = (await conn.execute(select(webhooks).where(webhooks.c.webhook_id == webhook_id))).first()
        return _webhook(row)

    async def delete(self, webhook_id: str, account: str, env: str) -> bool:
        """Delete the webhook and its delivery log (pending deliveries are dropped with it)."""
        async with begin_write(self.engine) as conn:
            result = await conn.execute(delete(webhooks).where(*self._owned(webhook_id, account, env)))
            if result.rowcount != 1:
                return False
            await conn.execute(
                delete(webhook_deliveries).where(webhook_deliveries.c.webhook_id == webhook_id)
            )
        return True

    async def subscribed(self, account: str, env: str, event_type: str) -> list[WebhookRow]:
        """The account's enabled webhooks subscribed to `event_type`."""
        return [
            row for row in await self.list_for(account, env) if row.enabled and event_type in row.event_types
        ]

    async def subscribed_anywhere(self, env: str, event_type: str) -> list[WebhookRow]:
        """Every account's enabled webhooks subscribed to `event_type` (global notices)."""
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(webhooks).where(webhooks.c.env == env, webhooks.c.enabled.is_(True))
                )
            ).all()
        return [WebhookRow(**row._mapping) for row in rows if event_type in row.event_types]

    @staticmethod
    def _owned(webhook_id: str, account: str, env: str) -> tuple[Any, ...]:
        return (webhooks.c.webhook_id == webhook_id, webhooks.c.account == account, webhooks.c.env == env)

    # Outbox -----------------------------------------------------------------------------------------
    async def enqueue(self, rows: list[dict[str, Any]]) -> int:
        """Insert delivery rows; a (webhook, event) already queued is skipped. Returns how many were new."""
        if not rows:
            return 0
        async with begin_write(self.engine) as conn:
            insert = dialect_insert(conn)
            result = await conn.execute(
                insert(webhook_deliveries)
                .values(rows)
                .on_conflict_do_nothing(index_elements=["webhook_id", "event_id"])
            )
        return int(result.rowcount or 0)

    async def claim_due(self, *, worker: str, now_ms: int, lease_ms: int, limit: int) -> list[DeliveryRow]:
        """Claim up to `limit` due deliveries for one attempt each."""
        # Every host polls this each second, and nearly always nothing is due: a read says so without a
        # write transaction (on SQLite one would take the one writer from the commit points every poll).
        probe = select(webhook_deliveries.c.delivery_id).where(*self._claimable(now_ms)).limit(1)
        if await run_read(self.engine, lambda conn: conn.execute(probe).first()) is None:
            return []
        async with begin_write(self.engine) as conn:
            due = (
                select(webhook_deliveries.c.delivery_id)
                .where(*self._claimable(now_ms))
                .order_by(webhook_deliveries.c.next_attempt_at_ms)
                .limit(limit)
            )
            if conn.dialect.name == "postgresql":
                due = due.with_for_update(skip_locked=True)
            ids = list((await conn.execute(due)).scalars())
            if not ids:
                return []
            result = await conn.execute(
                update(webhook_deliveries)
                .where(webhook_deliveries.c.delivery_id.in_(ids), *self._claimable(now_ms))
                .values(**self._claim_values(worker, now_ms, lease_ms))
                .returning(*webhook_deliveries.c)
            )
            return [DeliveryRow(**row._mapping) for row in result.all()]

    @staticmethod
    def _claimable(now_ms: int) -> tuple[Any, ...]:
        c = webhook_deliveries.c
        return (
            c.status == "pending",
            c.next_attempt_at_ms <= now_ms,
            or_(c.claimed_until_ms.is_(None), c.claimed_until_ms < now_ms),
        )

    @staticmethod
    def _claim_values(worker: str, now_ms: int, lease_ms: int) -> dict[str, Any]:
        c = webhook_deliveries.c
        return {
            "attempts": c.attempts + 1,
            "claimed_by": worker,
            "claimed_until_ms": now_ms + lease_ms,
            "updated_at_ms": now_ms,
        }

    async def finish_attempt(
        self,
        row: DeliveryRow,
        *,
        worker: str,
        now_ms: int,
        status: str,
        next_attempt_at_ms: int | None,
        status_code: int | None,
        latency_ms: int | None,
        error: str | None,
    ) -> DeliveryRow | None:
        """Record the attempt's outcome, only if this worker still holds that very attempt."""
        c = webhook_deliveries.c
        async with begin_write(self.engine) as conn:
            result = await conn.execute(
                update(webhook_deliveries)
                .where(
                    and_(
                        c.delivery_id == row.delivery_id,
                        c.attempts == row.attempts,
                        c.claimed_by == worker,
                        c.status == "pending",
                    )
                )
                .values(
                    status=status,
                    next_attempt_at_ms=next_attempt_at_ms if next_attempt_at_ms is not None else now_ms,
                    claimed_by=None,
                    claimed_until_ms=None,
                    last_status_code=status_code,
                    last_latency_ms=latency_ms,
                    last_error=error[:200] if error else None,
                    updated_at_ms=now_ms,
                    completed_at_ms=None if status == "pending" else now_ms,
                )
                .returning(*webhook_deliveries.c)
            )
            return _delivery(result.first())

    async def delivery(self, delivery_id: str) -> DeliveryRow | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(webhook_deliveries).where(webhook_deliveries.c.delivery_id == delivery_id)
                )
            ).first()
        return _delivery(row)

    async def deliveries_page(
        self, webhook_id: str, *, since_ms: int, after: tuple[int, str] | None, limit: int
    ) -> list[DeliveryRow]:
        """Newest first, by (created_at_ms, delivery_id) descending, starting after `after`."""
        c = webhook_deliveries.c
        query = select(webhook_deliveries).where(c.webhook_id == webhook_id, c.created_at_ms >= since_ms)
        if after is not None:
            created, delivery_id = after
            query = query.where(
                or_(c.created_at_ms < created, and_(c.created_at_ms == created, c.delivery_id < delivery_id))
            )
        query = query.order_by(c.created_at_ms.desc(), c.delivery_id.desc()).limit(limit)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [DeliveryRow(**row._mapping) for row in rows]

    async def purge(self, older_than_ms: int) -> int:
        """Drop finished deliveries created before `older_than_ms` (the 30-day log)."""
        c = webhook_deliveries.c
        async with begin_write(self.engine) as conn:
            result = await conn.execute(
                delete(webhook_deliveries).where(c.created_at_ms < older_than_ms, c.status != "pending")
            )
        return int(result.rowcount or 0)

    async def backlog(self, now_ms: int) -> tuple[int, int | None]:
        """Deliveries due now and not delivered (pending, next attempt in the past), and the due time of the
        oldest of them (metrics: the webhook backlog)."""
        c = webhook_deliveries.c
        query = select(func.count(), func.min(c.next_attempt_at_ms)).where(
            c.status == "pending", c.next_attempt_at_ms <= now_ms
        )
        count, oldest = await run_read(self.engine, lambda conn: tuple(conn.execute(query).one()))
        return int(count or 0), int(oldest) if oldest is not None else None
