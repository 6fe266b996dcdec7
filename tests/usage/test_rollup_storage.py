"""The latency rollups' storage on both engines: a batch merges into the histograms a previous batch stored
(the upsert's update), not only into new keys, and counts each ledger row once."""

from __future__ import annotations

import hashlib

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from gasless.db import create_engine, intents, usage_ledger
from gasless.db.migrate import upgrade
from gasless.usage.rollups import HOUR_MS, RollupRepository, decode

SENDER = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"
RELAYER = "erd1spyavw0956vq68xj8y4tenjpq2wd5a9p2c6j8gsz7ztyrnpxrruqzu66jx"
TERMINAL_MS = 1_700_000_000_000


async def _finalized_relay(engine: AsyncEngine, nonce: int, added_ms: int) -> None:
    """An intent and its ledger row as the tracker leaves them at finality, `added_ms` after receipt."""
    tx_hash = hashlib.sha256(f"rollup-{nonce}".encode()).hexdigest()
    received = TERMINAL_MS - 1_000
    async with engine.begin() as conn:
        pk = (
            await conn.execute(
                insert(intents).values(
                    sender=SENDER,
                    nonce=nonce,
                    slot_seq=0,
                    tx_hash=tx_hash,
                    bytes_sha256=hashlib.sha256(tx_hash.encode()).hexdigest(),
                    state="FINALIZED",
                    seq=1,
                    sender_shard=1,
                    receiver=SENDER,
                    relayer=RELAYER,
                    cross_shard=False,
                    gas_limit=50_000,
                    gas_price=1_000_000_000,
                    value_atto=0,
                    lease_kind="std",
                    billing={"account": SENDER},
                    tx={},
                    host_id="seed",
                    received_at_ms=received,
                    cosigned_at_ms=received + 2,
                    updated_at_ms=TERMINAL_MS,
                    send_attempts=0,
                )
            )
        ).inserted_primary_key[0]
        await conn.execute(
            insert(usage_ledger).values(
                tx_hash=tx_hash, intent_pk=pk, account=SENDER, sender=SENDER, nonce=nonce, receiver=SENDER,
                sender_shard=1, relayer=RELAYER, status="success", billed=False, gas_limit=50_000,
                gas_price=1_000_000_000, received_at_ms=received, cosigned_at_ms=received + 2,
                broadcast_at_ms=received + added_ms, executed_block_ts_ms=TERMINAL_MS - 400,
                finalized_at_ms=TERMINAL_MS, terminal_at_ms=TERMINAL_MS, created_at_ms=TERMINAL_MS,
            )
        )  # fmt: skip


async def test_a_batch_merges_into_the_stored_histograms(database_url: str) -> None:
    await upgrade(database_url)
    engine = create_engine(database_url)
    repo = RollupRepository(engine)
    try:
        await _finalized_relay(engine, 1, added_ms=10)
        assert await repo.roll_up(600, TERMINAL_MS) == 1
        await _finalized_relay(engine, 2, added_ms=200)
        await _finalized_relay(engine, 3, added_ms=3_000)
        assert await repo.roll_up(600, TERMINAL_MS) == 2
        assert await repo.roll_up(600, TERMINAL_MS) == 0  # each row counted once
        rows = await repo.read("all", granularity="h", from_ms=TERMINAL_MS - HOUR_MS, to_ms=TERMINAL_MS + 1)
    finally:
        await engine.dispose()
    added = {row.metric: row for row in rows}["added"]
    histogram = decode(added.histogram)
    assert added.count == histogram.get_total_count() == 3
    assert histogram.get_min_value() <= 10 and histogram.get_max_value() >= 2_990
