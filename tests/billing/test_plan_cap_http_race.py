"""The plan-cap race through HTTP against a real server (uvicorn on a socket, a real localnet): a plan with
CAP RU left and RACERS concurrent POST /v1/relay from RACERS senders of one account (the account and the
senders it names on chain). Exactly CAP RU are reserved, every other relay answers QUOTA_EXHAUSTED
(PLAN_CAP), and after execution `account_period_usage` and the ledger agree: nothing overspent.
Runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from billing_paths_kit import addr, user_call
from relay_kit import RelayEnv, ServedApi, key_in_shard, relay_settings, unthrottled_limits
from relay_kit import Sender as RelaySender
from sqlalchemy import select

from gasless.db import account_period_usage, reservations, usage_ledger
from gasless.db.engine import create_engine
from gasless.hosting.app import create_app
from gasless.limits.buckets import Rate

CAP = 10
RACERS = 24
TIER = 40
MONTH_MS = 2_592_000_000


class _Client(requests.Session):
    """A requests session bound to the served API (the relay kit's `RelayEnv` drives it like a TestClient)."""

    def __init__(self, base_url: str) -> None:
        super().__init__()
        self.base_url = base_url

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs.setdefault("timeout", 60)
        return super().request(method, f"{self.base_url}{url!s}", *args, **kwargs)


@pytest.fixture
def served_env(tmp_path: Path, unpaused_localnet: Any, database_url: str) -> Any:
    settings = relay_settings(tmp_path, unpaused_localnet, database_url=database_url)
    limits = dataclasses.replace(unthrottled_limits(), assign_ip=Rate(1_000_000, 1_000_000))
    server = ServedApi(create_app(settings, route_limits=limits)).start()
    client = _Client(server.url)
    try:
        yield RelayEnv(client, unpaused_localnet, settings, unpaused_localnet.net.info["contract"])  # type: ignore[arg-type]
    finally:
        client.close()
        server.stop()


async def _read(url: str) -> tuple[list[Any], list[Any], list[Any]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            usage = list((await conn.execute(select(account_period_usage))).all())
            held = list((await conn.execute(select(reservations))).all())
            rows = list((await conn.execute(select(usage_ledger))).all())
        return usage, held, rows
    finally:
        await engine.dispose()


def _race(url: str, bodies: list[dict[str, Any]]) -> list[Any]:
    """Every relay at once: one thread (and connection) per body, released together by a barrier."""
    barrier = threading.Barrier(len(bodies))

    def post(body: dict[str, Any]) -> Any:
        barrier.wait()
        return requests.post(f"{url}/v1/relay", json=body, timeout=60)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


def test_concurrent_relays_never_overspend_the_plan(served_env: Any) -> None:
    env = served_env
    env.owner("setTier", [TIER, b"T40", "Human", 3, 1_000_000, CAP, MONTH_MS, True, False])
    env.owner("setSenderFeeRu", [0])
    account = RelaySender(key_in_shard(1))
    env.owner("grant", [addr(account), TIER, 1])
    senders = [RelaySender(key_in_shard(1)) for _ in range(RACERS - 1)]
    user_call(env, account, "addSenders", [0, [addr(s) for s in senders]])
    senders.append(account)
    bodies = []
    for sender in senders:  # one transfer each (1 RU), signed before the race
        assignment = env.assign(sender)
        tx = env.build(sender, assignment)
        bodies.append({"tx": tx.to_dictionary(), "lease": assignment["lease"]})

    answers = _race(env.client.base_url, bodies)
    accepted = [a for a in answers if a.status_code in (200, 202)]
    refused = [a for a in answers if a.status_code not in (200, 202)]
    assert len(accepted) == CAP, [a.text for a in answers]
    for answer in refused:
        body = answer.json()
        assert answer.status_code == 429 and body["code"] == "QUOTA_EXHAUSTED", answer.text
        assert body["details"]["reason"] == "PLAN_CAP" and body["details"]["account"] == account.address
        assert body["details"]["includedRu"] == CAP and "Retry-After" not in answer.headers
    for answer in accepted:
        billing = answer.json()["billing"]
        assert (
            billing["account"] == account.address and billing["billingClass"] == "plan" and billing["ru"] == 1
        )

    hashes = {a.json()["txHash"] for a in accepted}
    for tx_hash in hashes:
        env.wait_state(tx_hash, ("EXECUTED", "FINALIZED"))
    deadline = time.monotonic() + 15
    while True:
        usage, held, rows = asyncio.run(_read(env.settings.effective_database_url))
        if len(rows) == CAP or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    (period,) = usage
    assert period.account == account.address and period.ru_used == CAP
    assert len(held) == CAP and {r.state for r in held} == {"settled"} and sum(r.ru for r in held) == CAP
    assert {r.tx_hash for r in rows} == hashes
    assert all(r.billed and r.account == account.address for r in rows) and sum(r.ru for r in rows) == CAP
