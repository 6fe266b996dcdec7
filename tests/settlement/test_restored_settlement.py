"""A restored database's settlement reconciled with what the contract holds (gasless.settlement.restored), on
SQLite and PostgreSQL, with the contract's `getSettlement` answered as the gateway would (ABI-encoded):

- a batch the contract holds whose root is the root of the oldest unsettled rows is matched exactly: the
  rows are marked in it (leaf order), the next batch the worker builds takes the next id;
- a batch it cannot match (rows the database does not know) is recorded without rows, and the rows of the
  snapshot's intents executed before it was settled are held out of every batch, while rows executed later
  and rows of later intents are settled; a root-only batch covers nothing and holds nothing;
- nothing is built while the restore is not reconciled, and a released hold lets the held rows settle.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.chain.abi import decode_args, encode_outputs, load_billing_abi
from gasless.db import begin_write, create_engine, intents, service_meta, settlement_batches, usage_ledger
from gasless.db.migrate import upgrade
from gasless.db.restore import RESTORE_KEY
from gasless.settlement.merkle import leaf_hash, merkle_root
from gasless.settlement.repository import SettlementHeld, SettlementRepository, leaf_row
from gasless.settlement.restored import SettlementReconciler

ADDRESS = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"
CONTRACT = "erd1qqqqqqqqqqqqqpgqhe8t5jewej70zupmh44jurgn29psua5l2jps3ntjj3"
T0 = 1_700_000_000_000


class FakeGateway:
    """`getSettlement` of the batches given; no transaction known."""

    def __init__(self, settlements: dict[int, dict[str, Any]]) -> None:
        self.settlements = settlements
        self.abi = load_billing_abi()

    async def vm_query(self, contract: str, function: str, args: list[bytes]) -> list[bytes]:
        assert (contract, function) == (CONTRACT, "getSettlement")
        (batch_id,) = decode_args(self.abi, "getSettlement", args)
        found = self.settlements.get(int(batch_id))
        value = None if found is None else SimpleNamespace(batch_id=int(batch_id), **found)
        return encode_outputs(self.abi, "getSettlement", [value])

    async def transaction(self, tx_hash: str) -> None:
        return None


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url)
    await upgrade(engine)
    try:
        yield engine
    finally:
        await engine.dispose()


async def add_rows(engine: AsyncEngine, first: int, count: int, *, executed_at: int) -> list[str]:
    """`count` executed intents (nonces from `first`) with billed plan usage rows, 1 RU each."""
    hashes = []
    async with begin_write(engine) as conn:
        for nonce in range(first, first + count):
            tx_hash = f"{nonce:064x}"
            pk = (
                await conn.execute(
                    insert(intents)
                    .values(
                        sender=ADDRESS, nonce=nonce, slot_seq=0, tx_hash=tx_hash, bytes_sha256=tx_hash,
                        state="FINALIZED", seq=1, sender_shard=1, receiver=ADDRESS, relayer=ADDRESS,
                        cross_shard=False, gas_limit=50_000, gas_price=1_000_000_000, value_atto=0,
                        lease_kind="std", billing={}, tx={}, host_id="a", cosigned_at_ms=executed_at,
                        executed_block_ts_ms=executed_at, send_attempts=0, updated_at_ms=executed_at,
                    )
                    .returning(intents.c.pk)
                )
            ).scalar_one()  # fmt: skip
            await conn.execute(
                insert(usage_ledger).values(
                    tx_hash=tx_hash, intent_pk=pk, account=ADDRESS, sender=ADDRESS, nonce=nonce,
                    receiver=ADDRESS, sender_shard=1, relayer=ADDRESS, status="success", billed=True,
                    billing_class="plan", ru=1, gas_limit=50_000, gas_price=1_000_000_000,
                    cosigned_at_ms=executed_at, executed_block_ts_ms=executed_at,
                    terminal_at_ms=executed_at + nonce, created_at_ms=executed_at,
                )
            )  # fmt: skip
            hashes.append(tx_hash)
    return hashes


async def root_of(engine: AsyncEngine, hashes: list[str], batch_id: int) -> str:
    async with engine.connect() as conn:
        rows = {
            r.tx_hash: r
            for r in (
                await conn.execute(select(usage_ledger).where(usage_ledger.c.tx_hash.in_(hashes)))
            ).all()
        }
    leaves = [leaf_hash(leaf_row(rows[h], batch_id, i).encode()) for i, h in enumerate(hashes)]
    return merkle_root(leaves).hex()


def on_chain(root: str, rows: int, settled_ms: int) -> dict[str, Any]:
    return {
        "usage_root": list(bytes.fromhex(root)),
        "row_count": rows,
        "total_ru": rows,
        "settled_ms": settled_ms,
    }


async def mark(engine: AsyncEngine, marker: dict[str, Any]) -> None:
    async with begin_write(engine) as conn:
        await conn.execute(
            insert(service_meta).values(key=RESTORE_KEY, value=marker, updated_at_ms=int(time.time() * 1000))
        )


async def set_marker(engine: AsyncEngine, marker: dict[str, Any]) -> None:
    async with begin_write(engine) as conn:
        await conn.execute(update(service_meta).where(service_meta.c.key == RESTORE_KEY).values(value=marker))


async def batch_of(engine: AsyncEngine) -> dict[str, int | None]:
    async with engine.connect() as conn:
        return {r.tx_hash: r.batch_id for r in (await conn.execute(select(usage_ledger))).all()}


async def test_matched_unmatched_and_held(engine: AsyncEngine) -> None:
    # The snapshot: rows a (executed at T0), b (T0 + 10 s) and c (T0 + 25 s), nothing batched; the marker.
    a = await add_rows(engine, 0, 3, executed_at=T0)
    b = await add_rows(engine, 3, 2, executed_at=T0 + 10_000)
    c = await add_rows(engine, 5, 1, executed_at=T0 + 25_000)
    marker = {"restoreId": "r-1", "state": "pending", "lastBatchAtBackup": 0, "maxIntentPkAtBackup": 6}
    await mark(engine, marker)
    repo = SettlementRepository(engine)
    with pytest.raises(SettlementHeld):
        await repo.build(100)
    # After the snapshot the old hosts settled: 1 = exactly the rows a; 2 = rows b and rows this database
    # does not know (settled at T0 + 20 s); 3 = root-only.
    chain = {
        1: on_chain(await root_of(engine, a, 1), 3, T0 + 5_000),
        2: on_chain("11" * 32, 7, T0 + 20_000),
        3: on_chain("00" * 32, 0, T0 + 30_000),
    }
    reconciler = SettlementReconciler(engine, FakeGateway(chain), CONTRACT)  # type: ignore[arg-type]
    section = await reconciler.run(marker, [])
    assert [b["batchId"] for b in section["onChain"]] == [1, 2, 3]
    assert (section["matched"], section["unmatched"], section["rowsMarkedSettled"]) == ([1, 3], [2], 3)
    assert section["hold"] == {"maxIntentPk": 6, "executedBeforeMs": T0 + 20_000, "batches": [2]}
    assert section["heldRowsAtReconciliation"] == 2
    batches = await batch_of(engine)
    assert [batches[h] for h in a] == [1, 1, 1] and [batches[h] for h in b] == [None, None]
    async with engine.connect() as conn:
        stored = {r.batch_id: r for r in (await conn.execute(select(settlement_batches))).all()}
    assert sorted(stored) == [1, 2, 3] and {r.state for r in stored.values()} == {"submitted"}
    assert stored[2].usage_root == "11" * 32 and stored[2].row_count == 7
    # Run again (a host starting beside it): the same result, nothing written twice.
    again = await reconciler.run(marker, [])
    assert (again["matched"], again["unmatched"], again["hold"]) == ([1, 3], [2], section["hold"])

    # Reconciled: rows b stay held; c (executed after batch 2 was settled) and a later relay (executed
    # before it, co-signed after the snapshot) are settled.
    await set_marker(engine, {**marker, "state": "reconciled", "settlement": section})
    later = await add_rows(engine, 6, 1, executed_at=T0 + 1_000)
    built = await repo.build(100)
    assert built.batch_id == 4 and built.row_count == 2
    batches = await batch_of(engine)
    assert batches[c[0]] == 4 and batches[later[0]] == 4
    assert [batches[h] for h in b] == [None, None]
    # Released: the held rows go into the next batch.
    section["hold"]["releasedAtMs"] = T0
    await set_marker(engine, {**marker, "state": "reconciled", "settlement": section})
    built = await repo.build(100)
    assert built.batch_id == 5 and built.row_count == 2
    assert [(await batch_of(engine))[h] for h in b] == [5, 5]
