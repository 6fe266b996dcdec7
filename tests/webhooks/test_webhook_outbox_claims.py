"""The outbox's claims on SQLite and PostgreSQL: two workers never hold the same attempt, an expired claim
is taken again as the next attempt, a late outcome of a lost attempt is not recorded, and an event queued
twice is one delivery. Plus the Idempotency-Key store shared by two hosts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gasless.core.crypto import PurposeKeys
from gasless.core.errors import ApiError
from gasless.db import create_engine, upgrade
from gasless.http.idempotency import IdempotencyStore, Stored
from gasless.webhooks.repository import WebhookRepository

KEYS = PurposeKeys(b"m" * 48, "test", "localnet")


def _delivery(n: int, *, event: str | None = None) -> dict[str, Any]:
    return {
        "delivery_id": f"whd_{n:020d}",
        "webhook_id": "wh_1",
        "account": "erd1x",
        "event_id": event or f"evt_{n}",
        "event_type": "intent.finalized",
        "payload": {"n": n},
        "status": "pending",
        "attempts": 0,
        "max_attempts": 3,
        "next_attempt_at_ms": 1_000,
        "claimed_by": None,
        "claimed_until_ms": None,
        "last_status_code": None,
        "last_latency_ms": None,
        "last_error": None,
        "created_at_ms": 1_000 + n,
        "updated_at_ms": 1_000,
        "completed_at_ms": None,
    }


async def _claims(database_url: str) -> None:
    await upgrade(database_url)
    engine = create_engine(database_url)
    repo = WebhookRepository(engine)
    try:
        assert await repo.enqueue([_delivery(n) for n in range(40)]) == 40
        assert await repo.enqueue([_delivery(99, event="evt_3")]) == 0  # same (webhook, event): skipped

        # Two hosts claim concurrently: disjoint sets covering everything due.
        a, b = await asyncio.gather(
            repo.claim_due(worker="a", now_ms=2_000, lease_ms=10_000, limit=25),
            repo.claim_due(worker="b", now_ms=2_000, lease_ms=100_000, limit=25),
        )
        ids_a, ids_b = {r.delivery_id for r in a}, {r.delivery_id for r in b}
        assert not ids_a & ids_b and len(ids_a | ids_b) == 40
        assert all(r.attempts == 1 for r in a + b)
        assert await repo.claim_due(worker="c", now_ms=3_000, lease_ms=10_000, limit=50) == []

        # Worker a dies; its claims expire and are taken again as attempt 2.
        again = await repo.claim_due(worker="c", now_ms=13_000, lease_ms=10_000, limit=50)
        assert {r.delivery_id for r in again} == ids_a and all(r.attempts == 2 for r in again)
        # The lost attempt 1's outcome arrives late: not recorded.
        lost = a[0]
        late = await repo.finish_attempt(
            lost,
            worker="a",
            now_ms=13_500,
            status="succeeded",
            next_attempt_at_ms=None,
            status_code=200,
            latency_ms=5,
            error=None,
        )
        assert late is None
        current = next(r for r in again if r.delivery_id == lost.delivery_id)
        done = await repo.finish_attempt(
            current,
            worker="c",
            now_ms=14_000,
            status="succeeded",
            next_attempt_at_ms=None,
            status_code=204,
            latency_ms=7,
            error=None,
        )
        assert done is not None and done.status == "succeeded" and done.last_status_code == 204
        assert done.claimed_by is None and done.completed_at_ms == 14_000
        # Retention: finished rows older than the cut-off go, pending ones stay.
        assert await repo.purge(older_than_ms=10**12) == 1
    finally:
        await engine.dispose()


def test_outbox_claims(database_url: str) -> None:
    asyncio.run(_claims(database_url))


async def _idempotency(database_url: str) -> None:
    await upgrade(database_url)
    engines = [create_engine(database_url), create_engine(database_url)]
    host_a, host_b = (IdempotencyStore(engine, KEYS) for engine in engines)
    try:
        assert await host_a.begin("erd1x", "createWebhook", "a" * 64, "d" * 64) is None
        with pytest.raises(ApiError) as busy:
            await host_b.begin("erd1x", "createWebhook", "a" * 64, "d" * 64)
        assert busy.value.code == "IDEMPOTENCY_IN_PROGRESS"
        with pytest.raises(ApiError) as reused:
            await host_b.begin("erd1x", "createWebhook", "a" * 64, "e" * 64)
        assert reused.value.code == "IDEMPOTENCY_KEY_REUSED"
        # Another scope or operation is another record.
        assert await host_b.begin("erd1y", "createWebhook", "a" * 64, "e" * 64) is None
        assert await host_b.begin("erd1x", "testWebhook", "a" * 64, "e" * 64) is None

        await host_a.complete("erd1x", "createWebhook", "a" * 64, Stored(201, {"secret": "whsec_s"}))
        replay = await host_b.begin("erd1x", "createWebhook", "a" * 64, "d" * 64)
        assert replay == Stored(201, {"secret": "whsec_s"}, None)

        # A released key (a 5xx) runs again; a first request whose host died is taken over after its lock.
        await host_b.release("erd1y", "createWebhook", "a" * 64)
        assert await host_a.begin("erd1y", "createWebhook", "a" * 64, "f" * 64) is None
        late = IdempotencyStore(engines[1], KEYS, clock=lambda: 10**13)
        assert await late.begin("erd1x", "testWebhook", "a" * 64, "e" * 64) is None  # lock expired
        # Expired records are purged and the key starts over.
        assert await host_a.purge(10**14) == 3
    finally:
        for engine in engines:
            await engine.dispose()


def test_idempotency_store_across_hosts(database_url: str) -> None:
    asyncio.run(_idempotency(database_url))
