"""Mirror tables: one transaction per applied step (events, refreshed views, the cursor), and the reads."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gasless.db.engine import begin_write, dialect_insert
from gasless.db.tables import (
    mirror_accounts,
    mirror_purchases,
    mirror_senders,
    mirror_settlements,
    mirror_views,
    service_meta,
    settlement_batches,
)
from gasless.mirror.events import ContractEvent, camel

CURSOR_KEY = "mirror.cursor"

# Event -> PurchaseKind (docs/mirror.md). `queuedBlockCredited` is folded into the purchase or grant row of
# the same transaction (it is the credit-back half of an upgrade).
PURCHASE_EVENTS = {
    "deposit": "deposit",
    "subscribed": "plan_purchase",
    "renewed": "renewal",
    "renewalSkipped": "renewal_skipped",
    "escrowMoved": "escrow_move",
    "paygSettled": "payg_settlement",
    "senderFee": "sender_fee",
    "granted": "grant",
}


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class MirrorStep:
    """What one step of the follower writes, atomically with its new cursor."""

    cursor: int  # the last hyperblock nonce this step covers
    cursor_hash: str | None = None
    events: list[ContractEvent] = field(default_factory=list)
    accounts: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # address -> view (None: gone)
    views: dict[str, Any] = field(default_factory=dict)  # name -> value


def _purchase_rows(events: Sequence[ContractEvent]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    credited: dict[tuple[str, str | None], int] = {}
    for event in events:
        if event.name == "queuedBlockCredited":
            key = (event.tx_hash, event.account)
            credited[key] = credited.get(key, 0) + int(event.fields["amount"])
            continue
        kind = PURCHASE_EVENTS.get(event.name)
        if kind is None or event.account is None:
            continue
        details = {camel(k): v for k, v in event.fields.items() if k != "account"}
        if event.name in ("subscribed", "granted"):
            back = credited.pop((event.tx_hash, event.account), 0)
            if back:
                details["queuedBlockCreditedMicro"] = back
        amount = event.fields.get("amount", event.fields.get("price"))
        rows.append(
            {
                "seq": event.seq,
                "account": event.account,
                "kind": kind,
                "event": event.name,
                "amount_micro": int(amount) if amount is not None else None,
                "tier_id": event.fields.get("tier_id"),
                "details": details,
                "tx_hash": event.tx_hash,
                "event_index": event.event_index,
                "hyperblock_nonce": event.hyperblock_nonce,
                "block_ts_ms": event.block_ts_ms,
            }
        )
    return rows


def account_row(view: dict[str, Any], hyperblock_nonce: int, now_ms: int) -> dict[str, Any]:
    return {
        "address": view["address"],
        "credits_micro": int(view["credits_micro"]),
        "escrow_micro": int(view["escrow_micro"]),
        "running": view.get("running"),
        "queued": view.get("queued"),
        "auto_renew": bool(view["auto_renew"]),
        "payg": view["payg"],
        "suspended": bool(view["suspended"]),
        "created_ms": int(view["created_ms"]),
        "sender_count": int(view["sender_count"]),
        "hyperblock_nonce": hyperblock_nonce,
        "updated_at_ms": now_ms,
    }


class MirrorRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    # Writes -----------------------------------------------------------------------------------------
    async def cursor(self) -> int | None:
        async with self.engine.connect() as conn:
            value = await conn.scalar(select(service_meta.c.value).where(service_meta.c.key == CURSOR_KEY))
        return int(value["hyperblockNonce"]) if value else None

    async def apply(self, step: MirrorStep) -> list[int]:
        """Write one step; returns the settlement batches it committed. The cursor only moves forward: a
        step at or below the stored cursor (another writer got there first) writes nothing."""
        now = _now_ms()
        committed: list[int] = []
        async with begin_write(self.engine) as conn:
            insert = dialect_insert(conn)
            if await self._cursor_value(conn) >= step.cursor:
                return []
            for event in step.events:
                await self._apply_event(conn, event)
                if event.name == "usageSettled":
                    committed.append(int(event.fields["batch_id"]))
            rows = _purchase_rows(step.events)
            if rows:
                await conn.execute(insert(mirror_purchases).on_conflict_do_nothing(), rows)
            for address, view in step.accounts.items():
                if view is None:
                    await conn.execute(delete(mirror_accounts).where(mirror_accounts.c.address == address))
                    continue
                row = account_row(view, step.cursor, now)
                stmt = insert(mirror_accounts).values(row)
                await conn.execute(
                    stmt.on_conflict_do_update(
                        index_elements=["address"],
                        set_={k: stmt.excluded[k] for k in row if k != "address"},
                    )
                )
            await self._save_views(conn, step.views, step.cursor, now)
            if committed:
                await conn.execute(
                    update(settlement_batches)
                    .where(settlement_batches.c.batch_id.in_(committed))
                    .values(state="committed", committed_at_ms=now)
                )
            cursor = {"hyperblockNonce": step.cursor, "hash": step.cursor_hash}
            stmt = insert(service_meta).values(key=CURSOR_KEY, value=cursor, updated_at_ms=now)
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["key"],
                    set_={"value": stmt.excluded.value, "updated_at_ms": stmt.excluded.updated_at_ms},
                )
            )
        return committed

    async def save_views(self, views: dict[str, Any]) -> None:
        """Contract-wide views read outside a step (start-up, the periodic re-read)."""
        if not views:
            return
        now = _now_ms()
        async with begin_write(self.engine) as conn:
            await self._save_views(conn, views, await self._cursor_value(conn), now)

    @staticmethod
    async def _cursor_value(conn: AsyncConnection) -> int:
        stored = await conn.scalar(select(service_meta.c.value).where(service_meta.c.key == CURSOR_KEY))
        return int(stored["hyperblockNonce"]) if stored else -1

    @staticmethod
    async def _save_views(conn: AsyncConnection, views: dict[str, Any], nonce: int, now: int) -> None:
        insert = dialect_insert(conn)
        for name, value in views.items():
            stmt = insert(mirror_views).values(
                name=name, value=value, hyperblock_nonce=max(nonce, 0), updated_at_ms=now
            )
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["name"],
                    set_={
                        "value": stmt.excluded.value,
                        "hyperblock_nonce": stmt.excluded.hyperblock_nonce,
                        "updated_at_ms": stmt.excluded.updated_at_ms,
                    },
                )
            )

    async def _apply_event(self, conn: AsyncConnection, event: ContractEvent) -> None:
        insert = dialect_insert(conn)
        if event.name == "senderAdded":
            row = {
                "sender": event.fields["sender"],
                "account": event.fields["account"],
                "seq": event.seq,
                "added_at_ms": event.block_ts_ms,
                "tx_hash": event.tx_hash,
            }
            stmt = insert(mirror_senders).values(row)
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["sender"], set_={k: stmt.excluded[k] for k in row if k != "sender"}
                )
            )
        elif event.name == "senderRemoved":
            await conn.execute(
                delete(mirror_senders).where(
                    mirror_senders.c.sender == event.fields["sender"],
                    mirror_senders.c.account == event.fields["account"],
                )
            )
        elif event.name == "usageSettled":
            await conn.execute(
                insert(mirror_settlements)
                .values(
                    batch_id=int(event.fields["batch_id"]),
                    usage_root=event.fields["usage_root"],
                    row_count=int(event.fields["row_count"]),
                    total_ru=int(event.fields["total_ru"]),
                    tx_hash=event.tx_hash,
                    hyperblock_nonce=event.hyperblock_nonce,
                    block_ts_ms=event.block_ts_ms,
                )
                .on_conflict_do_nothing()
            )

    # Reads ------------------------------------------------------------------------------------------
    async def account(self, address: str) -> dict[str, Any] | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(select(mirror_accounts).where(mirror_accounts.c.address == address))
            ).first()
        return dict(row._mapping) if row is not None else None

    async def accounts(self, addresses: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The mirrored accounts among `addresses`, in one query (address -> row)."""
        if not addresses:
            return {}
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(mirror_accounts).where(mirror_accounts.c.address.in_(list(addresses)))
                )
            ).all()
        return {row.address: dict(row._mapping) for row in rows}

    async def senders(self, account: str) -> list[str]:
        """The account's authorised senders, oldest authorisation first."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(mirror_senders.c.sender)
                .where(mirror_senders.c.account == account)
                .order_by(mirror_senders.c.seq)
            )
            return [r.sender for r in rows]

    async def account_of_sender(self, sender: str) -> str | None:
        async with self.engine.connect() as conn:
            return await conn.scalar(
                select(mirror_senders.c.account).where(mirror_senders.c.sender == sender)
            )

    async def view(self, name: str) -> Any | None:
        async with self.engine.connect() as conn:
            return await conn.scalar(select(mirror_views.c.value).where(mirror_views.c.name == name))

    async def purchases(
        self,
        account: str,
        *,
        kinds: Sequence[str] | None,
        from_ms: int | None,
        to_ms: int | None,
        before_seq: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Timeline rows, newest first; `before_seq` resumes after a page's last row."""
        conditions = [mirror_purchases.c.account == account]
        if kinds:
            conditions.append(mirror_purchases.c.kind.in_(list(kinds)))
        if from_ms is not None:
            conditions.append(mirror_purchases.c.block_ts_ms >= from_ms)
        if to_ms is not None:
            conditions.append(mirror_purchases.c.block_ts_ms <= to_ms)
        if before_seq is not None:
            conditions.append(mirror_purchases.c.seq < before_seq)
        query = select(mirror_purchases).where(and_(*conditions)).order_by(mirror_purchases.c.seq.desc())
        if limit is not None:
            query = query.limit(limit)
        async with self.engine.connect() as conn:
            return [dict(r._mapping) for r in await conn.execute(query)]

    async def event_of(self, tx_hash: str, event: str) -> dict[str, Any] | None:
        """The mirrored contract event `event` emitted by the transaction `tx_hash` (first one), if any."""
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(mirror_purchases)
                    .where(mirror_purchases.c.tx_hash == tx_hash, mirror_purchases.c.event == event)
                    .order_by(mirror_purchases.c.seq)
                    .limit(1)
                )
            ).first()
        return dict(row._mapping) if row is not None else None

    async def settlement(self, batch_id: int) -> dict[str, Any] | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(mirror_settlements).where(mirror_settlements.c.batch_id == batch_id)
                )
            ).first()
        return dict(row._mapping) if row is not None else None

    async def status(self) -> dict[str, Any]:
        async with self.engine.connect() as conn:
            cursor = await conn.scalar(select(service_meta.c.value).where(service_meta.c.key == CURSOR_KEY))
            accounts = await conn.scalar(select(func.count()).select_from(mirror_accounts))
            purchases = await conn.scalar(select(func.count()).select_from(mirror_purchases))
            last = (
                await conn.execute(
                    select(settlement_batches).order_by(settlement_batches.c.batch_id.desc()).limit(1)
                )
            ).first()
        return {
            "cursor": cursor,
            "accounts": int(accounts or 0),
            "purchases": int(purchases or 0),
            "lastBatch": dict(last._mapping) if last is not None else None,
        }
