"""A restored database's settlement batches reconciled with the billing contract, before anything is settled.

The snapshot knows the batches up to its last one (the manifest's `settlement.lastBatch`, kept in the restore
marker as `lastBatchAtBackup`). The old hosts may have settled more after it: `settleUsage` batches the
contract holds and the restored database does not. Settling their rows again would charge them twice, and a
batch numbered as one of them would be refused. So the first start on a restored database
(gasless.relay.restored), before its settlement worker may build or submit anything:

1. reads the batches the contract holds after the snapshot's last one: `getSettlement(id)` for the next ids
   until one is absent, and the `usageSettled` events of the `settleUsage` transactions the hyperblocks since
   the recovery point list (a batch beyond a gap, one the old hosts sent that never landed);
2. matches each, in id order, against the restored database: the oldest unsettled billed rows, in the order
   the settlement worker takes them, whose Merkle root for that batch id is the root on chain. A match is
   exact (the root covers every leaf), and its rows are marked settled in that batch (`submitted` with the
   chain's transaction; the contract mirror commits it): their proofs are served as for any batch;
3. records each batch it could not match (it holds rows this database does not know, or billed differently:
   relays after the snapshot, intents in flight at the snapshot and finished by the old hosts) without rows,
   so the numbering goes on after it, and stops matching there (a root-only batch covers no row: it is
   recorded as matched, wherever it comes);
4. when a batch is unmatched, holds the rows it may cover: rows of the snapshot's intents (their `intent_pk`
   at most the snapshot's highest) that executed before the newest unmatched batch was settled on chain (a
   batch only holds rows executed before it was built, and it was built before its transaction executed).
   Those rows, present and future (an intent in flight at the snapshot gets its row when it finishes), are
   left out of every batch until an operator releases the hold (`gasless admin restore-hold --release`).
   Rows of relays co-signed after the restore executed later: they are settled as usual.

What was found goes into the restore marker's `settlement` member (`gasless admin restore-report`).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import structlog
from sqlalchemy import and_, func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.chain.abi import decode_outputs, encode_args, load_billing_abi
from gasless.chain.gateway import GatewayClient
from gasless.db.engine import begin_write, dialect_insert
from gasless.db.tables import intents, mirror_settlements, settlement_batches, usage_ledger
from gasless.mirror.events import decode_transaction_events
from gasless.settlement.merkle import leaf_hash, merkle_root
from gasless.settlement.repository import held, leaf_row

log = structlog.get_logger("gasless.settlement.restored")

SETTLE_PREFIX = b"settleUsage@"
MAX_PROBES = 100_000  # getSettlement reads after the snapshot's last batch, at most (a safety bound)


def _now_ms() -> int:
    return int(time.time() * 1000)


def is_settle_call(chain_tx: dict[str, Any], contract: str) -> bool:
    """A successful `settleUsage` call to the contract, as a hyperblock lists it (`data` in base64)."""
    if chain_tx.get("receiver") != contract or chain_tx.get("status") != "success":
        return False
    data = chain_tx.get("data")
    if not data:
        return False
    try:
        return base64.b64decode(str(data)).startswith(SETTLE_PREFIX)
    except ValueError:
        return False


class SettlementReconciler:
    """Steps 1-4 above, for one restore; `run` returns the marker's `settlement` member."""

    def __init__(self, engine: AsyncEngine, gateway: GatewayClient, contract: str) -> None:
        self.engine = engine
        self.gateway = gateway
        self.contract = contract
        self.abi = load_billing_abi()

    async def run(self, marker: dict[str, Any], settle_txs: list[str]) -> dict[str, Any]:
        last = marker.get("lastBatchAtBackup")
        if last is None:  # a backup older than the manifest's settlement member: the database's own
            async with self.engine.connect() as conn:
                last = await conn.scalar(select(func.max(settlement_batches.c.batch_id)))
        last = int(last or 0)
        max_pk = marker.get("maxIntentPkAtBackup")
        if max_pk is None:
            async with self.engine.connect() as conn:
                max_pk = await conn.scalar(select(func.max(intents.c.pk)))
        max_pk = int(max_pk or 0)
        on_chain = await self._on_chain(last, settle_txs)
        matched: list[dict[str, Any]] = []
        unmatched: list[dict[str, Any]] = []
        for batch_id in sorted(on_chain):
            batch = on_chain[batch_id]
            if int(batch["rowCount"]) == 0:
                rows: list[str] | None = []  # root-only: it covers no row
            else:
                rows = None if unmatched else await self._match(batch)
            if rows is None:
                await self._record(batch, [])
                unmatched.append(batch)
            else:
                marked = await self._record(batch, rows)
                matched.append({**batch, "rowsMarked": marked})
        hold: dict[str, Any] | None = None
        if unmatched:
            hold = {
                "maxIntentPk": max_pk,
                "executedBeforeMs": max(int(b["settledMs"]) for b in unmatched),
                "batches": [int(b["batchId"]) for b in unmatched],
            }
        section = {
            "lastBatchAtBackup": last,
            "onChain": [on_chain[b] for b in sorted(on_chain)],
            "matched": [int(b["batchId"]) for b in matched],
            "rowsMarkedSettled": sum(int(b["rowsMarked"]) for b in matched),
            "unmatched": [int(b["batchId"]) for b in unmatched],
            "hold": hold,
            "heldRowsAtReconciliation": await self._held_count(hold) if hold else 0,
        }
        if on_chain:
            log.warning(
                "restored database: settlement batches beyond the backup found on chain",
                last_batch_at_backup=last,
                on_chain=sorted(on_chain),
                matched=section["matched"],
                unmatched=section["unmatched"],
                held_rows=section["heldRowsAtReconciliation"],
                report="gasless admin restore-report",
            )
        return section

    # Step 1 ---------------------------------------------------------------------------------------
    async def _settlement(self, batch_id: int) -> dict[str, Any] | None:
        parts = await self.gateway.vm_query(
            self.contract, "getSettlement", encode_args(self.abi, "getSettlement", [batch_id])
        )
        value = decode_outputs(self.abi, "getSettlement", parts)[0]
        if value is None:
            return None
        return {
            "batchId": int(value.batch_id),
            "usageRoot": bytes(value.usage_root).hex(),
            "rowCount": int(value.row_count),
            "totalRu": int(value.total_ru),
            "settledMs": int(value.settled_ms),
            "txHash": None,
        }

    async def _on_chain(self, last: int, settle_txs: list[str]) -> dict[int, dict[str, Any]]:
        """The batches the contract holds after `last`: the next ids until one is absent, and the ids the
        hyperblocks' `usageSettled` events name (each read back from the contract, the authority)."""
        named: dict[int, str] = {}
        for tx_hash in dict.fromkeys(settle_txs):
            full = await self.gateway.transaction(tx_hash)
            if full is None:
                continue
            events = decode_transaction_events(
                full, self.contract, hyperblock_nonce=0, tx_position=0, block_ts_ms=0
            )
            for event in events:
                if event.name == "usageSettled":
                    named[int(event.fields["batch_id"])] = tx_hash
        found: dict[int, dict[str, Any]] = {}
        starts = sorted({last + 1} | {b for b in named if b > last})
        for start in starts:
            batch_id = start
            while batch_id not in found and batch_id - last <= MAX_PROBES:
                settlement = await self._settlement(batch_id)
                if settlement is None:
                    break
                found[batch_id] = {**settlement, "txHash": named.get(batch_id)}
                batch_id += 1
        return found

    # Step 2 ---------------------------------------------------------------------------------------
    async def _match(self, batch: dict[str, Any]) -> list[str] | None:
        """The rows of `batch` in leaf order when this database holds exactly them; else None."""
        batch_id, count = int(batch["batchId"]), int(batch["rowCount"])
        async with self.engine.connect() as conn:
            stored = (
                await conn.execute(
                    select(settlement_batches).where(settlement_batches.c.batch_id == batch_id)
                )
            ).first()
            if stored is not None:  # recorded already (an earlier attempt, another host starting)
                if stored.usage_root != batch["usageRoot"]:
                    return None
                marked = await conn.execute(
                    select(usage_ledger.c.tx_hash)
                    .where(usage_ledger.c.batch_id == batch_id)
                    .order_by(usage_ledger.c.leaf_index)
                )
                rows = list(marked.scalars())
                return rows if len(rows) == count else None
            candidates = (
                await conn.execute(
                    select(usage_ledger)
                    .where(and_(usage_ledger.c.billed.is_(True), usage_ledger.c.batch_id.is_(None)))
                    .order_by(usage_ledger.c.terminal_at_ms, usage_ledger.c.tx_hash)
                    .limit(count)
                )
            ).all()
        if len(candidates) != count:
            return None
        leaves = [leaf_hash(leaf_row(r, batch_id, i).encode()) for i, r in enumerate(candidates)]
        if merkle_root(leaves).hex() != batch["usageRoot"]:
            return None
        if sum(int(r.ru or 0) for r in candidates) != int(batch["totalRu"]):
            return None
        return [str(r.tx_hash) for r in candidates]

    # Step 3 ---------------------------------------------------------------------------------------
    async def _record(self, batch: dict[str, Any], rows: list[str]) -> int:
        """The batch, as the chain holds it, with its matched rows (none for an unmatched batch); the rows
        marked (0 when it was recorded already)."""
        batch_id, now = int(batch["batchId"]), _now_ms()
        async with begin_write(self.engine) as conn:
            mirrored = await conn.scalar(
                select(mirror_settlements.c.batch_id).where(mirror_settlements.c.batch_id == batch_id)
            )
            inserted = await conn.execute(
                dialect_insert(conn)(settlement_batches)
                .values(
                    batch_id=batch_id,
                    usage_root=batch["usageRoot"],
                    row_count=int(batch["rowCount"]),
                    total_ru=int(batch["totalRu"]),
                    # The contract holds it: the mirror commits it with its event, as for any batch.
                    state="committed" if mirrored is not None else "submitted",
                    tx_hash=batch.get("txHash"),
                    created_at_ms=now,
                    submitted_at_ms=int(batch["settledMs"]) or now,
                    committed_at_ms=now if mirrored is not None else None,
                )
                .on_conflict_do_nothing()
                .returning(settlement_batches.c.batch_id)
            )
            if inserted.first() is None:
                return 0
            for index, tx_hash in enumerate(rows):
                result = await conn.execute(
                    update(usage_ledger)
                    .where(and_(usage_ledger.c.tx_hash == tx_hash, usage_ledger.c.batch_id.is_(None)))
                    .values(batch_id=batch_id, leaf_index=index)
                )
                if result.rowcount != 1:
                    raise RuntimeError(f"ledger row {tx_hash} changed while batch {batch_id} was matched")
        return len(rows)

    # Step 4 ---------------------------------------------------------------------------------------
    async def _held_count(self, hold: dict[str, Any]) -> int:
        async with self.engine.connect() as conn:
            count = await conn.scalar(
                select(func.count())
                .select_from(usage_ledger)
                .where(usage_ledger.c.billed.is_(True), usage_ledger.c.batch_id.is_(None), held(hold))
            )
        return int(count or 0)
