"""Settlement batches over the usage ledger: building a batch, its state, and the proof of one row."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import and_, func, not_, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from gasless.chain.addresses import parse_address
from gasless.db.engine import begin_write, run_read
from gasless.db.restore import RESTORE_KEY
from gasless.db.tables import service_meta, settlement_batches, usage_ledger
from gasless.settlement.merkle import LeafRow, leaf_hash, merkle_path, merkle_root

_ZERO32 = bytes(32)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _pubkey(bech32: str | None) -> bytes:
    return bytes(parse_address(bech32).get_public_key()) if bech32 else _ZERO32


def leaf_row(row: Any, batch_id: int, leaf_index: int) -> LeafRow:
    """The leaf of one ledger row (a mapping or Row with usage_ledger's columns)."""
    m = row._mapping if hasattr(row, "_mapping") else row
    return LeafRow(
        batch_id=batch_id,
        leaf_index=leaf_index,
        tx_hash=bytes.fromhex(m["tx_hash"]),
        account=_pubkey(m["account"]),
        sender=_pubkey(m["sender"]),
        nonce=int(m["nonce"]),
        receiver=_pubkey(m["receiver"]),
        status=m["status"],
        billing_class=m["billing_class"],
        ru=int(m["ru"] or 0),
        payg_micro=int(m["payg_micro"] or 0),
        period_id=int(m["period_id"] or 0),
        executed_block_ts_ms=int(m["executed_block_ts_ms"] or 0),
        gas_limit=int(m["gas_limit"]),
        gas_price=int(m["gas_price"]),
        api_key_id=m["api_key_id"] or "",
    )


class SettlementHeld(RuntimeError):
    """A restored database whose settlement is not reconciled with the contract yet: nothing is built."""


def held(hold: dict[str, Any]) -> ColumnElement[bool]:
    """The usage rows a restore's settlement hold keeps out of every batch (gasless.settlement.restored): rows
    of the snapshot's intents that executed before the newest batch on chain the restore could not match."""
    return and_(
        usage_ledger.c.intent_pk <= int(hold["maxIntentPk"]),
        or_(
            usage_ledger.c.executed_block_ts_ms.is_(None),
            usage_ledger.c.executed_block_ts_ms < int(hold["executedBeforeMs"]),
        ),
    )


def active_hold(marker: dict[str, Any] | None) -> dict[str, Any] | None:
    """The settlement hold of a restore marker, unless released (None: no hold)."""
    hold = ((marker or {}).get("settlement") or {}).get("hold")
    return hold if isinstance(hold, dict) and not hold.get("releasedAtMs") else None


async def restore_marker(conn: AsyncConnection) -> dict[str, Any] | None:
    value = await conn.scalar(select(service_meta.c.value).where(service_meta.c.key == RESTORE_KEY))
    return dict(value) if isinstance(value, dict) else None


@dataclass(frozen=True)
class BuiltBatch:
    batch_id: int
    usage_root: bytes
    row_count: int
    total_ru: int
    charges: list[SimpleNamespace]  # UsageCharge(account, ru, payg_micro) per PAYG account


class SettlementRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def build(self, max_rows: int) -> BuiltBatch:
        """Take the billed, unsettled rows (oldest first) into a new batch: ids, leaf indexes, root."""
        now = _now_ms()
        async with begin_write(self.engine) as conn:
            marker = await restore_marker(conn)
            if marker is not None and marker.get("state") == "pending":
                raise SettlementHeld(
                    "the database is a restore not reconciled with the chain yet: start a host on it first"
                )
            unsettled = and_(usage_ledger.c.billed.is_(True), usage_ledger.c.batch_id.is_(None))
            hold = active_hold(marker)
            if hold is not None:
                unsettled = and_(unsettled, not_(held(hold)))
            last = await conn.scalar(select(func.max(settlement_batches.c.batch_id)))
            batch_id = int(last or 0) + 1
            rows = (
                await conn.execute(
                    select(usage_ledger)
                    .where(unsettled)
                    .order_by(usage_ledger.c.terminal_at_ms, usage_ledger.c.tx_hash)
                    .limit(max_rows)
                )
            ).all()
            leaves = [leaf_hash(leaf_row(r, batch_id, i).encode()) for i, r in enumerate(rows)]
            root = merkle_root(leaves)
            total_ru = sum(int(r.ru or 0) for r in rows)
            await conn.execute(
                settlement_batches.insert().values(
                    batch_id=batch_id,
                    usage_root=root.hex(),
                    row_count=len(rows),
                    total_ru=total_ru,
                    state="built",
                    created_at_ms=now,
                )
            )
            for index, row in enumerate(rows):
                result = await conn.execute(
                    update(usage_ledger)
                    .where(and_(usage_ledger.c.tx_hash == row.tx_hash, usage_ledger.c.batch_id.is_(None)))
                    .values(batch_id=batch_id, leaf_index=index)
                )
                if result.rowcount != 1:
                    raise RuntimeError(f"ledger row {row.tx_hash} changed while batch {batch_id} was built")
        return BuiltBatch(batch_id, root, len(rows), total_ru, self._charges(rows))

    @staticmethod
    def _charges(rows: list[Any]) -> list[SimpleNamespace]:
        per_account: dict[str, list[int]] = {}
        for row in rows:
            if row.billing_class == "payg" and row.account:
                entry = per_account.setdefault(row.account, [0, 0])
                entry[0] += int(row.ru or 0)
                entry[1] += int(row.payg_micro or 0)
        return [
            SimpleNamespace(account=parse_address(account), ru=ru, payg_micro=micro)
            for account, (ru, micro) in sorted(per_account.items())
        ]

    async def restore_pending(self) -> bool:
        """True while the database is a restore its first host has not reconciled with the chain yet."""
        async with self.engine.connect() as conn:
            marker = await restore_marker(conn)
        return marker is not None and marker.get("state") == "pending"

    async def batch(self, batch_id: int) -> dict[str, Any] | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(settlement_batches).where(settlement_batches.c.batch_id == batch_id)
                )
            ).first()
        return dict(row._mapping) if row is not None else None

    async def rebuild(self, batch_id: int) -> BuiltBatch:
        """A stored batch as it was built (to submit it again after a restart or a failed send)."""
        async with self.engine.connect() as conn:
            stored = (
                await conn.execute(
                    select(settlement_batches).where(settlement_batches.c.batch_id == batch_id)
                )
            ).one()
            rows = (
                await conn.execute(
                    select(usage_ledger)
                    .where(usage_ledger.c.batch_id == batch_id)
                    .order_by(usage_ledger.c.leaf_index)
                )
            ).all()
        return BuiltBatch(
            batch_id, bytes.fromhex(stored.usage_root), stored.row_count, stored.total_ru, self._charges(rows)
        )

    # The settlement worker reads these every tick (a second): small reads, inline on the loop
    # (gasless.db.engine.run_read), a tenth of an aiosqlite read's CPU.
    async def unfinished(self) -> list[dict[str, Any]]:
        query = (
            select(settlement_batches)
            .where(settlement_batches.c.state.in_(("built", "submitted")))
            .order_by(settlement_batches.c.batch_id)
        )
        return await run_read(self.engine, lambda conn: [dict(r._mapping) for r in conn.execute(query)])

    async def last(self) -> dict[str, Any] | None:
        query = select(settlement_batches).order_by(settlement_batches.c.batch_id.desc()).limit(1)
        row = await run_read(self.engine, lambda conn: conn.execute(query).first())
        return dict(row._mapping) if row is not None else None

    async def mark(self, batch_id: int, state: str, *, tx_hash: str | None = None) -> None:
        values: dict[str, Any] = {"state": state}
        if tx_hash is not None:
            values.update(tx_hash=tx_hash, submitted_at_ms=_now_ms())
        async with begin_write(self.engine) as conn:
            await conn.execute(
                update(settlement_batches)
                .where(
                    and_(settlement_batches.c.batch_id == batch_id, settlement_batches.c.state != "committed")
                )
                .values(**values)
            )

    async def ledger_row(self, tx_hash: str) -> Any | None:
        async with self.engine.connect() as conn:
            return (await conn.execute(select(usage_ledger).where(usage_ledger.c.tx_hash == tx_hash))).first()

    async def proof_parts(self, batch_id: int, leaf_index: int) -> tuple[list[Any], Any]:
        """(path, leaf row) for a row of a batch: every leaf of the batch is re-derived from the ledger."""
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(usage_ledger)
                    .where(usage_ledger.c.batch_id == batch_id)
                    .order_by(usage_ledger.c.leaf_index)
                )
            ).all()
        leaves = [leaf_hash(leaf_row(r, batch_id, i).encode()) for i, r in enumerate(rows)]
        return merkle_path(leaves, leaf_index), rows[leaf_index]
