"""SQL of the notification preferences and of the mail outbox.

Mails are claimed for one attempt at a time like webhook deliveries (`FOR UPDATE SKIP LOCKED` on
PostgreSQL, the single writer on SQLite); a claim is a lease, so a host that dies mid-send leaves a row
another host takes again once the lease runs out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db import begin_write, dialect_insert
from gasless.db.engine import run_read_off_loop
from gasless.db.notice_tables import mail_outbox, notification_prefs


@dataclass(frozen=True)
class PrefsRow:
    account: str
    thresholds: dict[str, Any]
    kinds: dict[str, bool]
    email_address: str | None
    email_status: str | None
    email_token_id: str | None
    email_token_expires_ms: int | None
    email_pending_since_ms: int | None
    email_verified_at_ms: int | None
    escrow_low: bool
    created_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True)
class MailRow:
    mail_id: str
    dedupe_key: str
    account: str
    to_address: str
    purpose: str
    subject: str
    body: str
    status: str
    attempts: int
    max_attempts: int
    next_attempt_at_ms: int
    claimed_by: str | None
    claimed_until_ms: int | None
    last_error: str | None
    created_at_ms: int
    sent_at_ms: int | None


class PrefsRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def get(self, account: str) -> PrefsRow | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(select(notification_prefs).where(notification_prefs.c.account == account))
            ).first()
        return None if row is None else PrefsRow(**row._mapping)

    async def many(self, accounts: Sequence[str]) -> dict[str, PrefsRow]:
        if not accounts:
            return {}
        query = select(notification_prefs).where(notification_prefs.c.account.in_(sorted(set(accounts))))
        rows = await run_read_off_loop(self.engine, lambda conn: conn.execute(query).all())
        return {row.account: PrefsRow(**row._mapping) for row in rows}

    async def with_thresholds(self) -> list[PrefsRow]:
        """Accounts that set an escrow or spending threshold (the only ones those sources look at)."""
        # Read by the notice scan every second: off the loop, and cheaper than through aiosqlite.
        query = select(notification_prefs)
        rows = await run_read_off_loop(self.engine, lambda conn: conn.execute(query).all())
        found = [PrefsRow(**row._mapping) for row in rows]
        return [
            p
            for p in found
            if p.thresholds.get("escrowBelowMicro") is not None
            or p.thresholds.get("paygSpentMicro") is not None
        ]

    async def verified(self) -> list[PrefsRow]:
        query = select(notification_prefs).where(notification_prefs.c.email_status == "verified")
        async with self.engine.connect() as conn:
            return [PrefsRow(**row._mapping) for row in (await conn.execute(query)).all()]

    async def put(self, account: str, values: dict[str, Any], mail: dict[str, Any] | None) -> PrefsRow:
        """Replace the account's preferences; queue `mail` (the verification link) in the same transaction."""
        async with begin_write(self.engine) as conn:
            insert = dialect_insert(conn)
            stmt = insert(notification_prefs).values(account=account, **values)
            changes = {k: v for k, v in values.items() if k != "created_at_ms"}
            row = (
                await conn.execute(
                    stmt.on_conflict_do_update(index_elements=["account"], set_=changes).returning(
                        *notification_prefs.c
                    )
                )
            ).one()
            if mail is not None:
                await conn.execute(
                    insert(mail_outbox).values(**mail).on_conflict_do_nothing(index_elements=["dedupe_key"])
                )
        return PrefsRow(**row._mapping)

    async def verify(self, account: str, token_id: str, address: str, now_ms: int) -> bool:
        """Open a verification link: true only for the link still open for that very address (single use:
        the first opening clears it, on any host)."""
        c = notification_prefs.c
        async with begin_write(self.engine) as conn:
            result = await conn.execute(
                update(notification_prefs)
                .where(
                    c.account == account,
                    c.email_token_id == token_id,
                    c.email_address == address,
                    c.email_status == "pending",
                )
                .values(
                    email_status="verified",
                    email_token_id=None,
                    email_token_expires_ms=None,
                    email_verified_at_ms=now_ms,
                    updated_at_ms=now_ms,
                )
            )
        return bool(result.rowcount)

    async def set_escrow_low(self, account: str, low: bool) -> None:
        async with begin_write(self.engine) as conn:
            await conn.execute(
                update(notification_prefs)
                .where(notification_prefs.c.account == account)
                .values(escrow_low=low)
            )


class MailOutbox:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def enqueue(self, rows: Sequence[dict[str, Any]]) -> int:
        """Queue mails; one already queued under its dedupe key is skipped. Returns how many were new."""
        if not rows:
            return 0
        async with begin_write(self.engine) as conn:
            insert = dialect_insert(conn)
            result = await conn.execute(
                insert(mail_outbox).values(list(rows)).on_conflict_do_nothing(index_elements=["dedupe_key"])
            )
        return int(result.rowcount or 0)

    async def claim_due(self, *, worker: str, now_ms: int, lease_ms: int, limit: int) -> list[MailRow]:
        c = mail_outbox.c
        claimable = (
            c.status == "pending",
            c.next_attempt_at_ms <= now_ms,
            or_(c.claimed_until_ms.is_(None), c.claimed_until_ms < now_ms),
        )
        async with begin_write(self.engine) as conn:
            due = select(c.mail_id).where(*claimable).order_by(c.next_attempt_at_ms).limit(limit)
            if conn.dialect.name == "postgresql":
                due = due.with_for_update(skip_locked=True)
            ids = list((await conn.execute(due)).scalars())
            if not ids:
                return []
            result = await conn.execute(
                update(mail_outbox)
                .where(c.mail_id.in_(ids), *claimable)
                .values(attempts=c.attempts + 1, claimed_by=worker, claimed_until_ms=now_ms + lease_ms)
                .returning(*mail_outbox.c)
            )
            return [MailRow(**row._mapping) for row in result.all()]

    async def finish(
        self,
        row: MailRow,
        *,
        worker: str,
        now_ms: int,
        status: str,
        next_attempt_at_ms: int,
        error: str | None,
    ) -> bool:
        """Record the attempt's outcome, only if this worker still holds that very attempt."""
        c = mail_outbox.c
        async with begin_write(self.engine) as conn:
            result = await conn.execute(
                update(mail_outbox)
                .where(
                    and_(
                        c.mail_id == row.mail_id,
                        c.attempts == row.attempts,
                        c.claimed_by == worker,
                        c.status == "pending",
                    )
                )
                .values(
                    status=status,
                    next_attempt_at_ms=next_attempt_at_ms,
                    claimed_by=None,
                    claimed_until_ms=None,
                    last_error=error[:200] if error else None,
                    sent_at_ms=now_ms if status == "sent" else None,
                )
            )
        return bool(result.rowcount)

    async def for_account(self, account: str) -> list[MailRow]:
        query = (
            select(mail_outbox).where(mail_outbox.c.account == account).order_by(mail_outbox.c.created_at_ms)
        )
        async with self.engine.connect() as conn:
            return [MailRow(**row._mapping) for row in (await conn.execute(query)).all()]
