"""SQL of the notice log, its acknowledgements and the sources' cursors.

Appending takes a transaction-scoped advisory lock on PostgreSQL so notices commit in `seq` order: a reader
that saw seq N never later finds a new notice below N (what `sinceSeq` and each host's stream tail rely on).
SQLite has one writer, which gives the same order. `dedupe_key` is unique: the same notice appended twice
(a retried source, the other host, a restart) is stored once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select, text, union, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db import begin_write, dialect_insert
from gasless.db.engine import run_read, run_read_off_loop
from gasless.db.notice_tables import notice_acks, notices
from gasless.db.tables import (
    account_period_usage,
    api_keys,
    incident_updates,
    incidents,
    intents,
    mirror_accounts,
    mirror_purchases,
    reservations,
    service_meta,
    usage_ledger,
    webhook_deliveries,
    webhooks,
)

APPEND_LOCK = 0x6E6F7469  # "noti": the advisory lock that orders notice commits on PostgreSQL


@dataclass(frozen=True)
class NewNotice:
    account: str | None  # None: a global notice
    kind: str
    severity: str
    title: str
    body: str
    data: dict[str, Any]
    dedupe_key: str


@dataclass(frozen=True)
class NoticeRow:
    seq: int
    account: str | None
    kind: str
    severity: str
    title: str
    body: str
    data: dict[str, Any]
    dedupe_key: str
    created_at_ms: int
    dispatched_at_ms: int | None


def _row(row: Any) -> NoticeRow:
    return NoticeRow(**row._mapping)


def _visible_to(account: str) -> Any:
    return or_(notices.c.account == account, notices.c.account.is_(None))


class NoticeRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def append(self, new: Sequence[NewNotice], now_ms: int) -> list[NoticeRow]:
        """Store the notices not stored yet (by dedupe key), in order; returns the ones this call stored."""
        if not new:
            return []
        stored: list[NoticeRow] = []
        async with begin_write(self.engine) as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": APPEND_LOCK})
            insert = dialect_insert(conn)
            for notice in new:
                result = await conn.execute(
                    insert(notices)
                    .values(
                        account=notice.account,
                        kind=notice.kind,
                        severity=notice.severity,
                        title=notice.title[:200],
                        body=notice.body,
                        data=notice.data,
                        dedupe_key=notice.dedupe_key[:200],
                        created_at_ms=now_ms,
                        dispatched_at_ms=None,
                    )
                    .on_conflict_do_nothing(index_elements=["dedupe_key"])
                    .returning(*notices.c)
                )
                row = result.first()
                if row is not None:
                    stored.append(_row(row))
        return stored

    async def exists(self, dedupe_keys: Sequence[str]) -> set[str]:
        if not dedupe_keys:
            return set()
        async with self.engine.connect() as conn:
            found = await conn.execute(
                select(notices.c.dedupe_key).where(notices.c.dedupe_key.in_(list(dedupe_keys)))
            )
            return set(found.scalars())

    # Reading --------------------------------------------------------------------------------------------
    async def page(
        self, account: str, *, since_seq: int, after_acked: int | None, before_seq: int | None, limit: int
    ) -> list[NoticeRow]:
        """The account's merged log, newest first: seq > since_seq (and > after_acked when given), below
        before_seq (the cursor)."""
        query = select(notices).where(_visible_to(account), notices.c.seq > since_seq)
        if after_acked is not None:
            query = query.where(notices.c.seq > after_acked)
        if before_seq is not None:
            query = query.where(notices.c.seq < before_seq)
        query = query.order_by(notices.c.seq.desc()).limit(limit)
        async with self.engine.connect() as conn:
            return [_row(row) for row in (await conn.execute(query)).all()]

    async def after(self, seq: int, limit: int) -> list[NoticeRow]:
        """Every notice above `seq`, oldest first (the stream tail of each host)."""
        query = select(notices).where(notices.c.seq > seq).order_by(notices.c.seq).limit(limit)
        return await self._polled(query)

    async def _polled(self, query: Any) -> list[NoticeRow]:
        # Every host's tail polls twice a second: a small indexed read, inline on the loop
        # (gasless.db.engine.run_read), a tenth of an aiosqlite read's CPU.
        return await run_read(self.engine, lambda conn: [_row(row) for row in conn.execute(query).all()])

    async def last_seq(self) -> int:
        async with self.engine.connect() as conn:
            return int((await conn.execute(select(func.coalesce(func.max(notices.c.seq), 0)))).scalar_one())

    # Acknowledgement ------------------------------------------------------------------------------------
    async def acked(self, account: str) -> int:
        async with self.engine.connect() as conn:
            value = (
                await conn.execute(select(notice_acks.c.acked_seq).where(notice_acks.c.account == account))
            ).scalar()
        return int(value or 0)

    async def ack(self, account: str, up_to: int, now_ms: int) -> int:
        """Raise the account's mark to `up_to`, capped at the newest notice it can see now (a mark beyond
        the log would acknowledge notices not written yet); never lowers it. Returns the mark."""
        async with begin_write(self.engine) as conn:
            newest = (
                await conn.execute(
                    select(func.coalesce(func.max(notices.c.seq), 0)).where(_visible_to(account))
                )
            ).scalar_one()
            mark = min(int(up_to), int(newest))
            insert = dialect_insert(conn)
            stmt = insert(notice_acks).values(account=account, acked_seq=mark, updated_at_ms=now_ms)
            greatest = func.max if conn.dialect.name == "sqlite" else func.greatest
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["account"],
                    set_={
                        "acked_seq": greatest(notice_acks.c.acked_seq, stmt.excluded.acked_seq),
                        "updated_at_ms": now_ms,
                    },
                )
            )
            value = (
                await conn.execute(select(notice_acks.c.acked_seq).where(notice_acks.c.account == account))
            ).scalar_one()
        return int(value)

    # The outbox -----------------------------------------------------------------------------------------
    async def undispatched(self, limit: int) -> list[NoticeRow]:
        query = (
            select(notices).where(notices.c.dispatched_at_ms.is_(None)).order_by(notices.c.seq).limit(limit)
        )
        return await self._polled(query)

    async def mark_dispatched(self, seqs: Sequence[int], now_ms: int) -> None:
        if not seqs:
            return
        async with begin_write(self.engine) as conn:
            await conn.execute(
                update(notices)
                .where(and_(notices.c.seq.in_(list(seqs)), notices.c.dispatched_at_ms.is_(None)))
                .values(dispatched_at_ms=now_ms)
            )

    # Cursors of the sources (service_meta rows `notices.<name>`) -----------------------------------------
    async def cursor(self, name: str) -> Any:
        query = select(service_meta.c.value).where(service_meta.c.key == f"notices.{name}")
        return await run_read(self.engine, lambda conn: conn.execute(query).scalar())

    async def save_cursor(self, name: str, value: Any, now_ms: int) -> None:
        async with begin_write(self.engine) as conn:
            insert = dialect_insert(conn)
            stmt = insert(service_meta).values(key=f"notices.{name}", value=value, updated_at_ms=now_ms)
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["key"], set_={"value": stmt.excluded.value, "updated_at_ms": now_ms}
                )
            )


class SourceReads:
    """What the notice sources read from the other domains' tables (read-only)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    # Every scan runs these each second on the leader: off the loop through the engine's own thread where
    # SQLite allows (gasless.db.engine.run_read_off_loop), a third of an aiosqlite read's CPU; a window's
    # aggregate under load must not stall the loop either.
    async def _all(self, query: Any) -> list[Any]:
        return await run_read_off_loop(self.engine, lambda conn: list(conn.execute(query).all()))

    async def _scalar(self, query: Any) -> Any:
        return await run_read_off_loop(self.engine, lambda conn: conn.execute(query).scalar_one())

    async def plan_usage_changed(self, since_ms: int) -> list[tuple[str, int, int]]:
        """(account, newest write, RU used) of the plan usage rows written since `since_ms`."""
        c = account_period_usage.c
        query = (
            select(c.account, func.max(c.updated_at_ms), func.sum(c.ru_used))
            .where(c.updated_at_ms >= since_ms)
            .group_by(c.account)
        )
        return [(str(a), int(t), int(n)) for a, t, n in await self._all(query)]

    async def payg_reserved(self, since_ms: int) -> list[tuple[str, int, int]]:
        """(account, newest, how many) of the pay-as-you-go reservations made since `since_ms`."""
        c = reservations.c
        query = (
            select(c.account, func.max(c.created_at_ms), func.count())
            .where(c.billing_class == "payg", c.created_at_ms >= since_ms)
            .group_by(c.account)
        )
        return [(str(a), int(t), int(n)) for a, t, n in await self._all(query)]

    async def payg_spent(self, account: str, since_ms: int) -> int:
        c = reservations.c
        query = select(func.coalesce(func.sum(c.payg_micro), 0)).where(
            c.account == account,
            c.billing_class == "payg",
            c.state != "released",
            c.created_at_ms >= since_ms,
        )
        return int(await self._scalar(query))

    async def purchases_after(self, seq: int, limit: int) -> list[Any]:
        c = mirror_purchases.c
        query = select(mirror_purchases).where(c.seq > seq).order_by(c.seq).limit(limit)
        return await self._all(query)

    async def last_purchase_seq(self) -> int:
        return int(await self._scalar(select(func.coalesce(func.max(mirror_purchases.c.seq), 0))))

    async def accounts(self, after_nonce: int = -1) -> list[Any]:
        """The mirrored accounts with a running plan block (period-ending checks), or only those the mirror
        refreshed after hyperblock `after_nonce`."""
        c = mirror_accounts.c
        query = select(c.address, c.running, c.auto_renew, c.hyperblock_nonce).where(
            c.running.is_not(None), c.hyperblock_nonce > after_nonce
        )
        return await self._all(query)

    async def escrow_of(self, accounts: Sequence[str]) -> dict[str, Any]:
        if not accounts:
            return {}
        c = mirror_accounts.c
        query = select(c.address, c.escrow_micro, c.payg, c.hyperblock_nonce).where(
            c.address.in_(list(accounts))
        )
        return {row.address: row for row in await self._all(query)}

    async def incident_updates_since(self, since_ms: int) -> list[Any]:
        """Incident updates appended since `since_ms`, with their incident's shard and times, in order."""
        u, i = incident_updates.c, incidents.c
        query = (
            select(
                u.incident_id,
                u.seq,
                u.status,
                u.body,
                u.at_ms,
                i.title,
                i.impact,
                i.shard,
                i.source,
                i.created_at_ms,
                i.resolved_at_ms,
            )
            .join(incidents, i.id == u.incident_id)
            .where(u.at_ms >= since_ms)
            .order_by(u.at_ms, u.incident_id, u.seq)
        )
        return await self._all(query)

    async def accounts_with_relays(self, shard: int | None, from_ms: int, to_ms: int) -> set[str]:
        """Accounts that had relays (co-signed intents) in `shard` (any shard: None) between the two times:
        terminal ones from the usage ledger, in-flight ones from the intents. One statement, so one snapshot:
        a relay leaving flight writes its ledger row in the same transaction, and two statements could read
        the ledger before that commit and the intents after it, missing the account in both."""
        lc = usage_ledger.c
        ledger = select(lc.account.label("account")).where(
            lc.account.is_not(None), lc.cosigned_at_ms >= from_ms, lc.cosigned_at_ms <= to_ms
        )
        ic = intents.c
        flight_account = ic.billing["account"].as_string()
        flight = select(flight_account.label("account")).where(
            ic.state.in_(("COSIGNED", "BROADCAST")),
            ic.cosigned_at_ms >= from_ms,
            ic.cosigned_at_ms <= to_ms,
            flight_account.is_not(None),
        )
        if shard is not None:
            ledger = ledger.where(lc.sender_shard == shard)
            flight = flight.where(ic.sender_shard == shard)
        return {str(a) for (a,) in await self._all(union(ledger, flight))}

    async def key_changes(self, since_ms: int) -> list[Any]:
        """API keys created or revoked since `since_ms` (this database's environments)."""
        c = api_keys.c
        query = select(c.key_id, c.account, c.env, c.label, c.created_at_ms, c.revoked_at_ms).where(
            or_(c.created_at_ms >= since_ms, c.revoked_at_ms >= since_ms)
        )
        return await self._all(query)

    async def failed_deliveries(self, since_ms: int) -> list[Any]:
        """Webhook deliveries that failed for good since `since_ms`, with their webhook's URL."""
        d, w = webhook_deliveries.c, webhooks.c
        query = (
            select(
                d.webhook_id,
                d.account,
                d.event_type,
                d.attempts,
                d.last_status_code,
                d.last_error,
                d.completed_at_ms,
                w.url,
            )
            .join(webhooks, w.webhook_id == d.webhook_id)
            .where(d.status == "failed", d.completed_at_ms >= since_ms)
        )
        return await self._all(query)
